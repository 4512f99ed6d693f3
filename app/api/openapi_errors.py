"""The error responses the API documents in its OpenAPI schema (``/openapi.json``): every error
has the OpenAI shape ``{"error": {"message", "type", "param", "code"}}`` (core.http_errors)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


_WHEN = {
    400: "The request is invalid (a field, a header, the prompt's length); `param` names what.",
    401: "No API key, or an unknown, revoked or expired one.",
    403: "The API key may not use this model.",
    404: "No such model or route.",
    413: "The request body is larger than `SLUICE_FRONTEND__MAX_BODY_BYTES`.",
    429: "A rate limit or quota of the API key is used up (`Retry-After`).",
    502: "The worker failed, stalled or was lost with no other to continue on.",
    503: "No live worker serves the model, every worker has its bound of waiting requests "
         "(`overloaded`), or Redis is unreachable (`Retry-After`).",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each status with the error body's schema."""
    return {status: {"model": ErrorResponse, "description": _WHEN[status]} for status in statuses}


#: What a generating endpoint can answer besides 200.
GENERATION_ERRORS = error_responses(400, 401, 403, 404, 413, 429, 502, 503)
