"""How every Sluice process logs: one handler on the root logger, plain text or one JSON object per
line (``SLUICE_LOG_FORMAT=json``), each record carrying the request it is about (``request_id``, set
with :func:`request_context`) and passed through a filter that masks secrets.

Secrets never reach a line: an ``Authorization`` value, a Sluice API key (``sk-sluice-...``) and the
password of a URL (``scheme://user:password@host``) are masked in the message and in every field,
whatever logged them (our code, Celery, uvicorn, SQLAlchemy).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

LogFormat = Literal["text", "json"]

#: The request a record is about; set for the duration of a request's handling (asyncio tasks and
#: threads each see their own value).
request_id_var: ContextVar[str | None] = ContextVar("sluice_request_id", default=None)

#: What a record carries besides the standard LogRecord attributes (``extra=``), for the JSON lines.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "color_message", "req"}

_SECRET_PATTERNS = (
    # URL credentials: keep the user, mask the password.
    (re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^@\s/]+(?P<tail>@)"), r"\g<head>***\g<tail>"),
    # Authorization values and bearer tokens.
    (re.compile(r"(?i)(?P<head>\b(?:authorization|bearer)\b[\"']?\s*[:=]?\s*(?:bearer\s+)?)[^\s\"',}]+"),
     r"\g<head>***"),
    # Sluice API keys wherever they appear: the key's public id stays, its secret goes.
    (re.compile(r"(?P<head>sk-sluice-[0-9a-f]{12}-)[A-Za-z0-9_-]+"), r"\g<head>***"),
    (re.compile(r"sk-sluice-(?![0-9a-f]{12}-\*\*\*)[A-Za-z0-9_-]+"), "sk-sluice-***"),
)


def redact(text: str) -> str:
    """``text`` with every secret the patterns know masked."""
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


@contextlib.contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Records logged inside the block say they are about ``request_id``."""
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)


class ContextFilter(logging.Filter):
    """Adds ``request_id`` (or None) to every record and masks secrets in its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            data = getattr(record, "data", None)  # Celery's task lines carry the task: its id is the request's
            record.request_id = request_id_var.get() or (data.get("id") if isinstance(data, dict) else None)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logged as it stands
            message = str(record.msg)
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, ``request_id``, the
    record's ``extra`` fields, and ``exc`` when an exception is attached."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None), "process": record.process,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and key not in line:
                line[key] = redact(value) if isinstance(value, str) else value
        if record.exc_text:
            line["exc"] = record.exc_text
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time level logger [request id] message``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(req)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.req = f" [{request_id}]" if request_id else ""
        return super().format(record)


def configure_logging(fmt: LogFormat = "text", level: str | int = "INFO") -> None:
    """Route every logger of the process to one stderr handler in ``fmt``. Loggers that bring their
    own handlers (uvicorn's, Celery's) are emptied so that they propagate here instead."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per HTTP call made (readiness polls)
    logging.captureWarnings(True)  # warnings.warn (Celery's root warning, deprecations) as records
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "celery.task", "celery.worker",
                 "celery.app.trace", "celery.redirected", "flower", "kombu"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
