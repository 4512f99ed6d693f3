"""``sluice status``: one screen on a running deployment, read from Redis (not from a frontend).

Usage::

    sluice status              # models, pools, workers, frontends: one screen (rich tables)
    sluice status --watch 2    # the same, refreshed every 2 s until Ctrl-C
    sluice status --json       # the same facts for scripts (with --watch: one JSON document a line)

It shows what the registries, the broker's queues and the prefix index hold for the namespace
(router.cluster.ClusterSnapshot): each model's pools, each worker's state, load, KV usage, index
blocks, queue depth, token rate, the age of its last heartbeat and its metrics URL, and each
frontend's address, routing mode and requests in flight. Each part is read where the frontends read
it: the worker registry and the index on the routing state's Redis when ``SLUICE_INDEX_REDIS_URL``
puts it apart, the rest on the broker's (sluice.polling). :func:`status_json` and :func:`render` are
pure functions of a snapshot; the rest reads Redis and prints.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from core.settings import Settings
from planner.status import planner_json, render_planner
from router.cluster import ClusterReader, ClusterSnapshot
from router.registry import LiveWorker, parse_pairs, parse_tier_credit
from sluice.polling import deployment_planes, redis_names, repeat, run_until_interrupted


def _age(now: float, then: float) -> float | None:
    """Seconds since ``then`` (None when it was never set)."""
    return round(max(0.0, now - then), 3) if then > 0 else None


def worker_json(w: LiveWorker, snap: ClusterSnapshot) -> dict[str, Any]:
    """One worker's line. Its KV cache in two figures from its heartbeat: ``kv_blocks_used``, the blocks
    its requests hold (the load the routers weigh: 0 on an idle worker, whatever it has cached), and
    ``kv_blocks_cached``, the blocks holding cached prefixes, in use or evictable (what the prefix
    index should list for it, ``index_blocks``; for a worker with KV tiers the index also lists what its
    host and disk tiers hold, ``kv_tiers``, so there ``index_blocks`` is their sum)."""
    r, load = w.record, w.load
    return {
        "worker_id": r.worker_id, "model": r.model, "pool": r.pool, "engine": r.engine,
        "state": "draining" if load.draining else "live", "metrics_url": r.metrics_url or None,
        "queue": r.queue, "slot": r.slot, "running": load.running, "waiting": load.waiting,
        "kv_blocks_used": load.active_blocks, "kv_blocks_cached": load.cached_blocks,
        "kv_blocks_total": load.total_blocks, "kv_usage": round(load.kv_usage, 4), "index_blocks": snap.index_blocks.get(r.worker_id, 0),
        "queue_messages": snap.queue_messages.get(r.queue, 0), "tokens_per_s": round(load.tokens_per_s, 2),
        "kv_resyncs": load.kv_resyncs, "heartbeat_age_s": _age(snap.taken_at, load.updated_at),
        "lease_expires_in_s": round(w.lease_expires_at - snap.taken_at, 3),
        "uptime_s": _age(snap.taken_at, r.started_at),
        "kv_tiers": parse_pairs(load.tier_blocks, int), "kv_tier_credit": parse_tier_credit(load.tier_credit),
    }


def fmt_tiers(tiers: dict[str, int]) -> str:
    """``host 120 · disk 3000``: what each KV tier of a worker holds, in blocks."""
    return " · ".join(f"{tier} {blocks}" for tier, blocks in tiers.items()) or "-"


def model_json(model: str, snap: ClusterSnapshot) -> dict[str, Any]:
    workers = [w for w in snap.workers if w.record.model == model]
    pools: dict[str, dict[str, int]] = {}
    for (m, pool), queue in sorted(snap.pool_queues().items()):
        if m == model:
            pools[pool] = {"workers": sum(1 for w in workers if w.record.pool == pool),
                           "queue_messages": snap.queue_messages.get(queue, 0)}
    return {
        "model": model, "workers": len(workers), "pools": pools,
        "running": sum(w.load.running for w in workers), "waiting": sum(w.load.waiting for w in workers),
        "queued": sum(p["queue_messages"] for p in pools.values())
        + sum(snap.queue_messages.get(w.record.queue, 0) for w in workers),
        "index_blocks": sum(snap.index_blocks.get(w.record.worker_id, 0) for w in workers),
    }


def status_json(snap: ClusterSnapshot, planner: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything ``sluice status`` shows, as plain data (``--json``); ``planner``: the planner's part
    (planner.status.planner_json), when one ever decided anything."""
    frontends = [{
        "frontend_id": f.record.frontend_id, "url": f.record.url, "metrics_url": f.record.metrics_url,
        "router_mode": f.record.router_mode, "in_flight": f.record.in_flight,
        "heartbeat_age_s": _age(snap.taken_at, f.record.updated_at),
        "lease_expires_in_s": round(f.lease_expires_at - snap.taken_at, 3),
        "uptime_s": _age(snap.taken_at, f.record.started_at),
    } for f in snap.frontends]
    return {
        "namespace": snap.namespace, "taken_at": snap.taken_at,
        "router_modes": sorted({f["router_mode"] for f in frontends}),
        "in_flight": sum(f["in_flight"] for f in frontends),
        "models": [model_json(m, snap) for m in snap.models()],
        "workers": [worker_json(w, snap) for w in snap.workers],
        "frontends": frontends,
        "planner": planner,
    }


# ---- the screen --------------------------------------------------------------------------------
def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


