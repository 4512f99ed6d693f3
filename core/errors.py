"""Sluice's domain exceptions. Services raise these; one handler in the frontend maps them to
OpenAI-shaped error responses (``{"error": {"message", "type", "param", "code"}}``)."""

from __future__ import annotations


class SluiceError(Exception):
    status_code = 500
    type = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidRequest(SluiceError):
    status_code = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class Unauthorized(SluiceError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(SluiceError):
    status_code = 403
    type = "permission_error"
    code = "model_not_allowed"


class ModelNotFound(SluiceError):
    status_code = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RateLimited(SluiceError):
    status_code = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int, **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class NoWorkerAvailable(SluiceError):
    status_code = 503
    type = "service_unavailable"
    code = "no_worker_available"


class Overloaded(SluiceError):
    """Every worker that could serve the request has as many waiting as admission control allows."""

    status_code = 503
    type = "service_unavailable"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int, **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class UpstreamError(SluiceError):
    """The engine or worker failed while serving the request."""

    status_code = 502
    type = "server_error"
    code = "engine_error"


class StreamStalled(UpstreamError):
    code = "worker_stalled"
