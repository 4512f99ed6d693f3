"""Router benchmark: `make bench-router` (or `python -m bench.router_bench`).

Starts a private Redis, fills the prefix index with ``--blocks`` blocks spread over 256 workers, then
measures, against 4, 64 and 256 candidate workers and prompts of 1K, 8K and 32K tokens (block size
16; the first half of each prompt cached on three workers):

* ``choose`` — a full routing decision as the frontend makes it, on uvloop as the frontend runs:
  token conversion, block hashing and the one deciding script call (the chain search, the costs, the
  pick and the recorded prediction) over the policy's own connection; the request is released
  afterwards, off the clock.
* ``best`` — the standalone router's ``/best_worker``: the same script call in its dry mode, nothing
  recorded.

It then grows the index to ``--max-blocks`` and measures the target case again (8K tokens, 64
workers), compares the index read (a hand-packed pipelined MGET) with a script walking the chain
and with the client's own MGET, and measures event ingest: 16 workers applying numbered batches
(stores, and evictions once their cache is full) as fast as they can, each on its own connection.
Prints a table; writes bench/results/router.json. ``--only-target`` measures just the target case
(8K tokens, 64 workers, ``--blocks`` in the index) and skips the rest, for quick iterations (and
writes bench/results/router_target.json instead). ``--split-index`` also measures decision plus
enqueue at the target case with the routing state on the broker's Redis (one call) and on a second
Redis apart from it (two calls; bench/split_index.py), under ``split_index`` in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict, cast

import numpy as np
import redis.asyncio as aioredis
import uvloop
from rich.console import Console
from rich.table import Table

from bench.devstack import RedisServer
from bench.split_index import split_comparison
from bench.stats import pct
from core.keys import Keys
from core.messages import BlockRemoved, BlockStored, KvEventBatch
from core.pools import Pool
from core.settings import RouterSettings
from router.hashing import block_hashes, root_hash
from router.kv_policy import KvPolicy
from router.policies import RouteRequest
from router.prefix_index import PrefixIndex
from router.registry import LiveWorker, WorkerLoad, WorkerRecord
from router.resp import hex_digits
from router.scoring import leading_overlaps

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "bench-model"
BLOCK_SIZE = 16
INDEX_WORKERS = 256
WORKER_COUNTS = (4, 64, 256)
PROMPT_TOKENS = (1024, 8192, 32768)
class Target(TypedDict):
    tokens: int
    workers: int
    p50_ms: float
    p99_ms: float


TARGET: Target = {"tokens": 8192, "workers": 64, "p50_ms": 1.0, "p99_ms": 3.0}
INGEST_TARGET_BLOCKS_PER_S = 200_000


def make_workers(n: int, rng: random.Random) -> list[LiveWorker]:
    out = []
    for slot in range(n):
        wid = f"bench-w{slot}"
        record = WorkerRecord(worker_id=wid, model=MODEL, model_path="", pool=Pool.AGG, queue=f"q.{wid}",
                              pool_queue="q.pool", engine="mocker", block_size=BLOCK_SIZE, kv_blocks=1 << 20,
                              max_num_seqs=256, context_length=131072, started_at=0.0, slot=slot)
        out.append(LiveWorker(record, WorkerLoad(active_blocks=rng.randrange(0, 600), total_blocks=1 << 20),
                              lease_expires_at=time.time() + 86400))
    return out


async def fill_index(index: PrefixIndex, n_blocks: int, rng: np.random.Generator, eids: dict[int, int]) -> float:
    """Adds ``n_blocks`` random blocks spread over the index's workers, as event batches of up to 50K
    blocks; returns seconds taken."""
    t0 = time.perf_counter()
    hashes = rng.integers(1, 2**63, size=n_blocks, dtype=np.int64).astype(np.uint64)
    for slot, part in enumerate(np.array_split(hashes, INDEX_WORKERS)):
        for start in range(0, len(part), 50_000):
            eids[slot] = eids.get(slot, 0) + 1
            await add_blocks(index, slot, part[start:start + 50_000].tolist(), eids[slot])
    return time.perf_counter() - t0


async def add_blocks(index: PrefixIndex, slot: int, hashes: Sequence[int], eid: int) -> None:
    result = await index.apply(KvEventBatch(f"bench-w{slot}", eid, [BlockStored(list(hashes))]), slot=slot, model=MODEL,
                               publish=False)
    assert result.status == "ok", result


def prompts_for(tokens: int, count: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(0, 49152) for _ in range(tokens)] for _ in range(count)]


async def cache_prompts(index: PrefixIndex, prompts: list[list[int]], eids: dict[int, int],
                        rng: random.Random, n_workers: int) -> None:
    """The first half of each prompt's blocks goes to slots 0, 1 and one more below ``n_workers``."""
    root = root_hash(MODEL)
    for tokens in prompts:
        chain = block_hashes(tokens, BLOCK_SIZE, root)
        for slot in {0, 1, rng.randrange(n_workers)}:
            eids[slot] = eids.get(slot, 0) + 1
            await add_blocks(index, slot, chain[: len(chain) // 2], eids[slot])


async def redis_cpu_s(client: aioredis.Redis) -> float:
    """CPU seconds the Redis server process has used so far (INFO cpu: user + system)."""
    cpu = await client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def decision_latency(client: aioredis.Redis, policy: KvPolicy, workers: list[LiveWorker],
                           prompts: list[list[int]], rounds: int) -> dict:
    """``choose`` then ``best`` timings; per decision also the Python CPU and the Redis execution time."""
    out: dict = {"samples": rounds}
    for mode in ("choose", "best"):
        wall: list[float] = []
        overlaps: list[int] = []
        cpu = 0.0
        redis_before = await redis_cpu_s(client)
        for r in range(rounds):
            tokens = prompts[r % len(prompts)]
            req = RouteRequest(f"bench-{mode}-{r}-{time.perf_counter_ns()}", MODEL, tokens)
            c0, t0 = time.process_time(), time.perf_counter()
            d = await (policy.choose(req, workers) if mode == "choose" else policy.best(req, workers))
            wall.append((time.perf_counter() - t0) * 1000)
            cpu += time.process_time() - c0
            overlaps.append(d.overlap_blocks)
            if mode == "choose":
                policy.release(req.request_id)
                await policy.flush()
        redis_after = await redis_cpu_s(client)
        out |= {f"{mode}_p50_ms": pct(wall, 50), f"{mode}_p99_ms": pct(wall, 99),
                f"{mode}_python_cpu_ms": cpu * 1000 / rounds}
        # Redis CPU per decision; choose's includes releasing the prediction afterwards.
        out[f"{mode}_redis_cpu_ms"] = (redis_after - redis_before) * 1000 / rounds
        out[f"{mode}_overlap_mean"] = float(np.mean(overlaps))
    return out


async def ping_rtt(client: aioredis.Redis, n: int = 300) -> dict:
    """The environment's floor: a PING round trip on the same client."""
    wall = []
    for _ in range(n):
        t0 = time.perf_counter()
        await client.ping()
        wall.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": pct(wall, 50), "p99_ms": pct(wall, 99)}


#: The alternative the index read was measured against: a script that walks the chain in Redis and
#: stops at the first block nobody holds (kept here only for the comparison).
_WALK = r"""
local prefix, rows = ARGV[1], {}
for p = 1, #ARGV[2], 16 do
  local v = redis.call('GET', prefix .. string.sub(ARGV[2], p, p + 15))
  if not v then break end
  rows[#rows + 1] = v
end
return rows
"""


async def read_comparison(client: aioredis.Redis, index: PrefixIndex, keys: Keys, prompts: list[list[int]],
                          n_workers: int, rounds: int) -> dict:
    """The index read (hand-packed pipelined MGET + GETRANGE) against a script walking the chain
    and against the client's own MGET; the same numpy scoring after each."""
    root = root_hash(MODEL)
    chains = [block_hashes(t, BLOCK_SIZE, root) for t in prompts]
    slots = np.arange(n_workers)
    walk = client.register_script(_WALK)
    prefix = keys.kv_block_prefix(MODEL)

    async def via_walk(chain: Sequence[int]) -> None:
        leading_overlaps(await walk(args=[prefix, hex_digits(chain)]), slots)

    async def via_client_mget(chain: Sequence[int]) -> None:
        values = cast(list[bytes | None], await client.mget([keys.kv_block(MODEL, h) for h in chain]))
        leading_overlaps(cast(list[bytes], values[: values.index(None)] if None in values else values), slots)

    out = {}
    for name, read in (("index_read", lambda c: index.read(MODEL, [c], slots)), ("lua_walk", via_walk),
                       ("client_mget", via_client_mget)):
        wall = []
        for r in range(rounds):
            t0 = time.perf_counter()
            await read(chains[r % len(chains)])
            wall.append((time.perf_counter() - t0) * 1000)
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = pct(wall, 50), pct(wall, 99)
    return out


async def ingest(url: str, keys: Keys, workers: int, seconds: float, batch_events: int, event_blocks: int,
                 cache_blocks: int) -> dict:
    """Each worker starts with a full cache of ``cache_blocks`` and applies batches of ``batch_events``
    stores of ``event_blocks`` new blocks plus the eviction of as many old ones, like an engine whose
    prefix cache is full, each batch appended to the events stream too. Counts every block stored or
    removed. All workers run in this process, each on its own connection."""
    clients = [aioredis.from_url(url) for _ in range(workers)]
    indexes = [PrefixIndex(c, keys) for c in clients]
    stored = removed = batches = 0
    rng = np.random.default_rng(7)
    held: list[deque[list[int]]] = []
    for i in range(workers):
        chains = [rng.integers(1, 2**63, size=event_blocks, dtype=np.int64).astype(np.uint64).tolist()
                  for _ in range(cache_blocks // event_blocks)]
        await indexes[i].resync(f"ingest-w{i}", 300 + i, MODEL, [h for c in chains for h in c], 0, publish=False)
        held.append(deque(chains))
    redis_before = await redis_cpu_s(clients[0])
    cpu0 = time.process_time()
    deadline = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal stored, removed, batches
        wid, slot, eid = f"ingest-w{i}", 300 + i, 0
        while time.perf_counter() < deadline:
            events: list = []
            gone: list[int] = []
            for _ in range(batch_events):
                chain = rng.integers(1, 2**63, size=event_blocks, dtype=np.int64).astype(np.uint64).tolist()
                events.append(BlockStored(chain))
                held[i].append(chain)
                gone += held[i].popleft()
            events.append(BlockRemoved(gone))
            eid += 1
            result = await indexes[i].apply(KvEventBatch(wid, eid, events), slot=slot, model=MODEL)
            assert result.status == "ok", result
            stored += result.blocks_stored
            removed += result.blocks_removed
            batches += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    redis_s = await redis_cpu_s(clients[0]) - redis_before
    for c in clients:
        await c.aclose()
    events_total = stored + removed
    return {"workers": workers, "seconds": elapsed, "batches": batches,
            "stored_blocks_per_batch": batch_events * event_blocks,
            "stored_per_s": stored / elapsed, "removed_per_s": removed / elapsed,
            "block_events_per_s": events_total / elapsed, "batches_per_s": batches / elapsed,
            "redis_cpu_fraction": redis_s / elapsed, "redis_cpu_us_per_block_event": redis_s * 1e6 / events_total,
            "python_cpu_fraction": cpu / elapsed}


async def main(args: argparse.Namespace) -> dict:
    server = RedisServer().start()
    client = aioredis.from_url(server.url)
    keys = Keys("bench")
    index = PrefixIndex(client, keys)
    policy = KvPolicy(client, keys, RouterSettings(), rng=random.Random(1))
    rng = random.Random(3)
    np_rng = np.random.default_rng(5)
    console = Console()
    results: dict = {"host": platform.node(), "python": platform.python_version(), "redis": None,
                     "block_size": BLOCK_SIZE, "index_workers": INDEX_WORKERS}
    try:
        results["redis"] = (await client.info("server"))["redis_version"]
        console.print(f"filling the index with {args.blocks:,} blocks ...")
        eids: dict[int, int] = {}
        fill_s = await fill_index(index, args.blocks, np_rng, eids)
        all_workers = make_workers(INDEX_WORKERS, rng)
        prompts = {t: prompts_for(t, args.prompts, rng) for t in PROMPT_TOKENS}
        for t in PROMPT_TOKENS:
            await cache_prompts(index, prompts[t], eids, rng, 4)
        info = await client.info("memory")
        results["fill"] = {"blocks": args.blocks, "seconds": fill_s, "blocks_per_s": args.blocks / fill_s,
                           "used_memory_mb": info["used_memory"] / 2**20, "keys": await client.dbsize()}
        results["ping_before"] = await ping_rtt(client)
        rows = []
        cases = [(TARGET["workers"], TARGET["tokens"])] if args.only_target else \
            [(n, t) for n in WORKER_COUNTS for t in PROMPT_TOKENS]
        for n, t in cases:
            rounds = args.rounds if t < 32768 else max(args.rounds // 2, 50)
            r = await decision_latency(client, policy, all_workers[:n], prompts[t], rounds)
            rows.append({"index_blocks": args.blocks, "workers": n, "tokens": t, **r})
            console.print(f"  {n:>3} workers × {t:>5} tokens: choose p50 {r['choose_p50_ms']:.3f} ms, p99 "
                          f"{r['choose_p99_ms']:.3f} ms, python cpu {r['choose_python_cpu_ms']:.3f} ms")
        if args.split_index:
            broker = RedisServer().start()
            try:
                results["split_index"] = await split_comparison(
                    client, broker.url, keys, MODEL, all_workers[:TARGET["workers"]], prompts[TARGET["tokens"]],
                    args.split_rounds)
            finally:
                broker.stop()
            console.print(f"  decision + enqueue: {results['split_index']}")
        if args.only_target:
            results["decisions"] = rows
            return results
        if args.max_blocks > args.blocks:
            console.print(f"growing the index to {args.max_blocks:,} blocks ...")
            await fill_index(index, args.max_blocks - args.blocks, np_rng, eids)
            for n, t in ((TARGET["workers"], TARGET["tokens"]), (256, 32768)):
                r = await decision_latency(client, policy, all_workers[:n], prompts[t], args.rounds)
                rows.append({"index_blocks": args.max_blocks, "workers": n, "tokens": t, **r})
            info = await client.info("memory")
            results["fill"]["used_memory_mb_at_max"] = info["used_memory"] / 2**20
        results["decisions"] = rows
        results["read_comparison"] = {"workers": TARGET["workers"], "tokens": TARGET["tokens"],
                                      **await read_comparison(client, index, keys, prompts[TARGET["tokens"]],
                                                              TARGET["workers"], args.rounds)}
        results["ping_after"] = await ping_rtt(client)
        console.print("ingest ...")
        await client.flushall()  # ingest into an empty server: its memory is the index's own
        results["ingest_runs"] = [
            await ingest(server.url, keys, 16, args.ingest_seconds, batch_events=e, event_blocks=32, cache_blocks=20_000)
            for e in (4, 16)]
        results["ingest"] = max(results["ingest_runs"], key=lambda r: r["block_events_per_s"])
        target = next(r for r in rows if r["workers"] == TARGET["workers"] and r["tokens"] == TARGET["tokens"]
                      and r["index_blocks"] == args.blocks)
        results["targets"] = {
            "decision": {**TARGET, "index_blocks": args.blocks, "p50_ms_measured": target["choose_p50_ms"],
                         "p99_ms_measured": target["choose_p99_ms"],
                         "met": target["choose_p50_ms"] < TARGET["p50_ms"] and target["choose_p99_ms"] < TARGET["p99_ms"]},
            "ingest": {"blocks_per_s": INGEST_TARGET_BLOCKS_PER_S,
                       "measured": results["ingest"]["block_events_per_s"],
                       "met": results["ingest"]["block_events_per_s"] >= INGEST_TARGET_BLOCKS_PER_S},
        }
    finally:
        await policy.aclose()
        await client.aclose()
        server.stop()
    print_tables(console, results)
    return results


def print_tables(console: Console, results: dict) -> None:
    table = Table(title=f"Routing decision latency, ms (block size {BLOCK_SIZE}; half of each prompt cached on 3 "
                        "workers; choose = hash + read + score + decide-and-record; best = no record)")
    for col in ("index blocks", "workers", "tokens", "choose p50", "choose p99", "best p50", "best p99",
                "py cpu/choose", "redis cpu/best", "mean overlap"):
        table.add_column(col, justify="right")
    for r in results["decisions"]:
        table.add_row(f"{r['index_blocks']:,}", str(r["workers"]), f"{r['tokens']:,}", f"{r['choose_p50_ms']:.3f}",
                      f"{r['choose_p99_ms']:.3f}", f"{r['best_p50_ms']:.3f}", f"{r['best_p99_ms']:.3f}",
                      f"{r['choose_python_cpu_ms']:.3f}", f"{r['best_redis_cpu_ms']:.3f}", f"{r['choose_overlap_mean']:.0f}")
    console.print(table)
    pb, pa = results["ping_before"], results["ping_after"]
    console.print(f"environment: PING round trip p50 {pb['p50_ms']:.3f} ms before, {pa['p50_ms']:.3f} ms after")
    rc = results["read_comparison"]
    console.print(f"index read, {rc['tokens']} tokens × {rc['workers']} workers, p50/p99 ms: hand-packed MGET "
                  f"{rc['index_read_p50_ms']:.3f}/{rc['index_read_p99_ms']:.3f}; Lua chain walk "
                  f"{rc['lua_walk_p50_ms']:.3f}/{rc['lua_walk_p99_ms']:.3f}; client MGET "
                  f"{rc['client_mget_p50_ms']:.3f}/{rc['client_mget_p99_ms']:.3f}")
    table = Table(title="KV event ingest (16 workers, steady state: every batch stores new blocks and evicts as many)")
    for col in ("stored/batch", "stored/s", "removed/s", "block events/s", "batches/s", "redis cpu",
                "redis cpu µs/event", "bench py cpu"):
        table.add_column(col, justify="right")
    for ing in results["ingest_runs"]:
        table.add_row(str(ing["stored_blocks_per_batch"]), f"{ing['stored_per_s']:,.0f}", f"{ing['removed_per_s']:,.0f}",
                      f"{ing['block_events_per_s']:,.0f}", f"{ing['batches_per_s']:,.0f}",
                      f"{ing['redis_cpu_fraction']:.0%}", f"{ing['redis_cpu_us_per_block_event']:.2f}",
                      f"{ing['python_cpu_fraction']:.0%}")
    console.print(table)
    fill = results["fill"]
    console.print(f"index fill: {fill['blocks']:,} blocks in {fill['seconds']:.1f} s ({fill['blocks_per_s']:,.0f}/s), "
                  f"Redis memory {fill['used_memory_mb']:.0f} MiB"
                  + (f", {fill['used_memory_mb_at_max']:.0f} MiB at the largest size" if "used_memory_mb_at_max" in fill
                     else ""))
    for name, t in results["targets"].items():
        console.print(f"target {name}: {'met' if t['met'] else 'NOT met'} — {t}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000, help="index size for the latency matrix")
    parser.add_argument("--max-blocks", type=int, default=2_000_000, help="index size for the largest run")
    parser.add_argument("--rounds", type=int, default=400, help="decisions measured per case")
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts per size")
    parser.add_argument("--ingest-seconds", type=float, default=5.0)
    parser.add_argument("--only-target", action="store_true",
                        help="measure only 8K tokens × 64 workers at --blocks (no growth, read comparison or ingest)")
    parser.add_argument("--split-index", action="store_true",
                        help="also measure decision + enqueue with the index on the broker's Redis and apart from it")
    parser.add_argument("--split-rounds", type=int, default=500, help="decisions per case of --split-index")
    args = parser.parse_args()
    results = uvloop.run(main(args))  # the frontend's loop (uvicorn runs on uvloop)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "router_target.json" if args.only_target else "router.json"
    (RESULTS / name).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    cli()
