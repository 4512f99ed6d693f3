"""The frontend's line for a finished request (app.requests.observer.log_request)."""

from __future__ import annotations

import logging

import pytest

from app.requests.observer import log_request
from core.accounting import UsageRecord, usage_batch_from_builtins, usage_batch_to_builtins


def record(**fields: object) -> UsageRecord:
    base: dict[str, object] = {
        "request_id": "r1", "model": "m", "key_id": None, "pool": "decode", "worker_ids": ["p1", "d1"],
        "prompt_tokens": 2500, "cached_tokens": 0, "completion_tokens": 24, "queue_time_s": 0.01,
        "ttft_s": 0.25, "total_s": 1.5, "finish_reason": "length", "error_type": None, "created_at": 0.0}
    return UsageRecord(**{**base, **fields})  # type: ignore[arg-type]


def test_the_request_line_names_the_transferred_tokens(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="sluice.requests"):
        log_request(record(transferred_tokens=2500), user="u")
    [line] = [r for r in caplog.records if r.name == "sluice.requests"]
    assert line.getMessage() == ("request r1 model=m worker=p1,d1 status=length prompt_tokens=2500 cached_tokens=0 "
                                 "transferred_tokens=2500 completion_tokens=24 ttft_s=0.250 total_s=1.500")
    assert (line.cached_tokens, line.transferred_tokens) == (0, 2500)  # type: ignore[attr-defined]


def test_a_record_without_transferred_tokens_is_encoded_as_before() -> None:
    """The field is left out of a record's builtins when 0: an aggregated request's record is
    shipped to the bookkeeper as it was before the field existed."""
    plain, moved = record(), record(transferred_tokens=7)
    [builtins, moved_builtins] = usage_batch_to_builtins([plain, moved])
    assert "transferred_tokens" not in builtins and moved_builtins["transferred_tokens"] == 7
    assert usage_batch_from_builtins([builtins, moved_builtins]) == [plain, moved]
