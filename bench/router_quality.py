"""Routing quality benchmark: `make bench-router` (or `python -m bench.router_quality`).

Runs W in-process mocker engines (the real scheduler, paged KV cache and Dynamo's timing model) on one
event loop with a private Redis, and replays the same request trace through each routing policy:
``kv`` (the real KvPolicy: the Redis prefix index fed by every engine's KV events through the real KV
relay, the shared in-flight predictions, prefill_done/release), ``round_robin``, ``random`` and
``least_loaded`` (the frontend's policies), and ``oracle``, a reference no router could run: it reads
the engines' real caches and queues and picks the shortest predicted first step (bench.oracle_policy).
Worker load reaches the real policies the way the frontend sees it: a registry snapshot refreshed every
heartbeat (1 s of model time), plus each policy's own bookkeeping.

Virtual time: every run is a simulation on :class:`bench.virtual_clock.VirtualClockLoop`, a fresh loop
per run whose clock starts at 0. The mockers run at speedup 1, so model time IS the loop's time: a step
sleeps exactly its modelled duration, and when nothing is ready and no Redis reply is outstanding the
clock jumps to the next timer instead of sleeping. While a Redis call is in flight the clock stands
still, so Redis (and everything the router does) costs zero virtual time. The numbers therefore measure
the routing, not the machine: a run takes as much wall time as its CPU work needs, and a slower or
busier host makes it slower, not different. (In real time on the 2-core VM, the same code gave kv /
round_robin TTFT ratios from 0.49 to 0.69 on different days.)

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

Every (workload, workers, policy) runs once per ``--seeds`` seed (the trace and the policies' rng both
come from the seed). Reports, per run: KV hit ratio (prompt tokens the engine reused / prompt tokens),
TTFT mean / p50 / p90 in model milliseconds (the virtual time from the routing call to the first token,
plus the policy's decision measured in real time: conservative for ``kv``, whose decision is a Redis
call that costs no virtual time; a decision that moved the clock fails the run, since it means some
Redis I/O escaped the count), the same TTFT without the decision (``ttft_virtual_*``), a ``digest`` of
every request's worker, cached tokens and virtual TTFT (repeated runs reproduce it), the decision's p50, the share of follow-up turns served by the worker of the previous
turn, requests per worker, the peak working set over one worker's cache, and the run's wall seconds.
``kv`` runs with the deployment's ``overlap_score_weight`` and, as ``kv w=X``, with each
``--extra-kv-weights``. Prints a table of the mean over seeds (min-max), then the target ratios per seed
and their mean (the target is judged on the mean); writes bench/results/router_quality.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from rich.console import Console
from rich.table import Table

from bench.chat_workloads import Turn, Workload, shared_workload, unique_workload, working_set_tokens
from bench.devstack import RedisServer
from bench.oracle_policy import TtftOracle
from bench.stats import pct
from bench.virtual_clock import VirtualClockConnection, VirtualClockLoop
from core.keys import Keys
from core.messages import SamplingParams
from core.pools import Pool
from core.settings import KvbmSettings, MockerSettings, RouterSettings
from router.kv_policy import KvPolicy
from router.policies import LeastLoadedPolicy, Policy, RandomPolicy, RoundRobinPolicy, RouteRequest
from router.registry import LiveWorker, Registry, WorkerLoad, WorkerRecord
from workers.engines.base import EngineRequest
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.tiers import MockerTiers
from workers.kv_relay import KvRelay
from workers.kvbm.tiers import KvTiers

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "bench-model"
#: Extra ``kv`` rows with these ``overlap_score_weight`` values (the deployment default is always run).
EXTRA_KV_WEIGHTS = (1.0,)
#: How often the policies' view of worker load is refreshed, in model seconds (the workers' heartbeat).
HEARTBEAT_MODEL_S = 1.0
SEEDS = (7, 8, 9)
#: Targets: kv's mean TTFT over round_robin's on ``shared``, over least_loaded's on ``unique``.
SHARED_TARGET = 0.5
UNIQUE_TARGET = 1.05


@dataclass
class Sample:
    request_id: str
    ttft_ms: float  # model ms: virtual time to the first token plus the decision's real time
    virtual_ms: float  # the virtual part alone
    prompt_tokens: int
    cached_tokens: int
    worker: str
    stayed: bool | None  # a follow-up turn: served where the previous turn was; None for a first turn
    output_tokens: int = 0
    turn: int = 0


@dataclass(frozen=True)
class TierSetup:
    """KV tiers under every mocker of a run (bench.kvbm_bench): each worker's settings are ``kvbm`` with
    its own disk directory under ``kvbm.disk_dir``; ``credit``: the workers publish their tiers' credits,
    so the router's cost counts tiers (False: it weighs device blocks only)."""

    kvbm: KvbmSettings
    credit: bool = True


