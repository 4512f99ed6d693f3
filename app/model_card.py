"""What the frontend knows of a served model: its tokenizer, chat template and limits.

Loaded from the model directory the workers register (``tokenizer.json``,
``tokenizer_config.json``, ``config.json``, ``generation_config.json``), so prompt token ids are
exactly the engine's; never from the frontend's own ``SLUICE_MODEL_PATH``. The context length is
the one the worker registers when given (an engine may serve less than the model's
``max_position_embeddings``, e.g. vLLM with ``max_model_len``), else the model config's. Rendering the chat template and tokenizing are pure and cheap for normal
prompts; callers move very long inputs off the event loop (tokenizing releases the GIL meanwhile)
and refuse text too long to fit before tokenizing it (:attr:`ModelCard.max_prompt_chars`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from app.prompts.chunked_tokens import ChunkedEncoder, chunkable
from core.errors import InvalidRequest

T = TypeVar("T")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    """Templates' ``tojson`` as Hugging Face renders it: plain JSON, not Jinja's HTML-escaped one."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@dataclass
class ModelCard:
    name: str
    path: Path
    tokenizer: Tokenizer
    context_length: int
    eos_token_ids: tuple[int, ...]
    bos_token: str | None
    eos_token: str | None
    chat_template: jinja2.Template | None
    created: int = 0
    special_ids: frozenset[int] = field(default_factory=frozenset)
    #: The longest vocabulary entry, in characters: no token stands for more characters of text.
    #: (Byte-level BPE writes a token one character per byte, and a character of text is at least
    #: one byte; SentencePiece writes a token in the characters it stands for. Added tokens count,
    #: matched literally. This holds for tokenizers whose normalizer does not delete text, as
    #: those of generative models do not.)
    max_token_chars: int = 1
    #: The sampling the model's ``generation_config.json`` recommends (``temperature``, ``top_p``, ...):
    #: what a request that leaves those fields out gets, as vLLM does (``--generation-config auto``).
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    #: The chat template's source: which tool-call and reasoning formats the model speaks is read
    #: from it (app.prompts.tools, app.output.chat).
    template_source: str = ""
    #: Long texts tokenized chunk by chunk, the chunks' ids remembered (None: the tokenizer fails the
    #: self-test; app.prompts.chunked_tokens).
    chunked: ChunkedEncoder | None = None
    #: The threads long inputs are rendered and tokenized on (see :meth:`off_loop`).
    _tokenizing: ThreadPoolExecutor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        threads = 1 if self.chunked is not None else os.cpu_count() or 1
        self._tokenizing = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` (rendering, tokenizing) off the event loop. With a chunked tokenizer, one
        at a time in arrival order: tokenizing releases the GIL and spreads a long text's chunks over
        every core (app.prompts.chunked_tokens), so a prompt tokenized alone is done soonest; several at once
        would share the cores and each be late, the first one included, which holds up its engine
        step and every step after it. A tokenizer that cannot be chunked uses one core per text, so
        there one thread per core."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizing, functools.partial(fn, *args, **kwargs))

    @classmethod
    def load(cls, name: str, path: Path, created: int = 0, context_length: int | None = None) -> ModelCard:
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        tok_cfg = _read_json(path / "tokenizer_config.json")
        cfg = _read_json(path / "config.json")
        gen_cfg = _read_json(path / "generation_config.json")
        eos = gen_cfg.get("eos_token_id", cfg.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        template_src = tok_cfg.get("chat_template")
        if isinstance(template_src, list):  # named templates: take the default one
            template_src = next((t["template"] for t in template_src if t.get("name") == "default"), None)
        template = None
        if template_src:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = _tojson
            template = env.from_string(template_src)
        context = context_length or int(cfg.get("max_position_embeddings") or tok_cfg.get("model_max_length") or 8192)
        special = frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
        return cls(name=name, path=path, tokenizer=tokenizer, context_length=context, eos_token_ids=eos_ids,
                   bos_token=_token_text(tok_cfg.get("bos_token")), eos_token=_token_text(tok_cfg.get("eos_token")),
                   chat_template=template, created=created, special_ids=special,
                   max_token_chars=max(map(len, tokenizer.get_vocab(with_added_tokens=True)), default=1),
                   sampling_defaults=sampling_defaults(gen_cfg), template_source=template_src or "",
                   chunked=ChunkedEncoder(tokenizer) if chunkable(tokenizer) else None)

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer knows, added tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def max_prompt_chars(self) -> int:
        """The most characters a prompt that fits can have: a prompt fits with at most
        ``context_length - 1`` tokens (one is left to generate), and a text of ``c`` characters has
        at least ``c / max_token_chars`` tokens. Longer text need not be tokenized to be refused."""
        return (self.context_length - 1) * self.max_token_chars

    @property
    def template_takes_tools(self) -> bool:
        """The chat template renders ``tools`` itself (else app.prompts.tools writes them into the messages)."""
        return "tools" in self.template_source

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> str:
        if self.chat_template is None:
            raise InvalidRequest(f"model {self.name!r} has no chat template; use /v1/completions", param="messages")
        extra = {"tools": tools} if tools else {}
        try:
            return self.chat_template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                             bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"the chat template rejected the messages: {exc}", param="messages") from exc

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """The token ids of ``text``. Through ``encode_batch_fast``, which gives the same ids as
        ``encode`` but releases the GIL while it works (``encode`` holds it throughout: a long
        text tokenized in a worker thread would stall the event loop just the same) and skips the
        offsets nobody reads. A long text goes chunk by chunk through :attr:`chunked`, which
        tokenizes only the chunks it has not seen."""
        if self.chunked is not None and len(text) > 2 * self.chunked.chunk_chars:
            return self.chunked.encode(text)
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def decode_stream(self) -> DecodeStream:
        return DecodeStream(skip_special_tokens=True)


#: The generation-config fields a request's sampling can take a default from.
SAMPLING_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(gen_cfg: dict[str, Any]) -> dict[str, float]:
    """The recommended sampling in a ``generation_config.json``: the fields Sluice applies, when
    numbers (``do_sample`` is not read, as vLLM does not)."""
    return {k: float(gen_cfg[k]) for k in SAMPLING_DEFAULT_FIELDS
            if isinstance(gen_cfg.get(k), int | float) and not isinstance(gen_cfg.get(k), bool)}


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}
