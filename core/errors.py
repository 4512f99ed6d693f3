"""Sluice's domain exceptions. Services raise these; one handler in the frontend maps them to
OpenAI-shaped error responses (``{"error": {"message", "type", "param", "code"}}``)."""

from __future__ import annotations


class SluiceError(Exception):
    status_code = 500
    type = "internal_error"
    code: str | None = None
    #: Seconds for the ``Retry-After`` header (every 429 and 503 carries one); None: no header.
    retry_after_s: int | None = None

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
    retry_after_s = 2  # about a worker's lease: a restarted worker is routable again by then


class Overloaded(SluiceError):
    """Every worker that could serve the request has as many waiting as admission control allows,
    or the request waited in the queue past its limit: 429, come back later."""

    status_code = 429
    type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int, code: str | None = None, **kw: str | None) -> None:
        super().__init__(message, code=code, **kw)
        self.retry_after_s = retry_after_s


#: The error kind of the delta that ends a frontend's open streams when its token subscription is lost
#: with Redis (app.requests.streams); the request answers :class:`RequestPlaneUnavailable`.
STREAM_INTERRUPTED = "stream_interrupted"


class RequestPlaneUnavailable(SluiceError):
    """Redis cannot be used right now: the frontend's token channel is being subscribed again after a
    lost connection (nothing was admitted), or that connection was lost under an open request (its
    worker is told to stop; the client may retry)."""

    status_code = 503
    type = "service_unavailable"
    code = "redis_unavailable"
    retry_after_s = 2


class ShuttingDown(SluiceError):
    """The frontend is shutting down (SIGTERM): it takes no new request, and ends the ones still
    open at its drain deadline."""

    status_code = 503
    type = "service_unavailable"
    code = "frontend_shutting_down"
    retry_after_s = 1


class UpstreamError(SluiceError):
    """The engine or worker failed while serving the request."""

    status_code = 502
    type = "server_error"
    code = "engine_error"


class StreamStalled(UpstreamError):
    code = "worker_stalled"