class Cluster:
    """W mocker engines on this loop, registered in Redis; with ``kv`` their KV events feed the index."""

    def __init__(self, client: aioredis.Redis, keys: Keys, n: int, mocker: MockerSettings, kv_events: bool,
                 tiers: TierSetup | None = None) -> None:
        self.client, self.keys, self.n, self.mocker, self.kv_events = client, keys, n, mocker, kv_events
        self.tiers = tiers
        self.engines: dict[str, MockerEngine] = {}
        self.relays: dict[str, KvRelay] = {}
        self.records: dict[str, WorkerRecord] = {}
        self.snapshot: list[LiveWorker] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        registry = Registry(self.client, self.keys)
        for i in range(self.n):
            wid = f"w{i:02d}"
            engine = MockerEngine(MODEL, self.mocker, context_length=32_768, tiers=self._tiers_of(wid))
            relay = KvRelay(self.client, self.keys, wid, MODEL)
            await engine.start(relay.push if self.kv_events else _discard)
            record = WorkerRecord(worker_id=wid, model=MODEL, model_path="", pool=Pool.AGG, queue=f"q.{wid}",
                                  pool_queue="q.pool", engine="mocker", block_size=self.mocker.block_size,
                                  kv_blocks=self.mocker.kv_blocks, max_num_seqs=self.mocker.max_num_seqs,
                                  context_length=32_768, started_at=time.time())
            record = await registry.register(record, WorkerLoad(total_blocks=self.mocker.kv_blocks), 3600)
            if self.kv_events:
                await relay.start(record.slot, engine.cached_block_hashes, engine.tier_block_hashes)
            self.engines[wid], self.relays[wid], self.records[wid] = engine, relay, record
        self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._heartbeats())

    def _tiers_of(self, wid: str) -> MockerTiers | None:
        if self.tiers is None:
            return None
        kvbm = self.tiers.kvbm
        if kvbm.disk_dir is not None:
            kvbm = kvbm.model_copy(update={"disk_dir": kvbm.disk_dir / wid})
        store = KvTiers(kvbm, scope=f"{MODEL}-{self.mocker.block_size}", block_bytes=self.mocker.kv_bytes_per_block,
                        inline=True)
        return MockerTiers(store, self.mocker, kvbm)

    def refresh(self) -> None:
        """The registry snapshot the frontend would see. Its wall-clock stamps are informational: no
        policy reads them."""
        out = []
        for wid, engine in self.engines.items():
            load = engine.load()
            credit = load.tier_credit if self.tiers is not None and self.tiers.credit else ""
            out.append(LiveWorker(self.records[wid], WorkerLoad(load.running, load.waiting, load.active_blocks,
                                                                load.total_blocks, time.time(), tier_credit=credit),
                                  time.time() + 3600))
        self.snapshot = out

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_MODEL_S)
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


PolicyFactory = Callable[[aioredis.Redis, Keys, RouterSettings, random.Random, "Cluster"], Policy]
POLICIES: dict[str, PolicyFactory] = {
    "kv": lambda client, keys, router, rng, cluster: KvPolicy(client, keys, router, rng=rng),
    "round_robin": lambda client, keys, router, rng, cluster: RoundRobinPolicy(),
    "random": lambda client, keys, router, rng, cluster: RandomPolicy(rng),
    "least_loaded": lambda client, keys, router, rng, cluster: LeastLoadedPolicy(rng),
    # A reference, not a product policy: it reads the engines' real caches and queues (bench.oracle_policy).
    "oracle": lambda client, keys, router, rng, cluster: TtftOracle(cluster.engines, rng),
    "oracle, tiers": lambda client, keys, router, rng, cluster: TtftOracle(cluster.engines, rng, tiers=True),
}


