"""NVIDIA Dynamo 1.6.1's SLA planner on a load trace: its replica counts per pool per interval, as JSON.

    python -m bench.planner_dynamo --install          # once: the planner venv (below), ~3 min
    python -m bench.planner_dynamo --demo             # mocker profile, 20 intervals, 1 -> 8 -> 1 req/s
    python -m bench.planner_dynamo --trace T.json --profile P.json --ttft 1 --itl 0.05 --mode disagg

What runs is Dynamo's planner itself (bench/planner_dynamo_replay.py, a subprocess in a Dynamo venv,
JSON in and out; Sluice's venv never imports ``dynamo``): its offline replay adapter, i.e. its
orchestrator, load predictor and ``sla`` throughput scaling with its perf model, ticked once per
interval. Dynamo's planner acts on the interval that just ended: the counts it decides at the end of
interval ``i - 1`` serve interval ``i``; interval 0 runs with ``initial``.

Sluice's profile, translated for Dynamo. Dynamo 1.6.1 reads pre-deployment profiling from
``profile_results_dir`` (``dynamo.planner.monitoring.perf_metrics``; npz or JSON, same keys):

* ``prefill_raw_data.json``: ``prefill_isl`` [tokens] and ``prefill_ttft`` [ms], one prompt on an
  idle engine. Written from Sluice's prefill table as is: ``isl``, ``ttft_s * 1000``.
* ``decode_raw_data.json``: ``x_kv_usage``, ``y_context_length``, ``z_itl`` [ms] and
  ``max_kv_tokens``. Written per Sluice decode point ``(batch, context, itl_s)`` within the KV
  (``batch * context <= kv_tokens``): ``x = batch * context / kv_tokens``, ``y = context``,
  ``z = itl_s * 1000``, ``max_kv_tokens = kv_tokens``. Dynamo's reader turns each point back into one
  forward pass of ``sum_decode_kv_tokens = round(x * max_kv_tokens) = batch * context`` over
  ``num_decode_requests = round(sum / y) = batch`` that took ``z`` (exact but for rounding).

Dynamo turns these into synthetic forward-pass metrics and fits its FPM regression to them:
``wall = a + b * prefill_tokens`` per prefill pass and ``wall = a + b * requests + c * kv_tokens``
per decode pass (aggregated: one fit on ``[prefill_tokens, kv_tokens]`` over both sets); its capacity
search then batches prompts up to ``max_num_batched_tokens`` and decode streams up to ``max_num_seqs``
and the KV. So Dynamo sees Sluice's tables through a linear fit, not the tables themselves.

Limits, from Dynamo: no per-pool ceiling; ``max_workers`` (all pools together) is its
``max_gpu_budget`` at one GPU a worker; ``min_replicas`` is its ``min_endpoint`` (every pool);
one decision moves a pool by at most ``max_step`` (its ``max_throughput_scaling_replicas``); ISL
and OSL are per-interval means and TTFT/ITL targets are its ``ttft_ms``/``itl_ms``. No online
correction runs: 1.6.1 has no observed-over-expected latency factor; it tunes its regression with
live forward-pass metrics from the engines, which a trace of interval means does not have.

The Dynamo venv (``--install``): the anchor's venv (``shared/anchors/dynamo/dynamo.sh install``)
lacks what ``dynamo.planner`` imports but ai-dynamo does not declare (scikit-learn, plotly,
pmdarima, prophet, filterpy, prometheus-api-client, grpcio) and ``aisimulate``, which cannot be
installed here (an sdist stub that downloads its wheel from NVIDIA's own index); so a second venv
sees the anchor's packages through a ``.pth`` file and adds those plus ``aiconfigurator-core==0.12.0``,
whose forward-pass regression stands in for aisimulate's (see bench/planner_dynamo_replay.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from planner.profile import DecodePoint, PrefillPoint, Profile
from workers.engines.mocker.timing import decode_ms, prefill_ms

REPLAY = Path(__file__).with_name("planner_dynamo_replay.py")
ANCHOR_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "sluice-anchor-dynamo"
PLANNER_VENV = ANCHOR_DIR / "planner"
PLANNER_PACKAGES = [
    "scikit-learn", "plotly", "pmdarima", "prophet", "filterpy", "prometheus-api-client", "grpcio",
    "aiconfigurator-core==0.12.0",
]

Mode = Literal["disagg", "agg"]


class Interval(BaseModel):
    """One interval of load: ``rate`` requests a second of ``isl`` prompt and ``osl`` output tokens (means)."""

    duration_s: int = Field(gt=0)
    rate: float = Field(ge=0)
    isl: float = Field(ge=0)
    osl: float = Field(ge=0)


class Engine(BaseModel):
    """What Dynamo's capacity search needs of one worker beyond the profile."""

    max_num_batched_tokens: int = 8192
    block_size: int = 16


