"""``make bench-planner``: the planner against static fleets and the oracle on a time-compressed day.

Usage::

    python -m bench.planner_bench                          # agg and disagg, every fleet; table + JSON
    python -m bench.planner_bench --layouts agg --fleets planner,oracle --step-s 8

Each run is a real stack on mocker workers (a private Redis, ``sluice serve``, workers as
``sluice worker`` processes) driven through the HTTP API by open-loop Poisson arrivals that follow the
day of bench.planner_trace (one planner interval per step; ``--step-s`` real seconds each, the day's
60 s intervals compressed). The fleets:

* ``planner``: ``sluice planner`` (``sla`` mode, the local connector), which starts and stops the workers
  itself. In the agg run it is killed (SIGKILL) in the middle of the chat peak and started again one
  interval later: the fleet must stay as it was, and the new planner must resume without a burst.
* ``oracle``: the offline schedule (bench.planner_trace.oracle), applied at each step by the bench with
  the same local connector, each step's workers started one step early (it knows the future).
* ``static-peak`` and ``static-mean``: fixed fleets from the oracle's schedule.
* ``causal``: the offline sizing of bench.planner_trace.causal with the planner's defaults (each step on
  the previous one's arrivals, its hysteresis and sure shrink, no fast path), applied at each step's start:
  what sizing on the past alone, at the offline bound's worker-seconds (bench.planner_bounds), meets live.
* ``dynamo``: Dynamo 1.6.1's planner's decisions for the same day (bench.planner_dynamo, from its own
  code in the anchor's venv), applied as a schedule; left out when the anchor is not installed.

The profile both the planner and the oracle read is measured first with ``sluice profile`` on the same
mocker settings. Reported per run: SLA attainment (requests with TTFT and mean ITL within the targets),
worker-seconds (live workers sampled every second, draining ones included), scaling actions, streams
lost (a stream that got tokens and then failed) and every error, flapping (a pool scaled one way and
back within two intervals of time, the second action answering a steady step: bench.planner_trace
.action_times and .flaps), and the planner's own CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import redis.asyncio as aioredis
from rich.console import Console
from rich.table import Table

from bench.devstack import REPO, RedisServer, Stack, forget, stop_at_exit, with_parent_death_signal
from bench.planner_trace import (
    DAY,
    Arrival,
    Schedule,
    action_times,
    actions_of,
    arrivals,
    attainment,
    causal,
    cpu_by_step,
    day_slice,
    fixed,
    fixed_sizes,
    flaps,
    oracle,
    realized_rates,
    static,
    steady_intervals,
)
from bench.sse_trace import stream_trace
from core.keys import Keys
from core.pools import Pool
from core.settings import PlannerSettings, Settings
from planner.connectors.base import PoolRef
from planner.connectors.local import STATE_FILE, LocalConnector
from planner.controller import pools_of
from planner.decision import decode_decision
from planner.modes import SlaPlanner
from planner.profile import Profile
from planner.scaling import lowest
from router.registry import Registry
from workers.models.prepare import prepare_model

MODEL = "smollm2"
VOCAB = (1000, 40000)
DEFAULT_OUT = REPO / "bench" / "results" / "planner.json"


@dataclass
class Config:
    step_s: float
    base_rate: float
    ttft_s: float
    itl_s: float
    speedup: float
    kv_blocks: int
    min_replicas: int
    max_replicas: int
    budget: int
    utilization: float
    margin: float
    seed: int
    correction: bool = False
    #: The sla mode's rate headroom (standard deviations of an interval's Poisson arrivals).
    headroom_z: float = PlannerSettings().rate_headroom_z
    #: The sla mode's sure shrink (standard deviations above the observed rate; 0: off).
    sure_shrink_z: float = PlannerSettings().sure_shrink_z
    #: The sla mode's sure rise (standard deviations of the interval so far above the forecast; 0: off).
    sure_rise_z: float = PlannerSettings().sure_rise_z
    #: The sla mode's floor grows a pool only on arrivals this many deviations above the forecast (0: always).
    floor_rise_z: float = PlannerSettings().floor_rise_z
    #: Disaggregated: the prefill pool may go to 0, the decode pool computing the prompts (the planner's
    #: SLUICE_PLANNER__LOCAL_PREFILL and the oracle's model alike).
    local_prefill: bool = True
    #: The sla mode's up-band (the share of a pool's size its plan's need may pass it by before it grows).
    up_band: float = PlannerSettings().up_band
    #: The sla mode's floor margin of a decode pool apart (the share of the ITL target at which the floor
    #: takes its KV target; None: the margin).
    decode_floor_margin: float | None = PlannerSettings().decode_floor_margin


def worker_env(c: Config) -> dict[str, str]:
    """The mocker workers' settings, the same for every fleet and for the profile."""
    return {"SLUICE_WORKER__MOCKER__SPEEDUP": str(c.speedup), "SLUICE_WORKER__MOCKER__KV_BLOCKS": str(c.kv_blocks),
            "SLUICE_WORKER__DRAIN_TIMEOUT_S": "60", "SLUICE_WORKER__TASK_EVENTS": "false",
            "SLUICE_WORKER__METRICS_PORT": "-1", "SLUICE_DISAGG__MIN_TOKENS": "0", "SLUICE_DISAGG__MIN_RATIO": "0"}


