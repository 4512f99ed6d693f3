"""Scale benchmark: a thousand simulated workers against one Redis. `python -m bench.scale_bench`
(also the last step of `make bench-router`).

Starts a private Redis, then fleet processes (``python -m bench.fleet``, 250 workers each; module
bench.fleet.sim says what in them is real) until ``--counts`` workers are live, and at each count:

* registration: the fleets register their workers (slot claim, lease, go-live resync) all at once;
* ingest: every new worker runs its request stream (shared prefixes, evictions) and its KV relay applies
  the events to the index; batches, events and blocks per second over the wall time of the slowest
  fleet, and the Redis CPU it took;
* memory: Redis ``used_memory`` over its value before the fleets started, per (worker, block) entry
  of the index and per distinct block key, with and without the ``kv-events`` stream;
* decisions: ``KvPolicy.choose`` (the frontend's one deciding script call) for 8K-token prompts over
  every live worker, paced ``--interval-ms`` apart while a registry snapshot is refreshed every
  ``registry_refresh_s`` in the same process, as the frontend's worker directory does (each refresh
  gives new worker objects, so the next decision builds a new candidate table from their loads and
  sends it for Redis to store); ``best`` (the same script, dry) on the same prompts; how long a refresh
  and the table after it take;
* leases: heartbeats sent, failed, slowest, and workers that lost their lease.

Stops growing when the decision p99 passes ``--stop-p99-ms`` or a lease is lost. Prints a table; writes
bench/results/router_scale.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis
import uvloop
from rich.console import Console
from rich.table import Table

from bench.devstack import RedisServer
from bench.fleet.processes import FleetLaunch, Fleets
from bench.fleet.sim import MODEL, worker_id
from bench.fleet.workload import FleetWorkload, fresh_tokens, group_of, group_prefix, worker_prompt
from bench.router_bench import redis_cpu_s
from bench.stats import pct
from core.keys import Keys
from core.settings import RouterSettings
from router.kv_policy import KvPolicy
from router.policies import RouteRequest
from router.registry import LiveWorker, Registry

RESULTS = Path(__file__).resolve().parent / "results"
NAMESPACE = "scale"
PROMPT_TOKENS = 8192
TARGET = {"workers": 1000, "tokens": PROMPT_TOKENS, "p99_ms": 5.0}
#: Dynamo's published indexer benchmark, for comparison: p99 at 7,000 workers.
DYNAMO_P99_MS_AT_7000 = (6.0, 12.0)


@dataclass
class Snapshot:
    """The frontend's worker directory in miniature (app.directory.WorkerDirectory.refresh and the
    runtime's hook after it): the live, not draining workers of the model, refreshed every
    ``refresh_s``, and their candidate table built and stored in Redis (``KvPolicy.prepare``); both
    parts timed."""

    registry: Registry
    policy: KvPolicy
    refresh_s: float
    workers: list[LiveWorker] = field(default_factory=list)
    refresh_ms: list[float] = field(default_factory=list)
    prepare_ms: list[float] = field(default_factory=list)

    async def refresh(self) -> None:
        t0 = time.perf_counter()
        live = await self.registry.live_workers(MODEL)
        self.workers = [w for w in live if not w.load.draining]
        t1 = time.perf_counter()
        await self.policy.prepare(MODEL, self.workers)
        self.refresh_ms.append((t1 - t0) * 1000)
        self.prepare_ms.append((time.perf_counter() - t1) * 1000)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()


def decision_prompts(workload: FleetWorkload, workers: int, n: int, rng: random.Random) -> list[tuple[int, int, list[int]]]:
    """``n`` prompts of 8K tokens, as (expected worker or -1, expected group, tokens): half continue a
    random worker's last request (its history is cached there, its group's prefix on the whole group),
    half are a new user's text after a group's shared prefix."""
    out = []
    for j in range(n):
        w = rng.randrange(workers)
        g = group_of(workload, w)
        if j % 2 == 0:
            head, expected = worker_prompt(workload, w, workload.requests_per_worker - 1), w
        else:
            head, expected = group_prefix(workload, g), -1
        out.append((expected, g, head + fresh_tokens(1000 + j, PROMPT_TOKENS - len(head))))
    return out


class GcPauses:
    """The garbage collector's passes while it is installed: how long each took, by generation."""

    def __init__(self) -> None:
        self.ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms[info["generation"]].append((time.perf_counter() - self._t0) * 1000)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)

    def figures(self) -> dict:
        return {"gc_full_passes": len(self.ms[2]), "gc_full_max_ms": max(self.ms[2], default=0.0),
                "gc_young_max_ms": max(self.ms[0] + self.ms[1], default=0.0)}


