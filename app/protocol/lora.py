"""``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` bodies: vLLM's fields, plus the base
``model`` (needed when the deployment serves several) and a ``worker_id`` to load on one worker."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from app.protocol.fields import NonEmptyText

AdapterName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: AdapterName
    #: The adapter's directory (PEFT's ``adapter_config.json`` and weights), as the workers see it.
    lora_path: NonEmptyText
    model: NonEmptyText | None = None
    worker_id: NonEmptyText | None = None


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: AdapterName
    lora_path: NonEmptyText | None = None
    worker_id: NonEmptyText | None = None
