"""What ``/openapi.json`` says about errors: each route lists the statuses it can answer with
OpenAI's error body (core.http_errors.ErrorBody, its schema written by msgspec, so the document
and the encoder share one definition), and FastAPI's 422 validation response is gone: Sluice
answers validation errors 400 (core.http_errors)."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import FastAPI

from core.http_errors import ErrorBody

_REF_TEMPLATE = "#/components/schemas/{name}"

_DESCRIPTIONS = {
    400: "Invalid request: a malformed body or parameter (`param` names it), or a prompt beyond the model's "
         "context (`context_length_exceeded`)",
    401: "Missing or unknown API key (`invalid_api_key`)",
    403: "The key may not use this model (`model_not_allowed`), or the route needs an admin key",
    404: "Unknown model (`model_not_found`) or key (`key_not_found`)",
    413: "Request body over `SLUICE_FRONTEND__MAX_BODY_BYTES` (`request_too_large`)",
    429: "Over the key's rate limit (`rate_limit_exceeded`), every worker of the model at its admission "
         "limit (`overloaded`), or the request waited longer than `SLUICE_FRONTEND__MAX_QUEUE_WAIT_S` for a "
         "worker (`queue_timeout`)",
    502: "The worker failed while serving the request (`engine_error`, `worker_stalled`, `timeout`, "
         "`worker_lost`, `migration_limit`)",
    503: "No worker serves the model right now (`no_worker_available`), Redis is unreachable "
         "(`redis_unavailable`), or the frontend is shutting down (`frontend_shutting_down`)",
}
#: The statuses that always carry ``Retry-After`` (core.errors: SluiceError.retry_after_s).
_RETRY_AFTER = {status: {"Retry-After": {"description": description, "schema": {"type": "integer", "minimum": 1}}}
                for status, description in (
                    (429, "Seconds to wait before trying again: until the rate-limit window ends, or a "
                          "short back-off while the model's workers are busy"),
                    (503, "Seconds to wait before trying again"))}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route that can answer ``statuses`` with the error body."""
    content = {"application/json": {"schema": {"$ref": _REF_TEMPLATE.format(name=ErrorBody.__name__)}}}
    return {status: {"description": _DESCRIPTIONS[status], "content": content,
                     **({"headers": _RETRY_AFTER[status]} if status in _RETRY_AFTER else {})} for status in statuses}


#: ``/ready``'s answers (its own body, not the error body): 503 until every served model has a worker.
READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Every served model has a live worker",
          "content": {"application/json": {"schema": {"type": "object"}}}},
    503: {"description": "Not ready: a model without a live worker, Redis unreachable, or shutting down "
                         "(`reason` says which)",
          "headers": _RETRY_AFTER[503], "content": {"application/json": {"schema": {"type": "object"}}}},
}
#: A generation answers JSON, or with ``"stream": true`` server-sent events (FastAPI adds the JSON).
STREAM_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "The completion, or with `stream: true` its chunks as server-sent events ending with "
                         "`data: [DONE]`", "content": {"text/event-stream": {"schema": {
              "type": "object", "description": "One event: `data` is a JSON chunk, an error body, or `[DONE]`",
              "properties": {"data": {"type": "string"}}, "required": ["data"]}}}},
}
#: ``/metrics`` answers Prometheus' text format.
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Prometheus text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}},
}


def with_error_schemas(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's document) with the error body's components and without the 422s."""
    _, components = msgspec.json.schema_components([ErrorBody], ref_template=_REF_TEMPLATE)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(components)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return schema


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (which serves ``/openapi.json``) return :func:`with_error_schemas`
    of FastAPI's document, built once."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_error_schemas(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its schema
