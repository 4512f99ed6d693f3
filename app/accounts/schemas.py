"""What the key-management and usage endpoints (and ``sluice keys``) take and return.

Model names in a key's allow-list are checked for their shape only: which models are served is
known only at run time (workers register them), so a key may name a model that is not served yet;
a request for it is answered 404 ``model_not_found`` like any unknown model.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from core.db.models import MODEL_NAME_MAX, NAME_MAX
from core.db.usage import UsageTotals

MODEL_NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:/@+-]{{0,{MODEL_NAME_MAX - 1}}}")
KEY_NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9 _.@+/:-]{{0,{NAME_MAX - 1}}}")


class KeyCreate(BaseModel):
    """A new key's settings. ``models`` None allows every model; limits are per minute."""

    model_config = ConfigDict(extra="forbid")

    name: str
    models: list[str] | None = None
    # At most 2**31 - 1: the columns are 32-bit INTEGERs.
    rpm: PositiveInt | None = Field(None, le=2**31 - 1, description="requests per minute")
    tpm: PositiveInt | None = Field(None, le=2**31 - 1, description="prompt + completion tokens per minute")
    admin: bool = False

    @field_validator("name")
    @classmethod
    def _name_shape(cls, name: str) -> str:
        name = name.strip()
        if not KEY_NAME_RE.fullmatch(name):
            raise ValueError(f"{name!r} is not a valid key name: 1 to {NAME_MAX} characters, letters, digits, "
                             "spaces and _ . @ + / : -, starting with a letter or digit")
        return name

    @field_validator("models")
    @classmethod
    def _model_names(cls, models: list[str] | None) -> list[str] | None:
        if models is None:
            return None
        if not models:
            raise ValueError("an empty model list would allow nothing: leave it out to allow every model")
        for model in models:
            if not MODEL_NAME_RE.fullmatch(model):
                raise ValueError(f"{model!r} is not a valid model name: 1 to {MODEL_NAME_MAX} characters, letters, "
                                 "digits and . _ : / @ + -, starting with a letter or digit")
        return list(dict.fromkeys(models))


class KeyInfo(BaseModel):
    """A key as listings show it: never its secret."""

    object: Literal["api_key"] = "api_key"
    id: str
    name: str
    models: list[str] | None
    rpm: int | None
    tpm: int | None
    admin: bool
    created_at: datetime
    revoked_at: datetime | None


class KeyCreated(KeyInfo):
    """A new key, with the full key: the only time it is ever shown."""

    key: str


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyInfo]


class UsageReport(BaseModel):
    """``GET /v1/usage``: one line per model, the database summary's own rows."""

    object: Literal["usage"] = "usage"
    key_id: str | None
    since: datetime
    data: list[UsageTotals]
