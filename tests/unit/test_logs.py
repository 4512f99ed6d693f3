"""Log lines (core.logs): JSON shape, the request id from the context, secrets masked."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from core.logs import ContextFilter, JsonFormatter, TextFormatter, redact, request_context

KEY = "sk-sluice-0123456789ab-" + "S" * 43


@pytest.mark.parametrize(("text", "secret"), [
    ("postgresql+asyncpg://sluice:hunter2@db:5432/sluice", "hunter2"),
    ("redis://:pa55word@redis:6379/0", "pa55word"),
    ("Authorization: Bearer abc.def-ghi", "abc.def-ghi"),
    ("headers={'authorization': 'Bearer tok3n'}", "tok3n"),
    (f"key {KEY} refused", "S" * 43),
    ("sk-sluice-garbled", "garbled"),
])
def test_secrets_are_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)


def test_a_key_keeps_its_public_id() -> None:
    assert redact(KEY) == "sk-sluice-0123456789ab-***"


def test_plain_text_is_left_alone() -> None:
    text = "request 42 model=smollm2 worker=w1 status=stop ttft_s=0.1 http://host:8000/v1"
    assert redact(text) == text


def _logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.addFilter(ContextFilter())
    logger = logging.getLogger(f"test.logs.{id(out)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def test_json_lines_carry_the_request_and_extra_fields_without_secrets() -> None:
    logger, out = _logger(JsonFormatter())
    with request_context("req-1"):
        logger.info("using %s", "redis://:pw1@r:6379", extra={"tokens": 3, "url": "http://u:pw2@h/"})
    logger.info("outside")
    first, second = (orjson.loads(line) for line in out.getvalue().splitlines())
    assert first["request_id"] == "req-1" and first["tokens"] == 3 and first["level"] == "info"
    assert "pw1" not in first["message"] and "pw2" not in first["url"]
    assert second["request_id"] is None and second["message"] == "outside"


def test_text_lines_name_the_request() -> None:
    logger, out = _logger(TextFormatter())
    with request_context("req-2"):
        logger.info("hello")
    assert "[req-2] hello" in out.getvalue()