#: What a turn's reply adds to the conversation's history: given the turn, its index in the
#: conversation and the tokens the engine answered. The default keeps the engine's own answer.
Reply = Callable[[Turn, int, list[int]], list[int]]


def engine_reply(turn: Turn, k: int, answered: list[int]) -> list[int]:
    return answered


async def run_policy(redis_url: str, policy_name: str, workload: Workload, n_workers: int, mocker: MockerSettings,
                     seed: int, router: RouterSettings, reply: Reply = engine_reply,
                     tiers: TierSetup | None = None, meanwhile: Callable[[], Coroutine[Any, Any, None]] | None = None) -> dict:
    """Replay ``workload`` through one policy on W fresh mockers; must run on a :class:`VirtualClockLoop`
    (see :func:`simulate`). Owns the database at ``redis_url``: flushes it before and after. ``reply``:
    what each answer adds to the history (bench.dynamo_compare replays its trace's canned replies, as
    its real-time client does). ``tiers``: KV tiers under the mockers (bench.kvbm_bench); ``meanwhile``: a
    task to run beside the trace (it is cancelled at the end if still running)."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualClockLoop):
        raise TypeError("run_policy measures virtual time: run it on a VirtualClockLoop (bench.router_quality.simulate)")
    if mocker.speedup != 1 or mocker.no_sleep:
        raise ValueError("the mockers must run at model speed (speedup 1, sleeping): virtual time is model time")
    t0 = time.perf_counter()
    client = aioredis.from_url(redis_url, connection_class=VirtualClockConnection)
    keys = Keys("quality")
    await client.flushdb()
    cluster = Cluster(client, keys, n_workers, mocker, kv_events=policy_name == "kv", tiers=tiers)
    await cluster.start()
    policy = POLICIES[policy_name](client, keys, router, random.Random(seed), cluster)
    samples: list[Sample] = []
    decide_ms: list[float] = []

    async def conversation(convo: list[Turn], system: list[int]) -> None:
        history = list(system)
        previous: str | None = None
        for k, turn in enumerate(convo):
            await asyncio.sleep(turn.arrival_s)
            history.extend(turn.new_tokens)
            rid = f"u{turn.user}-t{k}"
            real, arrived = time.perf_counter(), loop.time()
            decision = await policy.choose(RouteRequest(rid, MODEL, history), cluster.snapshot)
            decided_ms = (time.perf_counter() - real) * 1000
            decide_ms.append(decided_ms)
            decided = loop.time()
            if decided != arrived:
                raise RuntimeError(f"{policy_name}'s decision took {(decided - arrived) * 1000:.3f} ms of virtual time: "
                                   "some of its Redis I/O is not counted by the virtual clock (bench.virtual_clock)")
            engine = cluster.engines[decision.worker_id or ""]
            sampling = SamplingParams(max_tokens=turn.output_tokens, ignore_eos=True, seed=turn.user * 1000 + k)
            first: float | None = None
            out_tokens: list[int] = []
            cached = 0
            try:
                async for out in engine.generate(EngineRequest(rid, list(history), sampling)):
                    if out.token_ids and first is None:
                        first = loop.time()
                        policy.prefill_done(rid)
                    out_tokens.extend(out.token_ids)
                    if out.usage is not None:
                        cached = out.usage.cached_tokens
            finally:
                policy.release(rid)
            assert first is not None
            virtual_ms = (first - decided) * 1000
            wid = decision.worker_id or ""
            samples.append(Sample(rid, decided_ms + virtual_ms, virtual_ms, len(history), cached, wid,
                                  None if previous is None else previous == wid, len(out_tokens), k))
            previous = wid
            history.extend(reply(turn, k, out_tokens))

    side = loop.create_task(meanwhile()) if meanwhile is not None else None
    await asyncio.gather(*(conversation(c, workload.system[c[0].user]) for c in workload.conversations))
    model_s = loop.time()
    if side is not None:
        side.cancel()
    if isinstance(policy, KvPolicy):
        await policy.aclose()
    tier_hits = {t: sum(e.tiers.store.stats.hits[t] for e in cluster.engines.values() if e.tiers is not None)
                 for t in ("host", "disk", "shared")}
    await cluster.stop()
    await client.flushdb()
    await client.aclose()
    return _summary(policy_name, workload, n_workers, seed, samples, decide_ms) | {
        "model_s": model_s, "wall_s": time.perf_counter() - t0, "tier_hit_blocks": tier_hits,
        "output_tokens_per_model_s": sum(s.output_tokens for s in samples) / model_s if model_s else 0.0}


def _summary(policy_name: str, workload: Workload, n_workers: int, seed: int, samples: list[Sample],
             decide_ms: list[float]) -> dict:
    ttft = [s.ttft_ms for s in samples]
    virtual = [s.virtual_ms for s in samples]
    per_worker = np.bincount([int(s.worker[1:]) for s in samples], minlength=n_workers)
    stayed = [s.stayed for s in samples if s.stayed is not None]
    return {
        "policy": policy_name, "workload": workload.name, "workers": n_workers, "seed": seed,
        "requests": len(samples),
        "hit_ratio": sum(s.cached_tokens for s in samples) / max(1, sum(s.prompt_tokens for s in samples)),
        "ttft_mean_ms": float(np.mean(ttft)), "ttft_p50_ms": pct(ttft, 50), "ttft_p90_ms": pct(ttft, 90),
        "ttft_return_mean_ms": float(np.mean([s.ttft_ms for s in samples if s.turn > 0] or [0.0])),
        "ttft_virtual_mean_ms": float(np.mean(virtual)), "ttft_virtual_p50_ms": pct(virtual, 50),
        "ttft_virtual_p90_ms": pct(virtual, 90),
        "prompt_tokens_mean": float(np.mean([s.prompt_tokens for s in samples])),
        "follow_ups_stayed": float(np.mean(stayed)) if stayed else None,
        "requests_per_worker_min": int(per_worker.min()), "requests_per_worker_max": int(per_worker.max()),
        "decide_p50_ms": pct(decide_ms, 50),
        "digest": _digest(samples),
    }


def _digest(samples: list[Sample]) -> str:
    """What a run decided and measured, in virtual time only: equal digests, identical runs."""
    rows = sorted((s.request_id, s.worker, s.cached_tokens, f"{s.virtual_ms:.6f}") for s in samples)
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def simulate(redis_url: str, policy_name: str, workload: Workload, n_workers: int, mocker: MockerSettings,
             seed: int, router: RouterSettings, reply: Reply = engine_reply, tiers: TierSetup | None = None,
             meanwhile: Callable[[], Coroutine[Any, Any, None]] | None = None) -> dict:
    """:func:`run_policy` on a fresh virtual-clock loop (its clock starts at 0 for every run)."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(run_policy(redis_url, policy_name, workload, n_workers, mocker, seed, router, reply, tiers,
                                     meanwhile))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 16])
    # "oracle, tiers" is "oracle" where no KV tiers are (bench.kvbm_bench runs it).
    ap.add_argument("--policies", nargs="+", default=[p for p in POLICIES if p != "oracle, tiers"], choices=list(POLICIES))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS),
                    help="one run per seed of every (workload, workers, policy): the trace and the policy rng")
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
    ap.add_argument("--overlap-score-weight", type=float, default=RouterSettings().overlap_score_weight)
    ap.add_argument("--extra-kv-weights", type=float, nargs="*", default=list(EXTRA_KV_WEIGHTS))
    ap.add_argument("--workloads", nargs="+", default=["shared", "unique"], choices=["shared", "unique"])
    ap.add_argument("--out", type=Path, default=RESULTS / "router_quality.json")
    return ap


