"""Usage rows: the bookkeeper's batch insert and the summaries ``sluice usage`` and ``GET /v1/usage`` show."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Engine, case, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from core.accounting import UsageRecord
from core.db.models import UsageRow


def usage_row(record: UsageRecord) -> dict[str, object]:
    """The ``usage_records`` row of one record (``created_at`` from unix seconds to UTC)."""
    return {
        "request_id": record.request_id, "key_id": record.key_id, "model": record.model, "pool": record.pool,
        "worker_ids": list(record.worker_ids), "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens, "completion_tokens": record.completion_tokens,
        "queue_time_s": record.queue_time_s, "ttft_s": record.ttft_s, "total_s": record.total_s,
        "finish_reason": record.finish_reason, "error_type": record.error_type,
        "created_at": datetime.fromtimestamp(record.created_at, UTC),
    }


def insert_usage(engine: Engine, records: Sequence[UsageRecord]) -> int:
    """Insert ``records`` in one transaction; returns how many rows were new.

    Idempotent: a record whose ``request_id`` is already stored is skipped, so a batch delivered
    twice (after a worker died mid-task) is counted once.
    """
    if not records:
        return 0
    dialect = {"postgresql": postgresql, "sqlite": sqlite}.get(engine.dialect.name)
    if dialect is None:
        raise NotImplementedError(f"usage rows on {engine.dialect.name!r}: only SQLite and PostgreSQL")
    rows = [usage_row(r) for r in records]
    statement = (dialect.insert(UsageRow).on_conflict_do_nothing(index_elements=["request_id"])
                 .returning(UsageRow.id))
    with engine.begin() as connection:
        return len(connection.execute(statement, rows).all())


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """One (key, model) line of a usage summary. Means are over the requests that have the value."""

    key_id: str | None
    model: str
    requests: int
    errors: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    mean_ttft_s: float | None
    mean_total_s: float | None


def summarize_usage(engine: Engine, *, since: datetime, key_ids: Sequence[str | None] | None = None) -> list[UsageTotals]:
    """Totals per (key, model) of the requests that arrived at or after ``since``.

    ``key_ids=None`` covers every key; a list restricts to those keys (``None`` in it stands for
    requests made without a key, with auth off).
    """
    row = UsageRow
    query = (
        select(row.key_id, row.model, func.count(), func.sum(case((row.error_type.is_not(None), 1), else_=0)),
               func.sum(row.prompt_tokens), func.sum(row.cached_tokens), func.sum(row.completion_tokens),
               func.avg(row.ttft_s), func.avg(row.total_s))
        .where(row.created_at >= since)
        .group_by(row.key_id, row.model)
        .order_by(row.key_id, row.model)
    )
    if key_ids is not None:
        named = [k for k in key_ids if k is not None]
        conditions = [row.key_id.in_(named)] if named else []
        if None in key_ids:
            conditions.append(row.key_id.is_(None))
        if not conditions:
            return []
        query = query.where(or_(*conditions))
    with engine.connect() as connection:
        return [
            UsageTotals(key_id=k, model=m, requests=int(n), errors=int(e or 0), prompt_tokens=int(p or 0),
                        cached_tokens=int(c or 0), completion_tokens=int(o or 0),
                        mean_ttft_s=float(t) if t is not None else None,
                        mean_total_s=float(s) if s is not None else None)
            for k, m, n, e, p, c, o, t, s in cast(Iterable[Any], connection.execute(query))
        ]
