"""Time spans people type: ``--since 1d``, ``?since=30m``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SPAN_RE = re.compile(r"(\d+)\s*([smhdw])")


def parse_since(text: str, now: datetime) -> datetime:
    """The UTC instant ``text`` names: a span back from ``now`` (``90s``, ``30m``, ``2h``, ``1d``, ``1w``)
    or an ISO 8601 date or datetime (read as UTC when it names no zone). Raises ValueError."""
    text = text.strip()
    span = _SPAN_RE.fullmatch(text.lower())
    if span:
        try:
            return now - timedelta(seconds=int(span.group(1)) * _UNITS_S[span.group(2)])
        except OverflowError:
            raise ValueError(f"{text!r} reaches back before the year 1") from None
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a span (30m, 2h, 1d, 1w) nor an ISO 8601 date") from None
    return instant.replace(tzinfo=UTC) if instant.tzinfo is None else instant.astimezone(UTC)