def _workload(args: argparse.Namespace, name: str, workers: int, seed: int) -> Workload:
    """The ``name`` workload for ``workers`` workers from the command line's parameters."""
    make: dict[str, Callable[[], Workload]] = {
        "shared": lambda: shared_workload(
            workers, seed, users_per_worker=args.users_per_worker, turns=args.turns, duration_s=args.duration_s,
            system_tokens=args.system_tokens, users_per_system=args.users_per_system,
            first_tokens=tuple(args.first_tokens), user_tokens=tuple(args.user_tokens),
            output_tokens=tuple(args.output_tokens), think_s=args.think_s),
        "unique": lambda: unique_workload(
            workers, seed, requests_per_worker=args.unique_per_worker, duration_s=args.duration_s,
            prompt_tokens=tuple(args.unique_tokens), output_tokens=tuple(args.output_tokens)),
    }
    return make[name]()


def _span(values: Sequence[float | None]) -> dict[str, float] | None:
    xs = [v for v in values if v is not None]
    return {"mean": float(np.mean(xs)), "min": min(xs), "max": max(xs)} if xs else None


SUMMARY_KEYS = ("requests", "hit_ratio", "ttft_mean_ms", "ttft_p90_ms", "ttft_virtual_mean_ms", "follow_ups_stayed",
                "requests_per_worker_min", "requests_per_worker_max", "decide_p50_ms", "wall_s",
                "working_set_over_worker_cache")