def write_dynamo_profile(profile: Profile, directory: Path) -> None:
    """Sluice's profile as Dynamo's ``profile_results_dir`` JSON files (see the module docstring)."""
    directory.mkdir(parents=True, exist_ok=True)
    prefill = sorted(profile.prefill, key=lambda p: p.isl)
    (directory / "prefill_raw_data.json").write_text(json.dumps({
        "prefill_isl": [p.isl for p in prefill],
        "prefill_ttft": [p.ttft_s * 1000.0 for p in prefill],
    }))
    decode = [p for p in profile.decode if p.batch * p.context <= profile.kv_tokens]
    (directory / "decode_raw_data.json").write_text(json.dumps({
        "x_kv_usage": [p.batch * p.context / profile.kv_tokens for p in decode],
        "y_context_length": [p.context for p in decode],
        "z_itl": [p.itl_s * 1000.0 for p in decode],
        "max_kv_tokens": profile.kv_tokens,
    }))


def mocker_profile(kv_blocks: int = 16384, block_size: int = 16, max_num_seqs: int = 256,
                   max_num_batched_tokens: int = 8192) -> Profile:
    """One mocker worker's profile from its published timing model (workers.engines.mocker.timing).

    Prefill: one prompt alone, chunked at ``max_num_batched_tokens``, ``ttft = sum(prefill_ms(chunk))``.
    Decode: ``itl = decode_ms(u)``, ``u = batch * ceil(context / block_size) / kv_blocks`` (KV usage).
    """
    def ttft_s(isl: int) -> float:
        full, tail = divmod(isl, max_num_batched_tokens)
        return (full * prefill_ms(max_num_batched_tokens) + prefill_ms(tail)) / 1000.0

    kv_tokens = kv_blocks * block_size
    prefill = [PrefillPoint(isl=isl, ttft_s=ttft_s(isl)) for isl in (128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    decode = [
        DecodePoint(batch=b, context=c, itl_s=decode_ms(b * math.ceil(c / block_size) / kv_blocks) / 1000.0)
        for c in (256, 1024, 2048, 4096, 8192, 16384)
        for b in (1, 8, 32, 64, 128, 256)
        if b <= max_num_seqs and b * c <= kv_tokens
    ]
    return Profile(engine="mocker", model="mocker", hardware="Dynamo's published mocker timing model",
                   kv_tokens=kv_tokens, max_num_seqs=max_num_seqs, prefill=prefill, decode=decode)


def dynamo_plan(trace: list[Interval], ttft_s: float, itl_s: float, profile: Profile, mode: Mode = "disagg",
                min_replicas: int = 1, max_workers: int = -1, initial: dict[str, int] | None = None,
                max_step: int = 8, load_predictor: str = "arima", engine: Engine | None = None,
                python: Path = PLANNER_VENV / "bin" / "python") -> dict[str, Any]:
    """Dynamo's decisions on ``trace``: ``{"intervals": [{"prefill", "decode", ...} per interval], ...}``.

    Each interval also says what decided it (Dynamo's predicted rate, one engine's sustainable
    req/s per pool, its reason); ``model_not_ready_at_s`` lists the ticks where Dynamo's perf model
    could not size the pools and it held them (every tick in aggregated mode: see the report).

    Every interval must last the same whole number of seconds: Dynamo's throughput cadence is one
    integer interval. ``prefill`` is 0 in aggregated mode (``decode`` counts the aggregated workers).
    """
    durations = {it.duration_s for it in trace}
    if len(durations) != 1:
        raise ValueError(f"Dynamo's planner ticks at one fixed interval; the trace has {sorted(durations)}")
    engine = engine or Engine()
    initial = initial or {"prefill": min_replicas if mode == "disagg" else 0, "decode": min_replicas}
    with tempfile.TemporaryDirectory(prefix="sluice-dynamo-planner-") as tmp:
        write_dynamo_profile(profile, Path(tmp))
        request = {
            "mode": mode, "ttft_ms": ttft_s * 1000.0, "itl_ms": itl_s * 1000.0, "interval_s": durations.pop(),
            "trace": [it.model_dump() for it in trace], "profile_dir": tmp, "initial": initial,
            "min_endpoint": min_replicas, "max_gpu_budget": max_workers, "max_step": max_step,
            "load_predictor": load_predictor,
            "capabilities": {"max_num_batched_tokens": engine.max_num_batched_tokens,
                             "max_num_seqs": profile.max_num_seqs, "max_kv_tokens": profile.kv_tokens,
                             "block_size": engine.block_size},
        }
        done = subprocess.run([str(python), str(REPLAY)], input=json.dumps(request), capture_output=True,
                              text=True, env={**os.environ, "DYN_LOG": os.environ.get("DYN_LOG", "warn")})
    if done.returncode != 0:
        raise RuntimeError(f"Dynamo's planner failed ({done.returncode}):\n{done.stderr[-4000:]}")
    reply = json.loads(done.stdout)
    by_end = {round(t["at_s"]): t for t in reply["ticks"]}
    counts, end = dict(initial), 0
    decided_by: dict[str, Any] | None = None
    intervals: list[dict[str, Any]] = []
    for it in trace:
        intervals.append({"start_s": end, **counts, "rate": it.rate, "isl": it.isl, "osl": it.osl,
                          "decided_by": decided_by})
        end += it.duration_s
        tick = by_end.get(end)
        if tick is not None:
            counts = tick["after"]
            predicted = tick["predicted"]["num_req"]
            decided_by = {"predicted_rate": None if predicted is None else predicted / it.duration_s,
                          "engine_rps": tick["engine_rps"], "reason": tick["reason"]["all"]}
    not_ready = [t["at_s"] for t in reply["ticks"] if t["reason"]["all"] == "model_not_ready"]
    return {"mode": mode, "ttft_s": ttft_s, "itl_s": itl_s, "load_predictor": load_predictor,
            "intervals": intervals, "model_not_ready_at_s": not_ready, "ticks": reply["ticks"],
            "bootstrap": reply["bootstrap"]}


def demo_trace(peak: float = 8.0, scale: float = 1.0) -> list[Interval]:
    """20 one-minute intervals, ``1 -> peak`` req/s and back (times ``scale``), ISL 2000, OSL 200."""
    up = [1 + (peak - 1) * i / 7 for i in range(8)]
    rates = up + [peak] * 3 + up[::-1][1:] + [1.0] * 2
    return [Interval(duration_s=60, rate=round(r * scale, 3), isl=2000, osl=200) for r in rates[:20]]


def install(venv: Path = PLANNER_VENV) -> None:
    """The planner venv: the anchor's packages (through a .pth file) plus what the planner lacks."""
    anchor = ANCHOR_DIR / "dyn"
    site = next((anchor / "lib").glob("python3*/site-packages"), None)
    if site is None:
        raise SystemExit(f"no Dynamo anchor venv at {anchor}: run shared/anchors/dynamo/dynamo.sh install")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    own = next((venv / "lib").glob("python3*/site-packages"))
    (own / "sluice-dynamo-anchor.pth").write_text(f"{site}\n")
    subprocess.run([str(venv / "bin" / "pip"), "-q", "install", *PLANNER_PACKAGES], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--install", action="store_true", help=f"build the planner venv at {PLANNER_VENV}")
    ap.add_argument("--demo", action="store_true", help="the mocker profile on demo_trace()")
    ap.add_argument("--scale", type=float, default=1.0, help="--demo: multiply the demo's rates")
    ap.add_argument("--trace", type=Path, help="JSON list of {duration_s, rate, isl, osl}")
    ap.add_argument("--profile", type=Path, help="Sluice profile JSON (planner.profile.Profile)")
    ap.add_argument("--ttft", type=float, default=1.0, help="TTFT target, s")
    ap.add_argument("--itl", type=float, default=0.05, help="ITL target, s")
    ap.add_argument("--mode", choices=["disagg", "agg"], default="disagg")
    ap.add_argument("--min-replicas", type=int, default=1, help="every pool's floor (Dynamo's min_endpoint)")
    ap.add_argument("--max-workers", type=int, default=-1, help="all pools together (max_gpu_budget); -1: none")
    ap.add_argument("--predictor", default="arima", choices=["constant", "arima", "kalman", "prophet"])
    ap.add_argument("--python", type=Path, default=PLANNER_VENV / "bin" / "python", help="the planner venv's")
    ap.add_argument("--ticks", action="store_true", help="also print Dynamo's raw ticks")
    args = ap.parse_args()
    if args.install:
        install()
        return
    if args.demo:
        trace, profile = demo_trace(scale=args.scale), mocker_profile()
    elif args.trace and args.profile:
        trace = [Interval.model_validate(it) for it in json.loads(args.trace.read_text())]
        profile = Profile.load(args.profile)
    else:
        ap.error("--demo, or --trace with --profile")
    plan = dynamo_plan(trace, args.ttft, args.itl, profile, args.mode, args.min_replicas, args.max_workers,
                       load_predictor=args.predictor, python=args.python)
    if not args.ticks:
        plan.pop("ticks")
    print(json.dumps(plan, indent=1))


if __name__ == "__main__":
    main()
