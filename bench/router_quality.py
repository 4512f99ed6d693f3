"""Routing quality benchmark: `make bench-router` (or `python -m bench.router_quality`).

Runs W in-process mocker engines (the real scheduler, paged KV cache and Dynamo's timing model,
divided by ``--speedup``) on one event loop with a private Redis, and replays the same request trace
through each routing policy: ``kv`` (the real KvPolicy: the Redis prefix index fed by every engine's
KV events through the real KV relay, the shared in-flight predictions, prefill_done/release),
``round_robin``, ``random`` and ``least_loaded`` (the frontend's policies). Worker load reaches the
policies the way the frontend sees it: a registry snapshot refreshed every heartbeat (1 s of model
time), plus each policy's own bookkeeping.

Workloads (seeded; the same trace for every policy; the defaults, all flags):

* ``shared`` — chat shaped like Mooncake's conversation trace (long prompts, mostly reused history):
  12 users per worker start over 60 model seconds and talk for 8 turns (6-10). A conversation is a
  system prompt of ~1500 tokens (750-2250) shared by 8 users, then a first turn bringing the user's own
  context (1000-6000 tokens: a document, code, an earlier session), then questions of 50-500 tokens;
  each reply is 100-300 tokens and stays in the history, and each prompt is the whole conversation so
  far, so histories grow to 5-12K tokens (mean prompt ~6.6K tokens). Think time between a reply and
  the next turn is exponential, mean 6 s. The peak working set (every live conversation) is ~3× one
  worker's KV cache (4096 blocks of 16 tokens) and scales with the worker count, so the cluster's
  caches together can hold it but no single worker can: where a follow-up goes decides whether its
  history (a prefill of thousands of tokens) is recomputed. Load is moderate: workers are rarely idle
  and never saturated (queues stay short).
* ``unique`` — single-turn prompts of 1000-8000 random tokens that share nothing, 60 per worker over
  60 model seconds: the cache cannot help, only load balance can.

Why this shape: with the mocker's timing (Dynamo's model), a step costs at least 16.5 ms of prefill plus
the decode part (6-34 ms with KV usage), so a request whose history is cached still has a TTFT of
~50-60 ms. Only when a miss means a prefill of several thousand tokens (~100-250 ms) can routing change
TTFT by a large factor; short prompts measure the step overhead, not the router.

Reports, per policy, workload and worker count: KV hit ratio (prompt tokens the engine reused / prompt
tokens), TTFT mean / p90 in *model* milliseconds (wall time × speedup, comparable with Dynamo's
mocker numbers), the share of follow-up turns served by the worker of the previous turn, the peak
working set over one worker's cache, and the event loop's lag (the simulation's own noise: TTFT means
move by up to ~10% between identical runs). ``kv`` runs with the deployment's ``overlap_score_weight``
and, as ``kv w=X``, with each ``--extra-kv-weights``. Prints a table; writes
bench/results/router_quality.json with the target verdicts per worker count.
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
EXTRA_KV_WEIGHTS = (1.0,)
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


def _think(rng: random.Random, mean_s: float) -> float:
    """Exponential think time, clipped to [0.2, 3] × the mean (no instant replies, no users gone for good)."""
    return min(max(rng.expovariate(1 / mean_s), 0.2 * mean_s), 3 * mean_s)


def shared_workload(workers: int, seed: int, *, users_per_worker: int, turns: int, duration_s: float,
                    system_tokens: int, users_per_system: int, first_tokens: tuple[int, int],
                    user_tokens: tuple[int, int], output_tokens: tuple[int, int], think_s: float) -> Workload:
    """Chat in the shape of Mooncake's conversation trace: long prompts that are mostly reused history.

    ``users_per_worker × workers`` users start at uniform times over ``duration_s``; each talks for
    ``turns`` turns (half of them one or two turns fewer or more). The first turn brings the user's own
    context, ``first_tokens`` (uniform range: a pasted document, code, an earlier session), each later one
    a question of ``user_tokens``; the engine answers ``output_tokens`` (uniform); the next prompt is the whole conversation so far, system prompt and answers included, so
    histories grow to several thousand tokens. Think time between a reply and the next turn is
    exponential with mean ``think_s`` (clipped). One system prompt of 0.5-1.5 × ``system_tokens`` per
    ``users_per_system`` users (random groups)."""
    rng = random.Random(seed)
    n_users = users_per_worker * workers
    systems = [_tokens(rng, rng.randrange(system_tokens // 2, system_tokens * 3 // 2))
               for _ in range(max(1, n_users // users_per_system))]
    w = Workload("shared", [])
    for u in range(n_users):
        w.system[u] = systems[rng.randrange(len(systems))]
        n_turns = max(1, turns + rng.choice((-2, -1, 0, 0, 0, 0, 1, 2)))
        convo = []
        for k in range(n_turns):
            gap = rng.uniform(0, duration_s) if k == 0 else _think(rng, think_s)
            added = rng.randrange(*(user_tokens if k else first_tokens))
            convo.append(Turn(u, gap, _tokens(rng, added), rng.randrange(*output_tokens)))
        w.conversations.append(convo)
    return w


def unique_workload(workers: int, seed: int, *, requests_per_worker: int, duration_s: float,
                    prompt_tokens: tuple[int, int], output_tokens: tuple[int, int]) -> Workload:
    """Single-turn prompts of ``prompt_tokens`` (uniform range) random tokens, nothing shared, arriving at
    uniform random times over ``duration_s`` (a Poisson process, conditioned on the count)."""
    rng = random.Random(seed + 1)
    w = Workload("unique", [])
    for u in range(requests_per_worker * workers):
        w.system[u] = []
        w.conversations.append([Turn(u, rng.uniform(0, duration_s), _tokens(rng, rng.randrange(*prompt_tokens)),
                                     rng.randrange(*output_tokens))])
    return w


def working_set_tokens(workload: Workload, output_mean: float) -> int:
    """Peak, over the trace's timeline, of the tokens of every live conversation (started and not yet at
    its last turn), distinct system prompts counted once; replies taken as instant and ``output_mean``
    long. A lower bound of what the cluster must hold for every follow-up turn to hit."""
    events: list[tuple[float, int, int]] = []  # (time, conversation, tokens after this turn)
    for c, convo in enumerate(workload.conversations):
        t, size = 0.0, len(workload.system[convo[0].user])
        for turn in convo:
            t += turn.arrival_s
            size += len(turn.new_tokens) + int(output_mean)
            events.append((t, c, size))
    live: dict[int, int] = {}
    last = {c: len(convo) for c, convo in enumerate(workload.conversations)}
    seen: dict[int, int] = {}
    peak = 0
    for _, c, size in sorted(events):
        seen[c] = seen.get(c, 0) + 1
        live[c] = size
        systems = {id(workload.system[workload.conversations[i][0].user]): len(workload.system[
            workload.conversations[i][0].user]) for i in live}
        peak = max(peak, sum(live.values()) - sum(len(workload.system[workload.conversations[i][0].user])
                                                   for i in live) + sum(systems.values()))
        if seen[c] == last[c]:
            del live[c]
    return peak


@dataclass
class Sample:
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    worker: str
    stayed: bool | None  # a follow-up turn: served where the previous turn was; None for a first turn


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
        previous: str | None = None
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
            wid = decision.worker_id or ""
            samples.append(Sample(ttft, len(history), cached, wid, None if previous is None else previous == wid))
            previous = wid
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
        "follow_ups_stayed": float(np.mean(stayed)) if (stayed := [s.stayed for s in samples if s.stayed is not None])
        else None,
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
    ap.add_argument("--users-per-worker", type=int, default=12)
    ap.add_argument("--turns", type=int, default=8, help="mean turns per conversation")
    ap.add_argument("--system-tokens", type=int, default=1500, help="mean system prompt length")
    ap.add_argument("--users-per-system", type=int, default=8, help="users sharing one system prompt")
    ap.add_argument("--first-tokens", type=int, nargs=2, default=[1000, 6000],
                    help="tokens a conversation's first turn adds after the system prompt (range)")
    ap.add_argument("--user-tokens", type=int, nargs=2, default=[50, 500], help="tokens a later turn adds (range)")
    ap.add_argument("--output-tokens", type=int, nargs=2, default=[100, 300], help="reply length (range)")
    ap.add_argument("--think-s", type=float, default=6.0, help="mean model seconds between a reply and the next turn")
    ap.add_argument("--duration-s", type=float, default=60.0, help="model seconds over which users (requests) arrive")
    ap.add_argument("--unique-per-worker", type=int, default=60)
    ap.add_argument("--unique-tokens", type=int, nargs=2, default=[1000, 8000], help="unique prompt length (range)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--overlap-score-weight", type=float, default=RouterSettings().overlap_score_weight)
    ap.add_argument("--extra-kv-weights", type=float, nargs="*", default=list(EXTRA_KV_WEIGHTS))
    ap.add_argument("--workloads", nargs="+", default=["shared", "unique"], choices=["shared", "unique"])
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
                                duration_s=args.duration_s, system_tokens=args.system_tokens,
                                users_per_system=args.users_per_system, first_tokens=tuple(args.first_tokens),
                                user_tokens=tuple(args.user_tokens),
                                output_tokens=tuple(args.output_tokens), think_s=args.think_s),
                unique_workload(n, args.seed, requests_per_worker=args.unique_per_worker, duration_s=args.duration_s,
                                prompt_tokens=tuple(args.unique_tokens), output_tokens=tuple(args.output_tokens)),
            ]
            for workload in (w for w in workloads if w.name in args.workloads):
                ws = working_set_tokens(workload, sum(args.output_tokens) / 2)
                console.print(f"{workload.name} W={n}: {sum(map(len, workload.conversations))} requests, working set "
                              f"~{ws / (args.kv_blocks * 16):.1f}x one worker's KV cache")
                runs = [(name, router) for name in args.policies]
                if "kv" in args.policies:
                    runs[1:1] = [("kv", RouterSettings(overlap_score_weight=w)) for w in args.extra_kv_weights]
                for name, settings in runs:
                    r = await run_policy(server.url, name, workload, n, mocker, args.seed, settings)
                    if name == "kv" and settings is not router:
                        r["policy"] = name = f"kv w={settings.overlap_score_weight:g}"
                    r["working_set_over_worker_cache"] = ws / (args.kv_blocks * 16)
                    results.append(r)
                    console.print(f"{workload.name:7s} W={n:<3d} {name:13s} hit {r['hit_ratio']:.3f}  "
                                  f"TTFT mean {r['ttft_mean_ms']:.0f} p90 {r['ttft_p90_ms']:.0f} ms  "
                                  f"({r['requests']} req, {r['wall_s']:.1f} s, lag p90 {r['loop_lag_p90_ms']:.1f} ms)")
    finally:
        server.stop()

    table = Table(title=f"Routing quality (mocker, speedup {args.speedup:g}, {args.kv_blocks} KV blocks/worker; "
                        "TTFT in model ms)")
    for col in ("workload", "workers", "policy", "requests", "KV hit", "TTFT mean", "TTFT p90", "stayed",
                "req/worker min-max"):
        table.add_column(col, justify="right" if col not in ("workload", "policy") else "left")
    for r in results:
        table.add_row(r["workload"], str(r["workers"]), r["policy"], str(r["requests"]), f"{r['hit_ratio']:.3f}",
                      f"{r['ttft_mean_ms']:.0f}", f"{r['ttft_p90_ms']:.0f}",
                      "-" if r["follow_ups_stayed"] is None else f"{r['follow_ups_stayed']:.2f}",
                      f"{r['requests_per_worker_min']}-{r['requests_per_worker_max']}")
    console.print(table)
    verdicts: dict[str, dict[str, dict[str, float | bool]]] = {}
    have = {(r["policy"], r["workload"], r["workers"]) for r in results}
    for n in args.workers:
        for kv in sorted({r["policy"] for r in results if r["policy"].startswith("kv")}):
            v: dict[str, float | bool] = {}
            if {(kv, "shared", n), ("round_robin", "shared", n)} <= have:
                v["shared_kv_over_round_robin_ttft"] = x = _ratio(results, "shared", n, kv, "round_robin")
                v["shared_target_met"] = x <= 0.5
            if {(kv, "unique", n), ("least_loaded", "unique", n)} <= have:
                v["unique_kv_over_least_loaded_ttft"] = y = _ratio(results, "unique", n, kv, "least_loaded")
                v["unique_target_met"] = y <= 1.05
            if v:
                verdicts.setdefault(str(n), {})[kv] = v
                console.print(f"W={n} {kv}: " + ", ".join(
                    f"{k} = {val:.2f}" for k, val in v.items() if not isinstance(val, bool))
                    + " (targets: shared <= 0.50, unique <= 1.05)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "router_quality", "host": platform.node(), "python": platform.python_version(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "mocker": asdict(mocker) if hasattr(mocker, "__dataclass_fields__") else mocker.model_dump(),
        "results": results, "targets": verdicts}, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
