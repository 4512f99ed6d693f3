"""The usage record of one finished request (completed, cancelled or failed)."""

from __future__ import annotations

import msgspec


class UsageRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    request_id: str
    model: str
    key_id: str | None
    pool: str
    worker_ids: list[str]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_time_s: float | None
    ttft_s: float | None
    total_s: float
    finish_reason: str | None
    error_type: str | None
    created_at: float
    #: Prompt tokens whose KV the serving worker read from a prefill worker (disjoint from
    #: ``cached_tokens``). Logged and counted by the frontend; the usage table has no column for it.
    transferred_tokens: int = 0
    v: int = 1

#: The version of :class:`UsageRecord` this code writes and reads (the ``v`` field).
USAGE_RECORD_VERSION = 1


def usage_batch_to_builtins(records: list[UsageRecord]) -> list[dict[str, object]]:
    """A batch of records as JSON-ready builtins: the argument of the bookkeeper's task."""
    batch: list[dict[str, object]] = msgspec.to_builtins(records)
    return batch


def usage_batch_from_builtins(data: list[dict[str, object]]) -> list[UsageRecord]:
    """The inverse of :func:`usage_batch_to_builtins`; raises ValueError on a malformed batch or a
    record of a version this code does not know."""
    try:
        records = msgspec.convert(data, list[UsageRecord])
    except msgspec.ValidationError as exc:
        raise ValueError(f"malformed usage batch: {exc}") from exc
    unknown = {r.v for r in records} - {USAGE_RECORD_VERSION}
    if unknown:
        raise ValueError(f"usage records of unknown version(s) {sorted(unknown)}")
    return records
