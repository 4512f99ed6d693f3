"""The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import msgspec


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail
