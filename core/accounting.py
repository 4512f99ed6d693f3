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
    v: int = 1