def fmt_kv(used: int, cached: int, total: int) -> str:
    """KV blocks in use / holding cached prefixes, and the cached ones' share of the cache (how full
    it is: evictable blocks are free for vLLM's own usage figure, not empty)."""
    blocks = f"{used}/{cached}"
    return f"{blocks} {cached / total:.0%}" if total else blocks


#: The narrowest console that shows the workers' metrics URLs (a narrower one leaves them to --json).
WIDE_COLUMNS = 150


def _table(title: str, columns: list[str], right: set[str]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    return table


def render(status: dict[str, Any], wide: bool = False) -> RenderableType:
    """The screen, from :func:`status_json`'s data; ``wide``: with the workers' metrics URLs."""
    when = time.strftime("%H:%M:%S", time.localtime(status["taken_at"]))
    modes = ", ".join(status["router_modes"]) or "-"
    head = Text.assemble(
        ("Sluice ", "bold"), f"{status['namespace']} at {when} | frontends {len(status['frontends'])} | "
        f"workers {len(status['workers'])} | in flight {status['in_flight']} | routing {modes}")
    parts: list[RenderableType] = [head]

    models = _table("Models", ["model", "pools", "workers", "run", "wait", "queued", "index"],
                    {"workers", "run", "wait", "queued", "index"})
    for m in status["models"]:
        pools = " ".join(f"{p}:{v['workers']}" for p, v in m["pools"].items())
        models.add_row(m["model"], pools, str(m["workers"]), str(m["running"]), str(m["waiting"]), str(m["queued"]),
                       str(m["index_blocks"]))
    parts.append(models if status["models"] else Text("No live worker.", style="yellow"))

    if status["workers"]:
        several_models = len(status["models"]) > 1
        numbers = ["run", "wait", "KV used/cached", "index", "queued", "tok/s", "beat"]
        tiered = any(w["kv_tiers"] for w in status["workers"])
        workers = _table("Workers", ["worker", *(["model"] if several_models else []), "pool", "state", *numbers,
                                     *(["KV tiers"] if tiered else []), *(["metrics"] if wide else [])], set(numbers))
        for w in status["workers"]:
            state = Text(w["state"], style="green" if w["state"] == "live" else "yellow")
            workers.add_row(w["worker_id"], *([w["model"]] if several_models else []), w["pool"], state,
                            str(w["running"]), str(w["waiting"]),
                            fmt_kv(w["kv_blocks_used"], w["kv_blocks_cached"], w["kv_blocks_total"]),
                            str(w["index_blocks"]),
                            str(w["queue_messages"]), f"{w['tokens_per_s']:.1f}", fmt_seconds(w["heartbeat_age_s"]),
                            *([fmt_tiers(w["kv_tiers"])] if tiered else []), *([w["metrics_url"] or "-"] if wide else []))
        parts.append(workers)

    frontends = _table("Frontends", ["frontend", "url", "routing", "in flight", "beat", "up"],
                       {"in flight", "beat", "up"})
    for f in status["frontends"]:
        frontends.add_row(f["frontend_id"], f["url"], f["router_mode"], str(f["in_flight"]),
                          fmt_seconds(f["heartbeat_age_s"]), fmt_seconds(f["uptime_s"]))
    parts.append(frontends if status["frontends"] else Text("No live frontend.", style="yellow"))
    planner = status.get("planner")
    if planner and (planner["acting"] or planner["decisions"]):
        parts.append(render_planner(planner, status["taken_at"]))
    return Group(head, *(p for part in parts[1:] for p in ("", part)))


# ---- the command -------------------------------------------------------------------------------
Show = Callable[[ClusterSnapshot | None, dict[str, Any] | None, str], None]


async def _watch(settings: Settings, interval_s: float | None, show: Show) -> int:
    """Read a snapshot (once, or every ``interval_s`` until interrupted) and ``show`` it, or (None) the
    reason it could not be read."""
    async with deployment_planes(settings) as planes:
        reader = ClusterReader.of(planes)

        async def step() -> bool:
            try:
                snap = await reader.read()
                planner = await planner_json(planes.broker, planes.topology.keys)
            except Exception as exc:  # noqa: BLE001 - said on the screen; a watch keeps trying
                show(None, None, f"cannot read {redis_names(planes.topology)}: {exc}")
                return False
            show(snap, planner, "")
            return True

        try:
            return await repeat(step, interval_s)
        finally:
            await reader.aclose()


def run(settings: Settings, *, watch_s: float | None, as_json: bool, console: Console | None = None) -> int:
    console = console or Console()
    if as_json:
        def show_json(snap: ClusterSnapshot | None, planner: dict[str, Any] | None, error: str) -> None:
            if snap is None:
                print(f"sluice status: {error}", file=sys.stderr, flush=True)
            else:  # with --watch, one document a line
                print(json.dumps(status_json(snap, planner), indent=None if watch_s else 2), flush=True)
        return run_until_interrupted(_watch(settings, watch_s, show_json))

    def view(snap: ClusterSnapshot | None, planner: dict[str, Any] | None, error: str) -> RenderableType:
        if snap is None:
            return Text(f"sluice status: {error}", "red")
        return render(status_json(snap, planner), wide=console.width >= WIDE_COLUMNS)

    if watch_s is None:
        return run_until_interrupted(_watch(settings, None, lambda snap, planner, error: console.print(
            view(snap, planner, error))))
    from rich.live import Live

    with Live(console=console, auto_refresh=False) as live:
        return run_until_interrupted(
            _watch(settings, watch_s, lambda snap, planner, error: live.update(view(snap, planner, error),
                                                                                refresh=True)))
