"""The one place where errors become OpenAI-shaped HTTP responses:
``{"error": {"message", "type", "param", "code"}}`` with the error's status.

Both HTTP services (the frontend, app.main, and the standalone router, router.service) install
these handlers; the frontend's SSE streams end with :func:`error_payload` as their last event.
"""

from __future__ import annotations

import logging

import msgspec
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from core.errors import SluiceError

log = logging.getLogger(__name__)


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


_encode = msgspec.json.Encoder().encode


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    try:
        return _encode(ErrorBody(ErrorDetail(message=message, type=type_, param=param, code=code)))
    except UnicodeEncodeError:  # a lone surrogate from the request, echoed back: escaped, not a 500
        return _encode(ErrorBody(ErrorDetail(message=_escaped(message) or "", type=_escaped(type_) or "",
                                             param=_escaped(param), code=_escaped(code))))


def _escaped(text: str | None) -> str | None:
    return None if text is None else text.encode("utf-8", "backslashreplace").decode()


def error_payload(exc: SluiceError) -> bytes:
    return error_body(exc.message, exc.type, exc.param, exc.code)


def error_response(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message, type_, param, code), status_code=status, media_type="application/json",
                    headers=headers)


async def _sluice_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SluiceError)
    retry_after = getattr(exc, "retry_after_s", None)  # rate limits, overload
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return error_response(exc.status_code, exc.message, exc.type, exc.param, exc.code, headers)


def _loc_param(loc: tuple[object, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = tuple(first.get("loc", ()))
    msg = str(first.get("msg", "invalid request"))
    param = _loc_param(loc)
    if first.get("type") == "json_invalid":
        return error_response(400, "the request body is not valid JSON", "invalid_request_error", None, "invalid_json")
    if first.get("type") == "missing":
        msg = f"'{param}' is a required property"
    elif param:
        msg = f"{param}: {msg}"
    return error_response(400, msg, "invalid_request_error", param, None)


#: The ``code`` of the HTTP errors raised by the web stack itself (routing; app.body_limit's 413).
_HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def http_exception_response(exc: StarletteHTTPException) -> Response:
    """An HTTP exception as an OpenAI-shaped response, with its headers (a 405's ``Allow``)."""
    return error_response(exc.status_code, str(exc.detail), "invalid_request_error", None,
                          _HTTP_ERROR_CODES.get(exc.status_code), dict(exc.headers) if exc.headers else None)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return http_exception_response(exc)


#: What a client is told to wait before retrying while Redis (the request plane) is unreachable.
REDIS_RETRY_AFTER_S = 2


async def _redis_unavailable(request: Request, exc: Exception) -> Response:
    """Redis (queues, routing index, token streams) cannot be reached: the platform is briefly
    unavailable, not broken. 503 with Retry-After; nothing was admitted."""
    log.warning("redis unreachable on %s: %r", request.url.path, exc)
    return error_response(503, "the request plane (Redis) is unreachable; retry shortly", "service_unavailable",
                          None, "redis_unavailable", {"Retry-After": str(REDIS_RETRY_AFTER_S)})


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return error_response(500, "internal error", "internal_error", None, None)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(SluiceError, _sluice_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(redis.exceptions.ConnectionError, _redis_unavailable)  # TimeoutError too
    app.add_exception_handler(redis.exceptions.TimeoutError, _redis_unavailable)
    app.add_exception_handler(Exception, _unexpected)
