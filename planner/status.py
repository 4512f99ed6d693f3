"""What ``sluice planner status`` and ``sluice status`` show of the planner: whether one acts, its last
decisions and the virtual connector's targets, read from Redis (:func:`planner_json`), and as a screen
(:func:`render_planner`)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import redis.asyncio as aioredis
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from core.keys import Keys
from planner.decision import Decision, decode_decision


async def last_decisions(redis: aioredis.Redis, keys: Keys, count: int = 1) -> list[Decision]:
    """The ``count`` newest decisions, newest first (an entry that does not decode is skipped)."""
    out = []
    for _id, fields in await redis.xrevrange(keys.planner_decisions, count=count) or []:
        raw = (fields or {}).get(b"d") or (fields or {}).get("d")
        if raw is None:
            continue
        try:
            out.append(decode_decision(raw))
        except (msgspec.DecodeError, TypeError):
            continue
    return out


async def planner_json(redis: aioredis.Redis, keys: Keys, count: int = 1) -> dict[str, Any]:
    """Whether a planner acts, its ``count`` last decisions and the virtual connector's targets."""
    leader = await redis.get(keys.planner_leader)
    targets = await redis.hgetall(keys.planner_targets)
    return {
        "acting": leader is not None,
        "decisions": [msgspec.to_builtins(d) for d in await last_decisions(redis, keys, count)],
        "targets": {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in targets.items()},
    }


def render_planner(data: dict[str, Any], now: float | None = None) -> RenderableType:
    """The last decision as a table (one row per pool), under a line on the planner itself."""
    now = time.time() if now is None else now
    decisions = data["decisions"]
    if not decisions:
        state = "acting, no decision yet" if data["acting"] else "no planner has decided anything"
        return Text(f"Planner: {state}.", style="yellow")
    d = decisions[0]
    head = Text(f"Planner: {'acting' if data['acting'] else 'not running'} | mode {d['mode']} | connector "
                f"{d['connector']} | last decision ({d['kind']}, interval {d['tick']}) {now - d['at']:.0f}s ago")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for name in ("pool", "live", "asked", "wanted", "target", "action", "kv", "pending", "reason"):
        table.add_column(name, justify="left" if name in ("pool", "action", "reason") else "right")
    for p in d["pools"]:
        table.add_row(f"{p['model']}/{p['pool']}", str(p["live"]), str(p["requested"]), str(p["wanted"]),
                      str(p["target"]), p["action"], f"{p.get('kv_usage', 0.0):.2f}", str(p.get("pending", 0)),
                      p["reason"])
    return Group(head, table)