async def decisions(policy: KvPolicy, snapshot: Snapshot, workload: FleetWorkload, rounds: int, interval_s: float,
                    rng: random.Random) -> dict:
    prompts = decision_prompts(workload, len(snapshot.workers), 32, rng)
    index_of = {w.record.worker_id: int(w.record.worker_id.split("-")[1]) for w in snapshot.workers}
    refresher = asyncio.get_running_loop().create_task(snapshot.run())
    wall: list[float] = []
    overlaps: list[int] = []
    expected_hits = expected_total = group_hits = 0
    pauses = GcPauses()
    try:
        with pauses:
            for r in range(rounds):
                expected, group, tokens = prompts[r % len(prompts)]
                workers = snapshot.workers
                req = RouteRequest(f"scale-{r}-{time.perf_counter_ns()}", MODEL, tokens)
                t0 = time.perf_counter()
                d = await policy.choose(req, workers)
                wall.append((time.perf_counter() - t0) * 1000)
                overlaps.append(d.overlap_blocks)
                group_hits += group_of(workload, index_of[d.worker_id or ""]) == group
                if expected >= 0:
                    expected_total += 1
                    expected_hits += d.worker_id == worker_id(expected)
                policy.release(req.request_id)
                await policy.flush()
                await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - t0)))
    finally:
        refresher.cancel()
    best: list[float] = []
    for r in range(min(rounds, 100)):
        _, _, tokens = prompts[r % len(prompts)]
        t0 = time.perf_counter()
        await policy.best(RouteRequest(f"scale-best-{r}", MODEL, tokens), snapshot.workers)
        best.append((time.perf_counter() - t0) * 1000)
    return {"rounds": rounds, "candidates": len(snapshot.workers), "choose_p50_ms": pct(wall, 50),
            "choose_p99_ms": pct(wall, 99), "choose_max_ms": max(wall), "best_p50_ms": pct(best, 50),
            "best_p99_ms": pct(best, 99), "overlap_mean": sum(overlaps) / len(overlaps),
            "picked_the_history_worker": expected_hits / max(expected_total, 1),
            "picked_in_the_prefix_group": group_hits / rounds,
            "refreshes": len(snapshot.refresh_ms), "refresh_p50_ms": pct(snapshot.refresh_ms, 50),
            "refresh_max_ms": max(snapshot.refresh_ms), **pauses.figures(), "prepare_p50_ms": pct(snapshot.prepare_ms, 50),
            "prepare_max_ms": max(snapshot.prepare_ms)}


async def index_figures(client: aioredis.Redis, keys: Keys, workers: int, baseline_bytes: int) -> dict:
    """Entries (a worker holding a block) and distinct block keys in the index, and Redis memory per each."""
    async with client.pipeline(transaction=False) as pipe:
        for i in range(workers):
            pipe.scard(keys.kv_worker(worker_id(i)))
        entries = sum(await pipe.execute())
    distinct = 0
    async for _ in client.scan_iter(match=f"{keys.kv_block_prefix(MODEL)}*", count=10_000):
        distinct += 1
    used = int((await client.info("memory"))["used_memory"]) - baseline_bytes
    stream = int(await client.memory_usage(keys.kv_events, samples=0) or 0)
    index_bytes = used - stream
    return {"entries": entries, "distinct_blocks": distinct, "used_memory_mb": used / 2**20,
            "events_stream_mb": stream / 2**20, "bytes_per_entry": index_bytes / max(entries, 1),
            "bytes_per_distinct_block": index_bytes / max(distinct, 1),
            "bytes_per_entry_with_stream": used / max(entries, 1)}


