"""The mocker's scripted mode: outputs given as text, for end-to-end tests of what the frontend
does with a model's text (tool-call and reasoning parsers) without a model.

A script is a JSON file (``SLUICE_WORKER__MOCKER__SCRIPT``) holding a list of
``{"match": "...", "output": "..."}``. A request whose prompt, decoded with the model's tokenizer
(special tokens kept, so a chat template's markers can be matched too), contains ``match`` gets
``output`` in the model's tokens, then ends with ``stop``; the first entry that matches wins, and a
request that matches none gets the mocker's usual hash stream (workers.engines.mocker.tokens).
Sampling fields do not change a scripted output, except ``max_tokens`` (it still ends the
request with ``length``) and ``ignore_eos`` (the hash stream continues after the script).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from tokenizers import Tokenizer


class ScriptEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    match: str
    output: str


@dataclass(frozen=True, slots=True)
class MockerScript:
    entries: tuple[tuple[str, tuple[int, ...]], ...]
    tokenizer: Tokenizer

    @classmethod
    def load(cls, script: Path, model_path: Path) -> MockerScript:
        """The script at ``script``, its outputs tokenized with the tokenizer in ``model_path``."""
        raw = msgspec.json.decode(script.read_bytes(), type=list[ScriptEntry])
        tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        return cls(tuple((e.match, tuple(tokenizer.encode(e.output, add_special_tokens=False).ids)) for e in raw),
                   tokenizer)

    def output_for(self, prompt_ids: Sequence[int]) -> tuple[int, ...] | None:
        """The scripted output of a prompt (None: no entry matches it)."""
        if not self.entries:
            return None
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        return next((ids for match, ids in self.entries if match in text), None)
