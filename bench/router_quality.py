"""Routing quality benchmark: `make bench-router` (or `python -m bench.router_quality`).

Runs W in-process mocker engines (the real scheduler, paged KV cache and Dynamo's timing model,
divided by ``--speedup``) on one event loop with a private Redis, and replays the same request trace
through each routing policy: ``kv`` (the real KvPolicy: the Redis prefix index fed by every engine's
KV events through the real KV relay, the shared in-flight predictions, prefill_done/release),
``round_robin``, ``random`` and ``least_loaded`` (the frontend's policies). Worker load reaches the
policies the way the frontend sees it: a registry snapshot refreshed every heartbeat (1 s of model
time), plus each policy's own bookkeeping.

Workloads (seeded; the same trace for every policy):

* ``shared`` — many users in multi-turn conversations that grow (each turn's prompt is the whole
  conversation so far: system prompt, earlier questions and the tokens the engine generated), the
  system prompts shared by groups of users. The working set (every live conversation) is several
  times one worker's KV cache, so where a conversation goes decides whether its prefix is reused.
* ``unique`` — single-turn prompts that share nothing: the cache cannot help, only load balance can.

Reports, per policy, workload and worker count: KV hit ratio (prompt tokens the engine reused / prompt
tokens) and TTFT mean / p90 in *model* milliseconds (wall time × speedup, comparable with Dynamo's
mocker numbers), plus the event loop's lag (the simulation's own noise). Prints a table; writes
bench/results/router_quality.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis
from rich.console import Console
from rich.table import Table

from bench.stats import pct
from core.keys import Keys
from core.messages import SamplingParams
from core.settings import MockerSettings, RouterSettings
from router.kv_policy import KvPolicy
from router.policies import LeastLoadedPolicy, Policy, RandomPolicy, RoundRobinPolicy, RouteRequest
from router.registry import LiveWorker, Registry, WorkerLoad, WorkerRecord
from sluice.devstack import RedisServer
from workers.engines.base import EngineRequest
from workers.engines.mocker import MockerEngine
from workers.kv_relay import KvRelay

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "bench-model"
POLICIES = ("kv", "round_robin", "random", "least_loaded")
#: Extra ``kv`` rows with these ``overlap_score_weight`` values (the deployment default is always run).
EXTRA_KV_WEIGHTS = (4.0,)
#: How often the policies' view of worker load is refreshed, in model seconds (the workers' heartbeat).
HEARTBEAT_MODEL_S = 1.0


@dataclass(frozen=True)
class Turn:
    user: int
    arrival_s: float  # model seconds; for follow-up turns: think time after the previous turn ended
    new_tokens: list[int]
    output_tokens: int


@dataclass
class Workload:
    name: str
    conversations: list[list[Turn]]
    system: dict[int, list[int]] = field(default_factory=dict)  # user -> system prompt tokens


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 49_000) for _ in range(n)]


def shared_workload(workers: int, seed: int, *, users_per_worker: int, turns: int, duration_s: float,
                    system_tokens: int, think_s: float) -> Workload:
    """Users start over ``duration_s``; each has ``turns`` turns of 60-250 new tokens, 40-200 output tokens,
    with 0.25-1.75 × ``think_s`` of thinking between them; one system prompt of 0.5-1.5 × ``system_tokens``
    tokens per 4 users."""
    rng = random.Random(seed)
    n_users = users_per_worker * workers
    systems = [_tokens(rng, rng.randrange(system_tokens // 2, system_tokens * 3 // 2))
               for _ in range(max(1, n_users // 4))]
    w = Workload("shared", [])
    for u in range(n_users):
        w.system[u] = systems[rng.randrange(len(systems))]
        convo = [Turn(u, rng.uniform(0, duration_s), _tokens(rng, rng.randrange(60, 250)), rng.randrange(40, 200))]
        for _ in range(turns - 1):
            convo.append(Turn(u, rng.uniform(0.25 * think_s, 1.75 * think_s), _tokens(rng, rng.randrange(60, 250)), rng.randrange(40, 200)))
        w.conversations.append(convo)
    return w


def unique_workload(workers: int, seed: int, *, requests_per_worker: int, duration_s: float) -> Workload:
    """Single-turn prompts of 500-3000 random tokens (nothing shared), Poisson-ish arrivals over ``duration_s``."""
    rng = random.Random(seed)
    w = Workload("unique", [])
    for u in range(requests_per_worker * workers):
        w.system[u] = []
        w.conversations.append([Turn(u, rng.uniform(0, duration_s), _tokens(rng, rng.randrange(500, 3000)),
                                     rng.randrange(40, 200))])
    return w


@dataclass
class Sample:
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    worker: str


class Cluster:
    """W mocker engines on this loop, registered in Redis; with ``kv`` their KV events feed the index."""

    def __init__(self, client: aioredis.Redis, keys: Keys, n: int, mocker: MockerSettings, kv_events: bool) -> None:
        self.client, self.keys, self.n, self.mocker, self.kv_events = client, keys, n, mocker, kv_events
        self.engines: dict[str, MockerEngine] = {}
        self.relays: dict[str, KvRelay] = {}
        self.records: dict[str, WorkerRecord] = {}
        self.snapshot: list[LiveWorker] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        registry = Registry(self.client, self.keys)
        for i in range(self.n):
            wid = f"w{i:02d}"
            engine = MockerEngine(MODEL, self.mocker, context_length=32_768)
            relay = KvRelay(self.client, self.keys, wid, MODEL)
            await engine.start(relay.push if self.kv_events else _discard)
            record = WorkerRecord(worker_id=wid, model=MODEL, model_path="", pool="agg", queue=f"q.{wid}",
                                  pool_queue="q.pool", engine="mocker", block_size=self.mocker.block_size,
                                  kv_blocks=self.mocker.kv_blocks, max_num_seqs=self.mocker.max_num_seqs,
                                  context_length=32_768, started_at=time.time())
            record = await registry.register(record, WorkerLoad(total_blocks=self.mocker.kv_blocks), 3600)
            if self.kv_events:
                await relay.start(record.slot, engine.cached_block_hashes)
            self.engines[wid], self.relays[wid], self.records[wid] = engine, relay, record
        self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._heartbeats())

    def refresh(self) -> None:
        out = []
        for wid, engine in self.engines.items():
            load = engine.load()
            out.append(LiveWorker(self.records[wid], WorkerLoad(load.running, load.waiting, load.active_blocks,
                                                                load.total_blocks, time.time()), time.time() + 3600))
        self.snapshot = out

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_MODEL_S / self.mocker.speedup)
            self.refresh()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        for wid, engine in self.engines.items():
            await engine.shutdown()
            if self.kv_events:
                await self.relays[wid].close()


def _discard(events: Sequence[object]) -> None:
    pass


async def _loop_lag(stop: asyncio.Event, lags: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(0.005)
        lags.append((loop.time() - t - 0.005) * 1000)


async def run_policy(redis_url: str, policy_name: str, workload: Workload, n_workers: int, mocker: MockerSettings,
                     seed: int, router: RouterSettings) -> dict:
    client = aioredis.from_url(redis_url)
    keys = Keys(f"q{random.getrandbits(32):08x}")
    await client.flushdb()
    cluster = Cluster(client, keys, n_workers, mocker, kv_events=policy_name == "kv")
    await cluster.start()
    rng = random.Random(seed)
    policy: Policy = {
        "kv": lambda: KvPolicy(client, keys, router, rng=rng),
        "round_robin": RoundRobinPolicy,
        "random": lambda: RandomPolicy(rng),
        "least_loaded": lambda: LeastLoadedPolicy(rng),
    }[policy_name]()
    speed = mocker.speedup
    samples: list[Sample] = []
    decide_ms: list[float] = []
    t0 = time.perf_counter()

    async def conversation(convo: list[Turn], system: list[int]) -> None:
        history = list(system)
        await asyncio.sleep(convo[0].arrival_s / speed)
        for k, turn in enumerate(convo):
            if k:
                await asyncio.sleep(turn.arrival_s / speed)
            history.extend(turn.new_tokens)
            rid = f"u{turn.user}-t{k}"
            start = time.perf_counter()
            decision = await policy.choose(RouteRequest(rid, MODEL, history), cluster.snapshot)
            decided = time.perf_counter()
            decide_ms.append((decided - start) * 1000)
            engine = cluster.engines[decision.worker_id or ""]
            sampling = SamplingParams(max_tokens=turn.output_tokens, ignore_eos=True, seed=turn.user * 1000 + k)
            first: float | None = None
            out_tokens: list[int] = []
            cached = 0
            try:
                async for out in engine.generate(EngineRequest(rid, list(history), sampling)):
                    if out.token_ids and first is None:
                        first = time.perf_counter()
                        policy.prefill_done(rid)
                    out_tokens.extend(out.token_ids)
                    if out.usage is not None:
                        cached = out.usage.cached_tokens
            finally:
                policy.release(rid)
            assert first is not None
            # The engines run ``speed`` times faster than the model they simulate; the router does not:
            # its decision time counts as it is, the engine's part is scaled back to model time.
            ttft = (decided - start) * 1000 + (first - decided) * 1000 * speed
            samples.append(Sample(ttft, len(history), cached, decision.worker_id or ""))
            history.extend(out_tokens)

    stop = asyncio.Event()
    lags: list[float] = []
    lag_task = asyncio.get_running_loop().create_task(_loop_lag(stop, lags))
    await asyncio.gather(*(conversation(c, workload.system[c[0].user]) for c in workload.conversations))
    wall = time.perf_counter() - t0
    stop.set()
    await lag_task
    if isinstance(policy, KvPolicy):
        await policy.flush()
    await cluster.stop()
    await client.flushdb()
    await client.aclose()
    ttft = [s.ttft_ms for s in samples]
    per_worker = np.bincount([int(s.worker[1:]) for s in samples], minlength=n_workers)
    return {
        "policy": policy_name, "workload": workload.name, "workers": n_workers, "requests": len(samples),
        "hit_ratio": sum(s.cached_tokens for s in samples) / max(1, sum(s.prompt_tokens for s in samples)),
        "ttft_mean_ms": float(np.mean(ttft)), "ttft_p50_ms": pct(ttft, 50), "ttft_p90_ms": pct(ttft, 90),
        "prompt_tokens_mean": float(np.mean([s.prompt_tokens for s in samples])),
        "requests_per_worker_min": int(per_worker.min()), "requests_per_worker_max": int(per_worker.max()),
        "decide_p50_ms": pct(decide_ms, 50), "loop_lag_p90_ms": pct(lags, 90), "wall_s": wall,
    }


def _ratio(results: list[dict], workload: str, workers: int, a: str, b: str, key: str = "ttft_mean_ms") -> float:
    get = {(r["policy"], r["workload"], r["workers"]): r for r in results}
    return get[(a, workload, workers)][key] / get[(b, workload, workers)][key]


async def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--speedup", type=float, default=2.0, help="mocker time divisor")
    ap.add_argument("--kv-blocks", type=int, default=4096, help="KV cache per worker (blocks of 16 tokens)")
    ap.add_argument("--users-per-worker", type=int, default=24)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=1500, help="mean system prompt length")
    ap.add_argument("--think-s", type=float, default=1.75, help="mean model seconds between a reply and the next turn")
    ap.add_argument("--unique-per-worker", type=int, default=40)
    ap.add_argument("--duration-s", type=float, default=20.0, help="model seconds over which users arrive")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--overlap-score-weight", type=float, default=RouterSettings().overlap_score_weight)
    ap.add_argument("--extra-kv-weights", type=float, nargs="*", default=list(EXTRA_KV_WEIGHTS))
    ap.add_argument("--out", type=Path, default=RESULTS / "router_quality.json")
    args = ap.parse_args(argv)
    mocker = MockerSettings(speedup=args.speedup, kv_blocks=args.kv_blocks, block_size=16, max_num_seqs=256,
                            max_num_batched_tokens=8192)
    router = RouterSettings(overlap_score_weight=args.overlap_score_weight)
    server = RedisServer().start()
    console = Console()
    results: list[dict] = []
    try:
        for n in args.workers:
            workloads = [
                shared_workload(n, args.seed, users_per_worker=args.users_per_worker, turns=args.turns,
                                duration_s=args.duration_s, system_tokens=args.system_tokens, think_s=args.think_s),
                unique_workload(n, args.seed, requests_per_worker=args.unique_per_worker, duration_s=args.duration_s),
            ]
            for workload in workloads:
                runs = [(name, router) for name in args.policies]
                if "kv" in args.policies:
                    runs[1:1] = [("kv", RouterSettings(overlap_score_weight=w)) for w in args.extra_kv_weights]
                for name, settings in runs:
                    r = await run_policy(server.url, name, workload, n, mocker, args.seed, settings)
                    if name == "kv" and settings is not router:
                        r["policy"] = name = f"kv w={settings.overlap_score_weight:g}"
                    results.append(r)
                    console.print(f"{workload.name:7s} W={n:<3d} {name:13s} hit {r['hit_ratio']:.3f}  "
                                  f"TTFT mean {r['ttft_mean_ms']:.0f} p90 {r['ttft_p90_ms']:.0f} ms  "
                                  f"({r['requests']} req, {r['wall_s']:.1f} s, lag p90 {r['loop_lag_p90_ms']:.1f} ms)")
    finally:
        server.stop()

    table = Table(title=f"Routing quality (mocker, speedup {args.speedup:g}, {args.kv_blocks} KV blocks/worker; "
                        "TTFT in model ms)")
    for col in ("workload", "workers", "policy", "requests", "KV hit", "TTFT mean", "TTFT p90", "req/worker min-max"):
        table.add_column(col, justify="right" if col not in ("workload", "policy") else "left")
    for r in results:
        table.add_row(r["workload"], str(r["workers"]), r["policy"], str(r["requests"]), f"{r['hit_ratio']:.3f}",
                      f"{r['ttft_mean_ms']:.0f}", f"{r['ttft_p90_ms']:.0f}",
                      f"{r['requests_per_worker_min']}-{r['requests_per_worker_max']}")
    console.print(table)
    verdicts = {}
    if {"kv", "round_robin", "least_loaded"} <= set(args.policies):
        for n in args.workers:
            shared = _ratio(results, "shared", n, "kv", "round_robin")
            unique = _ratio(results, "unique", n, "kv", "least_loaded")
            verdicts[str(n)] = {"kv_w4_over_round_robin_ttft": _ratio(results, "shared", n, "kv w=4", "round_robin")
                                if "kv w=4" in {r["policy"] for r in results} else None,"shared_kv_over_round_robin_ttft": shared, "shared_target_met": shared <= 0.5,
                                "unique_kv_over_least_loaded_ttft": unique, "unique_target_met": unique <= 1.05}
            console.print(f"W={n}: shared kv/round_robin mean TTFT = {shared:.2f} (target <= 0.50); "
                          f"unique kv/least_loaded = {unique:.2f} (target <= 1.05)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "router_quality", "host": platform.node(), "python": platform.python_version(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "mocker": asdict(mocker) if hasattr(mocker, "__dataclass_fields__") else mocker.model_dump(),
        "results": results, "targets": verdicts}, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