def summarize(results: list[dict]) -> list[dict]:
    """Per (workload, workers, policy), in run order: each metric's mean, min and max over the seeds."""
    groups: dict[tuple[str, int, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r["workload"], r["workers"], r["policy"]), []).append(r)
    return [{"workload": w, "workers": n, "policy": p, "seeds": [r["seed"] for r in runs]}
            | {k: _span([r[k] for r in runs]) for k in SUMMARY_KEYS}
            for (w, n, p), runs in groups.items()]


def _ratios(results: list[dict], workload: str, workers: int, a: str, b: str, key: str) -> dict[str, float]:
    """Per seed, ``a``'s ``key`` over ``b``'s (seeds both ran)."""
    get = {(r["policy"], r["workload"], r["workers"], r["seed"]): r[key] for r in results}
    seeds = sorted({r["seed"] for r in results})
    return {str(s): get[(a, workload, workers, s)] / get[(b, workload, workers, s)] for s in seeds
            if (a, workload, workers, s) in get and (b, workload, workers, s) in get}


def verdicts(results: list[dict]) -> dict[str, dict[str, dict]]:
    """The targets per worker count and kv variant: the TTFT ratio per seed and its mean over seeds (the
    target is judged on the mean; ``*_met_per_seed`` says which seeds alone would meet it). The ``oracle``
    reference gets the same ratios (under the ``kv`` key names), to show what routing can reach at all."""
    out: dict[str, dict[str, dict]] = {}
    checks = (("shared", "round_robin", SHARED_TARGET), ("unique", "least_loaded", UNIQUE_TARGET))
    for n in sorted({r["workers"] for r in results}):
        for kv in sorted({r["policy"] for r in results if r["policy"].startswith("kv") or r["policy"] == "oracle"}):
            v: dict = {}
            for workload, other, target in checks:
                per_seed = _ratios(results, workload, n, kv, other, "ttft_mean_ms")
                if not per_seed:
                    continue
                name = f"{workload}_kv_over_{other}_ttft"
                mean = float(np.mean(list(per_seed.values())))
                virtual = _ratios(results, workload, n, kv, other, "ttft_virtual_mean_ms")
                v[name] = {"per_seed": per_seed, "mean": mean,
                           "virtual_only_mean": float(np.mean(list(virtual.values())))}
                v[f"{workload}_target"] = target
                v[f"{workload}_target_met"] = mean <= target
                v[f"{workload}_target_met_per_seed"] = {s: x <= target for s, x in per_seed.items()}
            if v:
                out.setdefault(str(n), {})[kv] = v
    return out


def _fmt(span: dict[str, float] | None, spec: str, spread: bool = True) -> str:
    if span is None:
        return "-"
    text = format(span["mean"], spec)
    return f"{text} ({span['min']:{spec}}-{span['max']:{spec}})" if spread and span["min"] != span["max"] else text