def ingest_figures(driven: list[dict], redis_cpu: float) -> dict:
    start, end = min(d["started_at"] for d in driven), max(d["ended_at"] for d in driven)
    seconds = end - start
    total = {k: sum(d[k] for d in driven) for k in ("workers", "requests", "batches", "events", "blocks_stored",
                                                      "blocks_removed", "cached_tokens", "prompt_tokens")}
    blocks = total["blocks_stored"] + total["blocks_removed"]
    return {**total, "seconds": seconds, "batches_per_s": total["batches"] / seconds,
            "events_per_s": total["events"] / seconds, "blocks_per_s": blocks / seconds,
            "hit_ratio": total["cached_tokens"] / max(total["prompt_tokens"], 1),
            "redis_cpu_fraction": redis_cpu / seconds, "redis_cpu_us_per_block": redis_cpu * 1e6 / max(blocks, 1)}


async def grow_to(fleets: Fleets, count: int, url: str, per_process: int, extra: tuple[str, ...]) -> list:
    have = fleets.workers
    launches = [FleetLaunch(url, NAMESPACE, first, min(per_process, count - first), extra)
                for first in range(have, count, per_process)]
    return await fleets.grow(launches)


async def one_count(console: Console, args: argparse.Namespace, fleets: Fleets, client: aioredis.Redis,
                    policy: KvPolicy, snapshot: Snapshot, count: int, baseline: int, workload: FleetWorkload) -> dict:
    keys = Keys(NAMESPACE)
    t0 = time.perf_counter()
    new = await grow_to(fleets, count, args.redis_url, args.per_process, args.fleet_args)
    reg_s = time.perf_counter() - t0
    console.print(f"{count:,} workers: {len(new)} new fleet process(es) registered in {reg_s:.1f} s; driving ...")
    cpu0 = await redis_cpu_s(client)
    driven = await fleets.command(new, "drive", "driven")
    ingest = ingest_figures(driven, await redis_cpu_s(client) - cpu0)
    console.print(f"  ingest {ingest['blocks_per_s']:,.0f} blocks/s, {ingest['batches_per_s']:,.0f} batches/s; "
                  "measuring decisions ...")
    memory = await index_figures(client, keys, count, baseline)
    await snapshot.refresh()
    live = len(snapshot.workers)
    decided = await decisions(policy, snapshot, workload, args.rounds, args.interval_ms / 1000, random.Random(count))
    leases = await fleets.command(fleets.processes, "lease", "lease")
    lease = {"heartbeats": sum(x["heartbeats"] for x in leases), "failures": sum(x["failures"] for x in leases),
             "reregistrations": sum(x["reregistrations"] for x in leases),
             "max_heartbeat_ms": max(x["max_ms"] for x in leases)}
    console.print(f"  choose p50 {decided['choose_p50_ms']:.3f} ms, p99 {decided['choose_p99_ms']:.3f} ms over "
                  f"{decided['candidates']} candidates; leases lost {lease['reregistrations']}; full gc passes "
                  f"{decided['gc_full_passes']} (longest {decided['gc_full_max_ms']:.0f} ms)")
    return {"workers": count, "live": live, "processes": len(fleets.processes), "registration_s": reg_s,
            "registrations_per_s": (count - (count - sum(p.launch.workers for p in new))) / reg_s,
            "ingest": ingest, "memory": memory, "decisions": decided, "leases": lease}