def measure_profile(c: Config, tokenizer_dir: Path, out: Path, console: Console) -> Profile:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env |= worker_env(c) | {"SLUICE_MODEL_PATH": str(tokenizer_dir), "SLUICE_MODEL": MODEL}
    t0 = time.monotonic()
    subprocess.run(with_parent_death_signal([sys.executable, "-m", "sluice", "profile", "-o", str(out),
                                             "--isl", "128,512,1024,2000,3000", "--contexts", "576,2016",
                                             "--batches", "1,4,8,16,32,64"]),
                   env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    console.print(f"profile measured in {time.monotonic() - t0:.0f} s: {out}")
    return Profile.load(out)


# ---- a run's fleet ----------------------------------------------------------------------------------
class FleetCleanup:
    """Stops what a local connector's state file lists (at the run's end, or when the bench exits)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        stop_at_exit(self)

    def stop(self) -> None:
        try:
            workers = json.loads((self.run_dir / STATE_FILE).read_text())["workers"]
        except (OSError, ValueError, KeyError):
            workers = []
        procs = []
        for w in workers:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(w["pid"])
                if abs(p.create_time() - w["created"]) < 0.5:
                    p.terminate()
                    procs.append(p)
        _gone, alive = psutil.wait_procs(procs, timeout=70)
        for p in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        forget(self)


@dataclass
class RunRecord:
    rows: list[dict] = field(default_factory=list)
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    #: The machine's CPU busy share (all cores, 0-1) over each second before the sample's time.
    cpu: list[tuple[float, float]] = field(default_factory=list)


async def sample_fleet(redis: aioredis.Redis, keys: Keys, record: RunRecord, stop: asyncio.Event) -> None:
    registry = Registry(redis, keys)
    psutil.cpu_percent()  # the first call only starts the count
    while not stop.is_set():
        counts: dict[str, int] = {}
        with contextlib.suppress(Exception):
            for w in await registry.live_workers(MODEL):
                counts[w.record.pool.value] = counts.get(w.record.pool.value, 0) + 1
        now = time.monotonic()
        record.samples.append((now, counts))
        record.cpu.append((now, psutil.cpu_percent() / 100))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()


async def one_request(session: aiohttp.ClientSession, base_url: str, a: Arrival, seed: int) -> dict:
    import random

    rng = random.Random(seed)
    body = {"model": MODEL, "prompt": [rng.randrange(*VOCAB) for _ in range(a.isl)], "max_tokens": a.osl,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    trace = await stream_trace(session, f"{base_url}/v1/completions", body)
    times = trace.token_times
    itl = (times[-1] - times[0]) / (trace.completion_tokens - 1) if trace.ok and trace.completion_tokens and \
        trace.completion_tokens > 1 else None
    return {"step": a.step, "isl": a.isl, "osl": a.osl, "ok": trace.ok, "ttft_s": trace.ttft_s, "itl_s": itl,
            "tokens": trace.completion_tokens, "lost": bool(times) and not trace.ok, "error": trace.error}


async def drive(base_url: str, plan: list[Arrival], record: RunRecord,
                on_step: Any = None, step_s: float = 10.0, first: int = 0) -> None:  # noqa: ANN401
    """Send every arrival at its time; ``on_step(i)`` at the start of each step (the schedules). The plan
    starts at step ``first`` of the day (a slice: bench.planner_trace.day_slice)."""
    t0 = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        tasks = []
        steps = max(a.step for a in plan) + 1
        step_tasks = []
        if on_step is not None:
            async def stepper() -> None:
                for i in range(first, steps):
                    await asyncio.sleep(max(0.0, t0 + (i - first) * step_s - time.monotonic()))
                    await on_step(i)
            step_tasks.append(asyncio.create_task(stepper()))
        for k, a in enumerate(plan):
            await asyncio.sleep(max(0.0, t0 + a.at_s - time.monotonic()))
            tasks.append(asyncio.create_task(one_request(session, base_url, a, k)))
        record.rows.extend(await asyncio.gather(*tasks))
        for t in step_tasks:
            await t


def worker_seconds(samples: list[tuple[float, dict[str, int]]], t0: float, t1: float) -> float:
    total = 0.0
    for (ta, counts), (tb, _) in zip(samples, samples[1:], strict=False):
        lo, hi = max(ta, t0), min(tb, t1)
        if hi > lo:
            total += sum(counts.values()) * (hi - lo)
    return total


async def wait_fleet(redis: aioredis.Redis, keys: Keys, want: dict[str, int], timeout_s: float = 120) -> None:
    registry = Registry(redis, keys)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts: dict[str, int] = {}
        for w in await registry.live_workers(MODEL):
            if not w.load.draining:
                counts[w.record.pool.value] = counts.get(w.record.pool.value, 0) + 1
        if all(counts.get(p, 0) >= n for p, n in want.items()):
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the fleet {want} did not come up")


def planner_env(c: Config, layout: str, profile_path: Path, run_dir: Path) -> dict[str, str]:
    return {"SLUICE_PLANNER__MODE": "sla", "SLUICE_PLANNER__LAYOUT": layout,
            "SLUICE_PLANNER__CONNECTOR": "local", "SLUICE_PLANNER__PROFILE": str(profile_path),
            "SLUICE_PLANNER__INTERVAL_S": str(c.step_s), "SLUICE_PLANNER__FAST_INTERVAL_S": str(max(1.0, c.step_s / 5)),
            "SLUICE_PLANNER__TTFT_S": str(c.ttft_s), "SLUICE_PLANNER__ITL_S": str(c.itl_s),
            "SLUICE_PLANNER__MIN_REPLICAS": str(c.min_replicas), "SLUICE_PLANNER__MAX_REPLICAS": str(c.max_replicas),
            "SLUICE_PLANNER__BUDGET": str(c.budget), "SLUICE_PLANNER__PREFILL_UTILIZATION": str(c.utilization),
            "SLUICE_PLANNER__SLA_MARGIN": str(c.margin), "SLUICE_PLANNER__CORRECTION": str(c.correction).lower(),
            "SLUICE_PLANNER__RATE_HEADROOM_Z": str(c.headroom_z), "SLUICE_PLANNER__SURE_SHRINK_Z": str(c.sure_shrink_z),
            "SLUICE_PLANNER__SURE_RISE_Z": str(c.sure_rise_z), "SLUICE_PLANNER__FLOOR_RISE_Z": str(c.floor_rise_z),
            "SLUICE_PLANNER__LOCAL_PREFILL": str(c.local_prefill).lower(), "SLUICE_PLANNER__UP_BAND": str(c.up_band),
            "SLUICE_PLANNER__DECODE_FLOOR_MARGIN": str(c.decode_floor_margin or c.margin),
            "SLUICE_PLANNER__LOCAL_DIR": str(run_dir), "SLUICE_PLANNER__METRICS_PORT": "-1",
            "SLUICE_PLANNER__LOCK_TTL_S": str(max(3.0, c.step_s)),
            "SLUICE_PLANNER__WORKER_COMMAND": json.dumps([sys.executable, "-m", "sluice", "worker", "--log-level",
                                                          "warning"])}


async def decisions_of(redis: aioredis.Redis, keys: Keys) -> list:
    out = []
    for _id, fields in await redis.xrange(keys.planner_decisions) or []:
        out.append(decode_decision((fields or {})[b"d"]))
    return out


def run_one(c: Config, layout: str, fleet: str, schedule: Schedule | None, profile_path: Path, tokenizer_dir: Path,
            console: Console, kill_planner_at: int | None, steps: tuple[int, int] = (0, len(DAY))) -> dict:
    """One fleet through the day, or through its ``steps`` (first, end) alone; the figures of
    bench.planner_trace's docstring."""
    first, end = steps
    redis_server = RedisServer().start()
    ns = f"plan{uuid.uuid4().hex[:6]}"
    stack = Stack(redis_url=redis_server.url, namespace=ns, model_path=tokenizer_dir, env_extra=worker_env(c))
    run_dir = Path(tempfile.mkdtemp(prefix="sluice-planner-run-"))
    cleanup = FleetCleanup(run_dir)
    plan = day_slice(arrivals(DAY, c.base_rate, c.step_s, c.seed), first, end, c.step_s)
    record = RunRecord()
    keys = Keys(ns)
    notes: dict[str, Any] = {}
    try:
        stack.start_frontend()
        stack.procs["frontend"].wait_serving(f"{stack.base_url}/health", "frontend", 60)
        pools = [p.value for p in pools_of(layout)]

        async def main() -> None:
            redis = aioredis.from_url(redis_server.url)
            stop = asyncio.Event()
            sampler = asyncio.create_task(sample_fleet(redis, keys, record, stop))
            try:
                if fleet == "planner":
                    stack.processes.spawn("planner", [sys.executable, "-m", "sluice", "planner", "--log-level", "info"],
                                          stack.env(**planner_env(c, layout, profile_path, run_dir)))
                    await wait_fleet(redis, keys, {p.value: lowest(p, c.min_replicas, c.local_prefill)
                                                   for p in pools_of(layout)})
                    on_step = None
                    if kill_planner_at is not None:
                        async def on_step(i: int) -> None:
                            await planner_kill_and_restart(i, kill_planner_at, c, layout, profile_path, run_dir, stack,
                                                           redis, keys, notes)
                else:
                    assert schedule is not None
                    connector = LocalConnector(run_dir, with_parent_death_signal(
                        [sys.executable, "-m", "sluice", "worker", "--log-level", "warning"]), stack.env())

                    async def apply(i: int) -> None:
                        for pool in pools:
                            counts = schedule.replicas[pool]
                            # The oracle knows the next step: its workers start a step early.
                            ahead = max(counts[i], counts[i + 1] if i + 1 < len(counts) and fleet == "oracle" else 0)
                            ref = PoolRef(MODEL, Pool(pool))  # type: ignore[call-arg]  # a lookup by value
                            await connector.scale(ref, ahead, f"schedule step {i}")

                    await apply(first)
                    await wait_fleet(redis, keys, {p: schedule.replicas[p][first] for p in pools})
                    on_step = apply
                t0 = time.monotonic()
                if fleet == "planner":
                    notes["planner_cpu_s"] = -_cpu_s(stack.procs["planner"].popen.pid)
                await drive(stack.base_url, plan, record, on_step, c.step_s, first)
                t1 = time.monotonic()
                if fleet == "planner":
                    notes["planner_cpu_s"] += _cpu_s(stack.procs["planner"].popen.pid)
                    notes["planner_cpu_share"] = notes["planner_cpu_s"] / (t1 - t0)
                notes["duration_s"] = t1 - t0
                notes["worker_seconds"] = worker_seconds(record.samples, t0, min(t1, t0 + (end - first) * c.step_s))
                notes["cpu_by_step"] = cpu_by_step(record.cpu, t0, c.step_s, len(DAY), first, end)
                if fleet == "planner":
                    notes["decisions"] = await decisions_of(redis, keys)
            finally:
                stop.set()
                await sampler
                await redis.aclose()

        asyncio.run(main())
        return summarize(c, layout, fleet, record, notes, notes.get("planner_cpu_share"), schedule)
    finally:
        stack.stop()
        cleanup.stop()
        redis_server.stop()


async def planner_kill_and_restart(i: int, at: int, c: Config, layout: str, profile_path: Path, run_dir: Path,
                                   stack: Stack, redis: aioredis.Redis, keys: Keys, notes: dict) -> None:
    """At step ``at``: SIGKILL the planner (workers untouched); at ``at + 1``: start a new one."""
    if i == at:
        notes["fleet_before_kill"] = await _live(redis, keys)
        notes["planner_cpu_s"] += _cpu_s(stack.procs["planner"].popen.pid)
        stack.kill("planner", signal.SIGKILL, alone=True)
        notes["killed_at_tick"] = i
    elif i == at + 1:
        notes["fleet_while_dead"] = await _live(redis, keys)
        stack.processes.spawn("planner-2", [sys.executable, "-m", "sluice", "planner", "--log-level", "info"],
                              stack.env(**planner_env(c, layout, profile_path, run_dir)))
        stack.procs["planner"] = stack.procs["planner-2"]
        notes["restarted_at"] = time.time()


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (the planner's own cost)."""
    cpu = psutil.Process(pid).cpu_times()
    return float(cpu.user + cpu.system)


async def _live(redis: aioredis.Redis, keys: Keys) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in await Registry(redis, keys).live_workers(MODEL):
        counts[w.record.pool.value] = counts.get(w.record.pool.value, 0) + 1
    return counts


def summarize(c: Config, layout: str, fleet: str, record: RunRecord, notes: dict, planner_cpu: float | None,
              schedule: Schedule | None) -> dict:
    rows = record.rows
    ok = [r for r in rows if r["ok"]]
    ttfts = sorted(r["ttft_s"] for r in ok)
    itls = sorted(r["itl_s"] for r in ok if r["itl_s"] is not None)
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None  # noqa: E731
    out: dict[str, Any] = {
        "layout": layout, "fleet": fleet, "requests": len(rows), "errors": len(rows) - len(ok),
        "streams_lost": sum(1 for r in rows if r["lost"]),
        "error_kinds": sorted({(r["error"] or "")[:80] for r in rows if not r["ok"]}),
        "sla_attainment": attainment(rows, c.ttft_s, c.itl_s),
        "ttft_p50_s": q(ttfts, 0.5), "ttft_p90_s": q(ttfts, 0.9), "itl_p50_s": q(itls, 0.5), "itl_p90_s": q(itls, 0.9),
        "worker_seconds": notes.get("worker_seconds"), "duration_s": notes.get("duration_s"),
        "scheduled_worker_seconds": schedule.worker_seconds(c.step_s) if schedule else None,
        "planner_cpu_share": planner_cpu, "machine_cpu_by_step": notes.get("cpu_by_step"),
    }
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    out["attainment_by_step"] = [round(attainment(by_step[i], c.ttft_s, c.itl_s), 3) if i in by_step else None
                                 for i in range(len(DAY))]
    out["requests_by_step"] = [[r["step"], r["isl"], r["ok"], r["ttft_s"] and round(r["ttft_s"], 3),
                                r["itl_s"] and round(r["itl_s"], 4)] for r in rows]
    decisions = notes.get("decisions") or []
    # The causal fleet's actions are its schedule's steps, counted as a planner's (the oracle's are not: its
    # workers start a step early; the static fleets take none).
    if schedule is not None and fleet == "causal":
        scheduled = actions_of(schedule)
        out["scaling_actions"] = len(scheduled)
        out["flaps_steady"] = flaps(scheduled, 2, steady_intervals(DAY))
        out["schedule"] = schedule.replicas
    if decisions:
        times = action_times([(d.tick, d.kind, d.at) for d in decisions], c.step_s)
        actions = [(when, p.pool, p.action) for d, when in zip(decisions, times, strict=True) for p in d.pools
                   if p.action != "hold"]
        steady = steady_intervals(DAY)
        out["scaling_actions"] = len(actions)
        out["flaps_steady"] = flaps(actions, 2, steady)
        out["flaps_all"] = flaps(actions, 2, {math.ceil(t) for t, _, _ in actions})
        out["decisions"] = [
            {"tick": d.tick, "kind": d.kind, "at": d.at,
             "pools": {p.pool: [p.live, p.requested, p.target, p.action, p.reason, p.held] for p in d.pools},
             "predicted": [(m.predicted.rate, m.predicted.isl, m.predicted.osl) if m.predicted else None
                           for m in d.models],
             "corrections": [(m.prefill_correction, m.decode_correction) for m in d.models]}
            for d in decisions]
        if "restarted_at" in notes:
            after = [d for d in decisions if d.at >= notes["restarted_at"]]
            first_ticks = sorted({d.tick for d in after if d.kind == "interval"})[:2]
            until = first_ticks[-1] if first_ticks else float("inf")  # its second interval, fast ticks included
            out["restart"] = {
                "fleet_before_kill": notes.get("fleet_before_kill"), "fleet_while_dead": notes.get("fleet_while_dead"),
                "actions_in_first_two_intervals": sum(1 for d in after if d.tick <= until
                                                      for p in d.pools if p.action != "hold"),
            }
    return out


def report(console: Console, runs: list[dict], oracles: dict[str, Schedule], c: Config) -> dict[str, float]:
    table = Table(title=f"Planner on a compressed day ({len(DAY)} intervals of {c.step_s:g} s; targets TTFT "
                        f"{c.ttft_s} s, ITL {c.itl_s * 1000:.0f} ms)")
    for col in ("layout", "fleet", "requests", "errors", "lost", "SLA met", "TTFT p50", "TTFT p90", "ITL p50",
                "worker-s", "/ oracle", "/ peak", "actions", "flaps", "planner CPU"):
        table.add_column(col, justify="left" if col in ("layout", "fleet") else "right")
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    ratios: dict[str, float] = {}
    for r in runs:
        oracle_ws = oracles[r["layout"]].worker_seconds(c.step_s)
        peak = next((x for x in runs if x["layout"] == r["layout"] and x["fleet"] == "static-peak"), None)
        r["vs_oracle"] = r["worker_seconds"] / oracle_ws if r["worker_seconds"] else None
        r["vs_peak"] = r["worker_seconds"] / peak["worker_seconds"] if peak and r["worker_seconds"] else None
        table.add_row(r["layout"], r["fleet"], str(r["requests"]), str(r["errors"]), str(r["streams_lost"]),
                      f(r["sla_attainment"], ".1%"), f(r["ttft_p50_s"], ".2f"), f(r["ttft_p90_s"], ".2f"),
                      f(r["itl_p50_s"] and r["itl_p50_s"] * 1000, ".0f"), f(r["worker_seconds"], ".0f"),
                      f(r["vs_oracle"], ".2f"), f(r["vs_peak"], ".2f"), str(r.get("scaling_actions", "-")),
                      str(r.get("flaps_steady", "-")), f(r["planner_cpu_share"], ".2%"))
        if r["fleet"] == "planner":
            for key in ("sla_attainment", "vs_oracle", "vs_peak"):
                if r[key] is not None:
                    ratios[f"{r['layout']} planner {key}"] = r[key]
    console.print(table)
    for layout, sched in oracles.items():
        console.print(f"oracle {layout}: {sched.worker_seconds(c.step_s):.0f} worker-s offline, peak {sched.peak}, "
                      f"per step {sched.replicas}")
    return ratios


def dynamo_schedule(c: Config, profile: Profile, layout: str, console: Console) -> Schedule | None:
    """Dynamo 1.6.1's planner's decisions for the day (bench.planner_dynamo), as a schedule: what it decides
    at the end of a step serves the next one, as it would live. None where it cannot plan here."""
    from bench.planner_dynamo import PLANNER_VENV, Interval, dynamo_plan

    if layout != "disagg":
        console.print("[yellow]dynamo agg: not run; Dynamo 1.6.1's aggregated perf model is never ready on a "
                      "profile of prefill-only and decode-only points (bench/planner_dynamo.py)[/]")
        return None
    if not (PLANNER_VENV / "bin" / "python").exists():
        console.print("[yellow]dynamo: not run; no planner venv (python -m bench.planner_dynamo --install)[/]")
        return None
    trace = [Interval(duration_s=round(c.step_s), rate=c.base_rate * s.load, isl=s.isl, osl=s.osl) for s in DAY]
    out = dynamo_plan(trace, c.ttft_s, c.itl_s, profile, "disagg", min_replicas=c.min_replicas, max_workers=c.budget)
    return Schedule("dynamo-disagg", {pool: [max(c.min_replicas, i[pool]) for i in out["intervals"]]
                                      for pool in ("prefill", "decode")})


def causal_schedule(c: Config, sla: SlaPlanner, layout: str) -> Schedule:
    """The ``causal`` fleet: the day sized offline on each step's predecessor's realized arrivals (the
    same arrivals the run sends) with the planner's hysteresis, headroom and sure shrink."""
    d = PlannerSettings()
    rates = realized_rates(arrivals(DAY, c.base_rate, c.step_s, c.seed), len(DAY), c.step_s)
    return causal(DAY, rates, sla, layout, c.min_replicas, c.max_replicas, z=c.headroom_z, step_s=c.step_s,
                  down_after=d.down_after_intervals, cooldown=d.cooldown_intervals, sure_z=c.sure_shrink_z,
                  up_band=c.up_band)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", default="agg,disagg")
    p.add_argument("--fleets", default="planner,oracle,static-peak,static-mean,dynamo")
    p.add_argument("--step-s", type=float, default=10.0, help="real seconds per planner interval of the day")
    p.add_argument("--base-rate", type=float, default=0.6, help="requests per second at the night's load (1x)")
    p.add_argument("--ttft", type=float, default=1.5, help="TTFT target, seconds")
    p.add_argument("--itl", type=float, default=0.1, help="mean ITL target, seconds")
    p.add_argument("--speedup", type=float, default=0.25, help="the mocker's speed (its timing model / this)")
    p.add_argument("--kv-blocks", type=int, default=1200, help="each mocker worker's KV blocks")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=8)
    p.add_argument("--budget", type=int, default=12)
    p.add_argument("--utilization", type=float, default=0.7, help="the sla mode's highest prefill utilization")
    p.add_argument("--margin", type=float, default=0.8, help="the sla mode's share of the targets it aims at")
    p.add_argument("--kill-at", type=int, default=16, help="step at which the planner is killed (-1: never)")
    p.add_argument("--profile", type=Path, default=None, help="a profile to use instead of measuring one")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--correction", action="store_true", help="the planner with its latency correction (off by default)")
    p.add_argument("--headroom-z", type=float, default=PlannerSettings().rate_headroom_z,
                   help="the sla mode's rate headroom (SLUICE_PLANNER__RATE_HEADROOM_Z)")
    p.add_argument("--sure-shrink-z", type=float, default=PlannerSettings().sure_shrink_z,
                   help="the sla mode's sure shrink (SLUICE_PLANNER__SURE_SHRINK_Z; 0: off)")
    p.add_argument("--sure-rise-z", type=float, default=PlannerSettings().sure_rise_z,
                   help="the sla mode's sure rise (SLUICE_PLANNER__SURE_RISE_Z; 0: off)")
    p.add_argument("--floor-rise-z", type=float, default=PlannerSettings().floor_rise_z,
                   help="the sla mode's floor grows a pool only on a rise (SLUICE_PLANNER__FLOOR_RISE_Z; 0: always)")
    p.add_argument("--up-band", type=float, default=PlannerSettings().up_band,
                   help="the sla mode's up-band (SLUICE_PLANNER__UP_BAND; 0: grow on any excess)")
    p.add_argument("--decode-floor-margin", type=float, default=PlannerSettings().decode_floor_margin,
                   help="the share of the ITL target at which the floor takes the KV target of a decode pool "
                        "apart (SLUICE_PLANNER__DECODE_FLOOR_MARGIN)")
    p.add_argument("--local-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="disaggregated: the prefill pool may go to 0, the decode pool computing the prompts "
                        "(SLUICE_PLANNER__LOCAL_PREFILL; the oracle's model too)")
    p.add_argument("--steps", default=f"0:{len(DAY)}",
                   help="FIRST:END: replay the day's steps FIRST to END-1 alone (the same arrivals as in the whole day)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p


def config_of(args: argparse.Namespace) -> Config:
    return Config(args.step_s, args.base_rate, args.ttft, args.itl, args.speedup, args.kv_blocks, args.min_replicas,
                  args.max_replicas, args.budget, args.utilization, args.margin, args.seed, args.correction,
                  args.headroom_z, args.sure_shrink_z, args.sure_rise_z, args.floor_rise_z, args.local_prefill,
                  args.up_band, args.decode_floor_margin)


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    console = Console(width=180) if not Console().is_terminal else Console()
    c = config_of(args)
    tokenizer_dir = prepare_model(MODEL, Settings().models_dir, weights=False, progress=False)
    work = Path(tempfile.mkdtemp(prefix="sluice-planner-bench-"))
    profile_path = args.profile or work / "profile.json"
    profile = Profile.load(profile_path) if args.profile else measure_profile(c, tokenizer_dir, profile_path, console)
    sla = SlaPlanner(profile, c.ttft_s * c.margin, c.itl_s * c.margin, c.utilization, c.local_prefill)
    layouts = [x for x in args.layouts.split(",") if x]
    fleets = [x for x in args.fleets.split(",") if x]
    first, end = (int(x) for x in args.steps.split(":"))
    if not 0 <= first < end <= len(DAY):
        raise SystemExit(f"--steps {args.steps}: the day has steps 0 to {len(DAY) - 1}")
    oracles = {layout: oracle(DAY, c.base_rate, sla, layout, c.min_replicas, c.max_replicas) for layout in layouts}
    runs = []
    for layout in layouts:
        schedules: dict[str, Schedule | None] = {"planner": None, "oracle": oracles[layout],
                                                 "static-peak": static(oracles[layout], "peak"),
                                                 "static-mean": static(oracles[layout], "mean"),
                                                 "causal": causal_schedule(c, sla, layout)}
        if "dynamo" in fleets:
            schedules["dynamo"] = dynamo_schedule(c, profile, layout, console)
        for fleet in fleets:  # fixed sizes: static-7 (agg), static-2+5 (disagg)
            if (sizes := fixed_sizes(fleet, [p.value for p in pools_of(layout)])) is not None:
                schedules[fleet] = fixed(sizes, len(DAY))
        for fleet in fleets:
            if fleet not in schedules or (fleet != "planner" and schedules[fleet] is None):
                console.print(f"[yellow]{layout}/{fleet}: skipped (no schedule)[/]")
                continue
            console.print(f"[bold]{layout} / {fleet}[/] ...")
            kill = args.kill_at if fleet == "planner" and args.kill_at >= 0 else None
            runs.append(run_one(c, layout, fleet, schedules[fleet], profile_path, tokenizer_dir, console, kill,
                                (first, end)))
            r = runs[-1]
            console.print(f"  {r['requests']} requests, {r['errors']} errors, SLA {r['sla_attainment']:.1%}, "
                          f"{r['worker_seconds']:.0f} worker-s")
    ratios = report(console, runs, oracles, c)
    out = {"benchmark": "planner", "engine": "mocker", "host": platform.node(), "python": platform.python_version(),
           "config": vars(c), "day": [dataclasses.asdict(s) for s in DAY], "steps": [first, end],
           "profile": profile.model_dump(), "oracles": {k: v.replicas for k, v in oracles.items()},
           "runs": runs, "ratios": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    console.print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
