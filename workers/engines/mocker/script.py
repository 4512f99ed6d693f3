"""The mocker's scripted mode: outputs given as text, for end-to-end tests of what the frontend
does with a model's text (tool-call and reasoning parsers) without a model.

A script is a JSON file (``SLUICE_WORKER__MOCKER__SCRIPT``) holding a list of
``{"match": "...", "output": "..."}``. A request whose prompt, decoded with the model's tokenizer
(special tokens kept, so a chat template's markers can be matched too), contains ``match`` gets
``output`` in the model's tokens, then ends with ``stop``; the first entry that matches wins, and a
request that matches none gets the mocker's usual hash stream (workers.engines.mocker.tokens).
Sampling fields do not change a scripted output, except ``max_tokens`` (it still ends the
request with ``length``) and ``ignore_eos`` (the hash stream continues after the script).

An entry with ``"finish": "error"`` ends its request after ``output`` with the engine's ``error`` finish
(vLLM's ``FINISHED_ERROR``: a failed KV load, a grammar that rejects the model's token), whatever the
sampling fields say: what the worker and the frontend do with an engine that fails a request mid-way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec
from tokenizers import Tokenizer


class ScriptEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    match: str
    output: str
    finish: Literal["stop", "error"] = "stop"


@dataclass(frozen=True, slots=True)
class Scripted:
    """A request's scripted output and how it ends."""

    ids: tuple[int, ...]
    finish: Literal["stop", "error"] = "stop"


@dataclass(frozen=True, slots=True)
class MockerScript:
    entries: tuple[tuple[str, Scripted], ...]
    tokenizer: Tokenizer

    @classmethod
    def load(cls, script: Path, model_path: Path) -> MockerScript:
        """The script at ``script``, its outputs tokenized with the tokenizer in ``model_path``."""
        raw = msgspec.json.decode(script.read_bytes(), type=list[ScriptEntry])
        tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        return cls(tuple((e.match, Scripted(tuple(tokenizer.encode(e.output, add_special_tokens=False).ids), e.finish))
                         for e in raw), tokenizer)

    def output_for(self, prompt_ids: Sequence[int]) -> Scripted | None:
        """The scripted output of a prompt (None: no entry matches it)."""
        if not self.entries:
            return None
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        return next((scripted for match, scripted in self.entries if match in text), None)
