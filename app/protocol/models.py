"""``/v1/models`` shapes."""

from __future__ import annotations

import msgspec


class ModelCardOut(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "sluice"
    object: str = "model"
    max_model_len: int | None = None
    root: str | None = None
    #: A LoRA adapter's base model (None: a base model).
    parent: str | None = None
    #: Live workers per pool (``agg``, ``prefill``, ``decode``): Sluice's extension.
    pools: dict[str, int] | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCardOut]
    object: str = "list"