async def main(args: argparse.Namespace) -> dict:
    server = RedisServer().start()
    args.redis_url = server.url
    client = aioredis.from_url(server.url)
    keys = Keys(NAMESPACE)
    settings = RouterSettings(registry_refresh_s=args.refresh_s) if args.refresh_s else RouterSettings()
    policy = KvPolicy(client, keys, settings, rng=random.Random(1))
    snapshot = Snapshot(Registry(client, keys), policy, settings.registry_refresh_s)
    workload = FleetWorkload()
    fleets = Fleets()
    console = Console()
    results: dict = {"host": platform.node(), "python": platform.python_version(), "target": TARGET,
                     "dynamo_p99_ms_at_7000": DYNAMO_P99_MS_AT_7000, "workload": {
                         "groups": workload.groups, "prefix_tokens": workload.prefix_tokens,
                         "suffix_tokens": workload.suffix_tokens, "requests_per_worker": workload.requests_per_worker},
                     "per_process": args.per_process, "runs": []}
    t_start = time.perf_counter()
    try:
        results["redis"] = (await client.info("server"))["redis_version"]
        baseline = int((await client.info("memory"))["used_memory"])
        for count in args.counts:
            run = await one_count(console, args, fleets, client, policy, snapshot, count, baseline, workload)
            results["runs"].append(run)
            first = results["runs"][0]["decisions"]["choose_p99_ms"]
            p99 = run["decisions"]["choose_p99_ms"]
            if run["leases"]["reregistrations"] or p99 > max(args.stop_p99_ms, 4 * first):
                console.print(f"stopping at {count:,} workers: p99 {p99:.2f} ms, leases lost "
                              f"{run['leases']['reregistrations']}")
                break
        console.print("stopping the fleets (purge, deregister) ...")
        results["stopped"] = await fleets.stop()
    finally:
        fleets.kill()
        await policy.aclose()
        await client.aclose()
        server.stop()
    results["seconds"] = time.perf_counter() - t_start
    at_target = next((r for r in results["runs"] if r["workers"] == TARGET["workers"]), None)
    if at_target is not None:
        p99 = at_target["decisions"]["choose_p99_ms"]
        results["targets"] = {"decision": {**TARGET, "p99_ms_measured": p99, "met": p99 <= TARGET["p99_ms"]}}
    print_tables(console, results)
    return results


def print_tables(console: Console, results: dict) -> None:
    table = Table(title=f"Simulated workers against one Redis: decisions at {PROMPT_TOKENS:,} tokens over every live "
                        "worker (choose = the frontend's one script call; best = the same script, dry), ingest, memory")
    for col in ("workers", "procs", "register/s", "choose p50", "choose p99", "best p50", "refresh p50/max",
                "table p50/max", "ingest blocks/s", "batches/s", "redis cpu", "entries", "distinct", "B/entry",
                "B/entry +stream", "leases lost", "hb max"):
        table.add_column(col, justify="right")
    for r in results["runs"]:
        d, i, m, lease = r["decisions"], r["ingest"], r["memory"], r["leases"]
        table.add_row(f"{r['workers']:,}", str(r["processes"]), f"{r['registrations_per_s']:,.0f}",
                      f"{d['choose_p50_ms']:.2f}", f"{d['choose_p99_ms']:.2f}", f"{d['best_p50_ms']:.2f}",
                      f"{d['refresh_p50_ms']:.0f}/{d['refresh_max_ms']:.0f}", f"{d['prepare_p50_ms']:.1f}/{d['prepare_max_ms']:.1f}",
                      f"{i['blocks_per_s']:,.0f}", f"{i['batches_per_s']:,.0f}", f"{i['redis_cpu_fraction']:.0%}",
                      f"{m['entries']:,}", f"{m['distinct_blocks']:,}", f"{m['bytes_per_entry']:.0f}",
                      f"{m['bytes_per_entry_with_stream']:.0f}", str(lease["reregistrations"]),
                      f"{lease['max_heartbeat_ms']:.0f} ms")
    console.print(table)
    for name, t in results.get("targets", {}).items():
        console.print(f"target {name}: {'met' if t['met'] else 'NOT met'} — {t}")
    console.print(f"{results['seconds']:.0f} s in all")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1000, 2000],
                        help="worker counts to reach, in order (fleets are added, never replaced)")
    parser.add_argument("--per-process", type=int, default=250, help="simulated workers per fleet process")
    parser.add_argument("--rounds", type=int, default=300, help="decisions measured per count")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="time from one decision's start to the next's")
    parser.add_argument("--refresh-s", type=float, default=None, help="registry snapshot refresh interval (default: the router setting)")
    parser.add_argument("--stop-p99-ms", type=float, default=20.0, help="stop growing past this decision p99")
    parser.add_argument("--fleet-args", nargs=argparse.REMAINDER, default=(),
                        help="the rest goes to every `python -m bench.fleet` (e.g. --requests 4)")
    args = parser.parse_args()
    args.fleet_args = tuple(args.fleet_args)
    results = uvloop.run(main(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "router_scale.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    cli()
