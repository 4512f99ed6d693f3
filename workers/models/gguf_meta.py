"""The parts of a GGUF file's metadata that a Hugging Face tokenizer and config are made of.

Read with the ``gguf`` library (memory-mapped; no tensor data is loaded, no torch needed).
Key names follow the GGUF specification: ``general.*``, ``{arch}.*`` and ``tokenizer.ggml.*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4


@dataclass(frozen=True)
class GgufMetadata:
    architecture: str
    tokenizer_model: str
    pre_tokenizer: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    chat_template: str | None
    hparams: dict[str, Any]
    """``{arch}.*`` keys with the prefix removed (``context_length``, ``attention.head_count`` ...)."""
    tensor_names: frozenset[str]

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]


def _value(reader: GGUFReader, key: str) -> Any:
    """A field's value as plain Python (str, int, float, bool or list), or None when absent."""
    field = reader.fields.get(key)
    if field is None:
        return None
    kinds = field.types
    if kinds[0] == GGUFValueType.ARRAY:
        if kinds[-1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if kinds[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    scalar = field.parts[field.data[0]].tolist()[0]
    return bool(scalar) if kinds[0] == GGUFValueType.BOOL else scalar


def read_metadata(path: Path) -> GgufMetadata:
    reader = GGUFReader(path)
    arch = _value(reader, "general.architecture")
    prefix = f"{arch}."
    hparams = {key[len(prefix) :]: _value(reader, key) for key in reader.fields if key.startswith(prefix)}
    tokens = _value(reader, "tokenizer.ggml.tokens") or []
    return GgufMetadata(
        architecture=arch,
        tokenizer_model=_value(reader, "tokenizer.ggml.model"),
        pre_tokenizer=_value(reader, "tokenizer.ggml.pre") or "default",
        tokens=tokens,
        token_types=_value(reader, "tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens),
        merges=_value(reader, "tokenizer.ggml.merges") or [],
        bos_token_id=_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_value(reader, "tokenizer.ggml.eos_token_id"),
        unk_token_id=_value(reader, "tokenizer.ggml.unknown_token_id"),
        pad_token_id=_value(reader, "tokenizer.ggml.padding_token_id"),
        add_bos_token=bool(_value(reader, "tokenizer.ggml.add_bos_token")),
        add_eos_token=bool(_value(reader, "tokenizer.ggml.add_eos_token")),
        chat_template=_value(reader, "tokenizer.chat_template"),
        hparams=hparams,
        tensor_names=frozenset(t.name for t in reader.tensors),
    )
