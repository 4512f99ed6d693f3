"""The OpenAI error body (core.http_errors): always encodable, even when it echoes the request's
invalid text."""

from __future__ import annotations

import json

from core.http_errors import error_body


def test_the_error_body_has_the_four_fields() -> None:
    assert json.loads(error_body("bad", "invalid_request_error")) == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}}


def test_a_lone_surrogate_echoed_in_an_error_is_escaped() -> None:
    body = json.loads(error_body("unknown field 'a\ud800'", "invalid_request_error", "x.\udfff", "c"))
    assert body == {"error": {"message": "unknown field 'a\\ud800'", "type": "invalid_request_error",
                              "param": "x.\\udfff", "code": "c"}}