def report(console: Console, args: argparse.Namespace, summary: list[dict], targets: dict) -> None:
    seeds = ", ".join(map(str, args.seeds))
    table = Table(title=f"Routing quality (mockers on a virtual clock, {args.kv_blocks} KV blocks/worker; TTFT in "
                        f"model ms; mean over seeds {seeds}, (min-max))")
    for col in ("workload", "W", "policy", "requests", "KV hit", "TTFT mean", "TTFT p90", "stayed",
                "req/worker min-max", "decide p50 ms", "wall s/run"):
        table.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    for s in summary:
        table.add_row(s["workload"], str(s["workers"]), s["policy"], _fmt(s["requests"], ".0f", spread=False),
                      _fmt(s["hit_ratio"], ".3f"), _fmt(s["ttft_mean_ms"], ".0f"), _fmt(s["ttft_p90_ms"], ".0f"),
                      _fmt(s["follow_ups_stayed"], ".2f", spread=False),
                      f"{s['requests_per_worker_min']['min']:.0f}-{s['requests_per_worker_max']['max']:.0f}",
                      _fmt(s["decide_p50_ms"], ".2f", spread=False), _fmt(s["wall_s"], ".0f", spread=False))
    console.print(table)
    for n, by_kv in targets.items():
        for kv, v in by_kv.items():
            parts = []
            for workload, other in (("shared", "round_robin"), ("unique", "least_loaded")):
                r = v.get(f"{workload}_kv_over_{other}_ttft")
                if r is None:
                    continue
                per_seed = " ".join(f"{x:.2f}" for x in r["per_seed"].values())
                met = "met" if v[f"{workload}_target_met"] else "NOT met"
                parts.append(f"{workload} {kv}/{other} TTFT per seed {per_seed}, mean {r['mean']:.2f} "
                             f"(<= {v[f'{workload}_target']:.2f}: {met}; without the decision {r['virtual_only_mean']:.2f})")
            console.print(f"W={n} {kv}: " + "; ".join(parts))


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    mocker = MockerSettings(speedup=1.0, kv_blocks=args.kv_blocks, block_size=16, max_num_seqs=256,
                            max_num_batched_tokens=8192)
    router = RouterSettings(overlap_score_weight=args.overlap_score_weight)
    runs = [(name, router) for name in args.policies]
    if "kv" in args.policies:
        runs[1:1] = [("kv", RouterSettings(overlap_score_weight=w)) for w in args.extra_kv_weights]
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a log file: the table's columns need more than 80
    results: list[dict] = []
    server = RedisServer().start()
    try:
        for n in args.workers:
            for name in args.workloads:
                for seed in args.seeds:
                    workload = _workload(args, name, n, seed)
                    ws = working_set_tokens(workload, sum(args.output_tokens) / 2) / (args.kv_blocks * 16)
                    console.print(f"{name} W={n} seed {seed}: {sum(map(len, workload.conversations))} requests, "
                                  f"working set ~{ws:.1f}x one worker's KV cache")
                    for policy, settings in runs:
                        r = simulate(server.url, policy, workload, n, mocker, seed, settings)
                        if policy == "kv" and settings is not router:
                            r["policy"] = f"kv w={settings.overlap_score_weight:g}"
                        r["working_set_over_worker_cache"] = ws
                        results.append(r)
                        console.print(f"{name:7s} W={n:<3d} seed {seed:<3d} {r['policy']:13s} hit {r['hit_ratio']:.3f}  "
                                      f"TTFT mean {r['ttft_mean_ms']:.0f} p90 {r['ttft_p90_ms']:.0f} ms  "
                                      f"({r['requests']} req, decide p50 {r['decide_p50_ms']:.2f} ms, "
                                      f"{r['model_s']:.0f} model s in {r['wall_s']:.1f} wall s, {r['digest']})")
    finally:
        server.stop()
    summary = summarize(results)
    targets = verdicts(results)
    report(console, args, summary, targets)
    out = {"benchmark": "router_quality", "clock": "virtual", "host": platform.node(),
           "python": platform.python_version(),
           "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "mocker": mocker.model_dump(), "results": results, "summary": summary, "targets": targets}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
