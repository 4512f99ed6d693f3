"""KV tiers benchmark, the vLLM part: `make bench-kvbm` (or `.venv-vllm/bin/python -m bench.kvbm_vllm_bench`).

The real stack (a frontend and vLLM workers on SmolLM2, on this machine's CPU) with a KV cache far smaller
than the conversations it serves, so a conversation that comes back has been evicted:

* **multi-turn**, one worker, tiers off / host / host+disk / host+disk+shared: ``--conversations``
  conversations of ``--turns`` turns, taken round-robin (each turn of every conversation, then the next),
  two at a time; each turn is the whole history so far plus a new question, as token ids on
  ``/v1/completions``. Per config: TTFT mean and p90 over all turns and over the return turns, the share of
  prompt tokens cached or onboarded (``usage.prompt_tokens_details.cached_tokens``), ITL p50, output
  tokens per second, errors.
* **offload's cost to decoding**: ``--itl-pairs`` pairs of fresh workers, tiers off and every tier on,
  alternating; the steady-decode ITL p50 of each (two streams decoding alone), the ratio per pair, their
  mean and its 95% interval.
* **the shared tier stopped mid-run**: the host+disk+shared config again with its Redis stopped after the
  first round of turns: every request must still succeed.
* **cross-worker**: two workers; a conversation's first turn pinned to the first worker, which is then
  drained (SIGTERM) so the next turn lands on the second: TTFT of that turn onboarded from the shared
  tier against recomputed (the same steps without the shared tier).
* **restart**: a known ``--restart-tokens`` prompt on a worker with a disk tier; the worker is killed
  (SIGKILL) and a new one started on the same directory: its TTFT for the prompt against the cold one.

Prints a table and the ratios the issue sets targets for; writes bench/results/kvbm_vllm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from rich.console import Console
from rich.table import Table
from scipy.stats import t as student_t

from bench.devstack import RedisServer, Stack, free_port, wait_until
from bench.reliability.stack import counter
from bench.sse_trace import Trace, stream_trace
from bench.stats import pct
from core.settings import Settings
from workers.models.prepare import prepare_model

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2"
START_TIMEOUT_S = 300
#: How long after a round the worker's tier metrics have caught up (the engine asks for a report each second).
TIER_REPORT_WAIT_S = 2.5
#: Tokens drawn for prompts: ordinary ids of SmolLM2's vocabulary (no special tokens).
VOCAB = (1000, 48_000)
CONFIGS = ("off", "host", "host+disk", "host+disk+shared")


def _tier_env(config: str, disk: Path, shared_url: str | None, args: argparse.Namespace) -> dict[str, str]:
    env: dict[str, str] = {}
    if "host" in config:
        env["SLUICE_KVBM__HOST_BYTES"] = str(int(args.host_gib * (1 << 30)))
    if "disk" in config:
        env |= {"SLUICE_KVBM__DISK_DIR": str(disk), "SLUICE_KVBM__DISK_BYTES": str(int(args.disk_gib * (1 << 30)))}
    if "shared" in config and shared_url is not None:
        env["SLUICE_KVBM__REDIS_URL"] = shared_url
    return env


@contextmanager
def _stack(model_dir: Path, args: argparse.Namespace, tier_env: dict[str, str], omp_threads: int) -> Iterator[Stack]:
    redis = RedisServer().start()
    stack = Stack(redis_url=redis.url, namespace=f"kvbm{uuid.uuid4().hex[:6]}", model_path=model_dir, env_extra={
        "SLUICE_ENGINE": "vllm", "SLUICE_WORKER__VLLM__KV_CACHE_GIB": str(args.kv_cache_gib),
        "SLUICE_WORKER__VLLM__MAX_MODEL_LEN": str(args.max_model_len),
        "SLUICE_WORKER__VLLM__MAX_NUM_SEQS": "8", "SLUICE_WORKER__VLLM__OMP_THREADS": str(omp_threads),
        "SLUICE_WORKER__DRAIN_TIMEOUT_S": "5", **tier_env})
    try:
        stack.start_frontend()
        yield stack
    finally:
        stack.stop()
        redis.stop()


@contextmanager
def _one_worker(model_dir: Path, args: argparse.Namespace, config: str, tmp: Path,
                metrics_port: int | None = None) -> Iterator[tuple[Stack, RedisServer | None]]:
    """A stack with one ready worker whose tiers are ``config``'s (a fresh disk directory, and a shared
    tier's own Redis where the config has one), and that Redis; the worker serves its metrics on
    ``metrics_port`` (None: its settings' default)."""
    shared = RedisServer().start() if "shared" in config else None
    disk = tmp / f"disk-{uuid.uuid4().hex[:6]}"
    try:
        with _stack(model_dir, args, _tier_env(config, disk, shared.url if shared else None, args),
                    args.omp_threads) as stack:
            port = {} if metrics_port is None else {"SLUICE_WORKER__METRICS_PORT": str(metrics_port)}
            stack.start_worker("w1", **port)
            stack.wait_ready(MODEL, 1, timeout=START_TIMEOUT_S)
            yield stack, shared
    finally:
        if shared is not None:
            shared.stop()


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


async def _turn(session: aiohttp.ClientSession, stack: Stack, prompt: list[int], max_tokens: int,
                worker: str | None = None) -> Trace:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"x-sluice-router": f"worker_id={worker}"} if worker else None
    return await stream_trace(session, f"{stack.base_url}/v1/completions", body, headers)


async def _multi_turn(stack: Stack, args: argparse.Namespace, seed: int,
                      after_first_round: asyncio.Event | None = None) -> list[dict]:
    """The conversations, round-robin over turns, two at a time; one row per turn."""
    rng = random.Random(seed)
    histories = [_tokens(rng, rng.randrange(*args.first_tokens)) for _ in range(args.conversations)]
    rows: list[dict] = []
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for k in range(args.turns):
            queue = list(range(args.conversations))

            async def lane(k: int = k, queue: list[int] = queue) -> None:
                while queue:
                    c = queue.pop(0)
                    if k:
                        histories[c].extend(_tokens(rng, args.question_tokens))
                    trace = await _turn(session, stack, list(histories[c]), args.output_tokens)
                    rows.append({"conversation": c, "turn": k, "prompt_tokens": len(histories[c]), "ok": trace.ok,
                                 "error": trace.error, "ttft_s": trace.ttft_s, "cached_tokens": trace.cached_tokens or 0,
                                 "itl_s": _itl(trace), "tokens": trace.completion_tokens or len(trace.token_times),
                                 "total_s": trace.total_s})
                    histories[c].extend(_tokens(rng, args.output_tokens))  # the reply joins the history

            await asyncio.gather(lane(), lane())
            if k == 0 and after_first_round is not None:
                after_first_round.set()
    return rows


async def _steady_decode(stack: Stack, args: argparse.Namespace, rounds: int | None = None) -> float:
    """ITL p50 of decoding alone (no prefill beside it): two streams of short fresh prompts and long outputs,
    whose blocks are offloaded as they fill (with tiers on)."""
    rng = random.Random(args.seed + 3)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        gaps: list[float] = []
        for _ in range(args.steady_rounds if rounds is None else rounds):
            traces = await asyncio.gather(*(_turn(session, stack, _tokens(rng, 64), args.steady_tokens) for _ in range(2)))
            for t in traces:
                times = t.token_times[4:]  # past the second stream's prefill, which may share the first steps
                gaps.extend((b - a) * 1000 for a, b in zip(times, times[1:], strict=False))
    return float(np.median(gaps)) if gaps else float("nan")


def _itl(trace: Trace) -> float | None:
    times = trace.token_times
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def _summary(config: str, rows: list[dict], wall_s: float) -> dict:
    ok = [r for r in rows if r["ok"]]
    ttft = [r["ttft_s"] * 1000 for r in ok]
    back = [r["ttft_s"] * 1000 for r in ok if r["turn"] > 0]
    itl = [r["itl_s"] * 1000 for r in ok if r["itl_s"] is not None]
    return {"config": config, "requests": len(rows), "errors": len(rows) - len(ok),
            "first_error": next((r["error"] for r in rows if not r["ok"]), None),
            "ttft_mean_ms": float(np.mean(ttft)) if ttft else None, "ttft_p90_ms": pct(ttft, 90),
            "return_ttft_mean_ms": float(np.mean(back)) if back else None, "return_ttft_p90_ms": pct(back, 90),
            "cached_share": sum(r["cached_tokens"] for r in ok) / max(1, sum(r["prompt_tokens"] for r in ok)),
            "itl_p50_ms": pct(itl, 50), "output_tokens_per_s": sum(r["tokens"] for r in ok) / wall_s,
            "wall_s": wall_s, "turns": rows}


def _run_config(model_dir: Path, args: argparse.Namespace, config: str, tmp: Path, console: Console,
                stop_shared_mid_run: bool = False) -> dict:
    with _one_worker(model_dir, args, config, tmp) as (stack, shared):

        async def run() -> tuple[list[dict], float]:
            first_round = asyncio.Event()
            stopper = None
            if stop_shared_mid_run and shared is not None:
                async def stop() -> None:
                    await first_round.wait()
                    await asyncio.to_thread(shared.stop)
                stopper = asyncio.get_running_loop().create_task(stop())
            t0 = time.perf_counter()
            rows = await _multi_turn(stack, args, args.seed, first_round)
            if stopper is not None:
                await stopper
            return rows, time.perf_counter() - t0

        rows, wall = asyncio.run(run())
        steady = asyncio.run(_steady_decode(stack, args))
    name = f"{config}, shared tier stopped mid-run" if stop_shared_mid_run else config
    out = _summary(name, rows, wall) | {"steady_itl_p50_ms": steady}
    console.print(f"{name:40s} TTFT mean {out['ttft_mean_ms']:.0f} ms, return turns {out['return_ttft_mean_ms']:.0f} ms, "
                  f"cached {out['cached_share']:.2f}, ITL p50 {out['itl_p50_ms']:.1f} ms (decode alone {steady:.1f}), "
                  f"{out['output_tokens_per_s']:.1f} tok/s, errors {out['errors']}")
    return out


def _decode_itl_pairs(model_dir: Path, args: argparse.Namespace, tmp: Path, console: Console) -> dict[str, Any]:
    """Offload's cost to decoding, paired: ``--itl-pairs`` pairs of fresh workers, one with tiers off and one
    with every tier on (the order alternating, ABBA, so the machine's drift cancels), each measuring the
    steady-decode ITL p50 after a warm-up round. Engines started at different times differ by more than the
    5% the issue allows (44-56 ms for tiers off on one night), so one run per config cannot show it; the
    pairs' ratios, their mean and its 95% interval (Student's t) can, and the tiered worker's own counts of
    the tiers' time in its steps and of the offload thread's CPU (docs/kvbm.md) bound it directly."""
    tiered = "host+disk+shared"
    pairs: list[dict[str, float]] = []
    shares: list[dict[str, float]] = []  # the tiered workers' connector time and offload CPU over decode time
    for i in range(args.itl_pairs):
        order = ("off", tiered) if i % 2 == 0 else (tiered, "off")
        pair: dict[str, float] = {}
        for config in order:
            port = free_port() if config == tiered else None
            with _one_worker(model_dir, args, config, tmp, metrics_port=port) as (stack, _shared):
                asyncio.run(_steady_decode(stack, args, rounds=1))  # warm-up
                before, t0 = (_tier_cost_s(port) if port is not None else {}), time.perf_counter()
                pair[config] = asyncio.run(_steady_decode(stack, args))
                wall = time.perf_counter() - t0
                if port is not None:
                    time.sleep(TIER_REPORT_WAIT_S)  # the worker's tier metrics are a report of up to a second ago
                    cost = {k: v - before[k] for k, v in _tier_cost_s(port).items()}
                    shares.append({k: v / wall for k, v in cost.items()})
        pairs.append(pair)
        console.print(f"decode ITL pair {i + 1}: off {pair['off']:.1f} ms, {tiered} {pair[tiered]:.1f} ms "
                      f"({pair[tiered] / pair['off']:.3f}x); the tiers' time in the steps "
                      f"{shares[-1]['step'] * 100:.2f}% of the decode, the offload thread's CPU "
                      f"{shares[-1]['offload_cpu'] * 100:.2f}%")
    ratios = [p[tiered] / p["off"] for p in pairs]
    mean = float(np.mean(ratios))
    half = (float(student_t.ppf(0.975, len(ratios) - 1) * np.std(ratios, ddof=1) / np.sqrt(len(ratios)))
            if len(ratios) > 1 else float("nan"))
    return {"config": tiered, "pairs": pairs, "ratios": ratios, "ratio_mean": mean, "ratio_ci95": [mean - half, mean + half],
            "cost_shares": shares,
            "cost_share_mean": {k: float(np.mean([x[k] for x in shares])) for k in ("step", "offload_cpu")}}


def _tier_cost_s(port: int) -> dict[str, float]:
    """The worker's KV tier cost counters (workers.kvbm.metrics): seconds in the engine's steps and CPU
    seconds of the offload thread."""
    url = f"http://127.0.0.1:{port}"
    return {"step": counter(url, "sluice_worker_kv_tier_step_seconds_total"),
            "offload_cpu": counter(url, "sluice_worker_kv_tier_offload_cpu_seconds_total")}


def _cross_worker(model_dir: Path, args: argparse.Namespace, tmp: Path, console: Console) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rng = random.Random(args.seed + 1)
    history = _tokens(rng, args.restart_tokens)
    question = _tokens(rng, args.question_tokens)
    for name in ("recompute", "shared tier"):
        shared = RedisServer().start() if name == "shared tier" else None
        env = {"SLUICE_KVBM__HOST_BYTES": str(int(args.host_gib * (1 << 30)))}
        if shared is not None:
            env["SLUICE_KVBM__REDIS_URL"] = shared.url
        try:
            with _stack(model_dir, args, env, max(1, args.omp_threads // 2)) as stack:
                stack.start_worker("w1")
                stack.start_worker("w2")
                stack.wait_ready(MODEL, 2, timeout=START_TIMEOUT_S)

                async def run(stack: Stack = stack) -> tuple[Trace, Trace]:
                    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
                        first = await _turn(session, stack, history, args.output_tokens, worker="w1")
                        await asyncio.sleep(2.0)  # the offload of the history's blocks completes
                        stack.signal("w1", signal.SIGTERM)  # drained: the next turn goes elsewhere
                        await asyncio.to_thread(stack.procs["w1"].popen.wait, 120)
                        second = await _turn(session, stack, [*history, *question], args.output_tokens)
                        return first, second

                first, second = asyncio.run(run())
        finally:
            if shared is not None:
                shared.stop()
        out[name] = {"first_ttft_ms": (first.ttft_s or 0) * 1000, "ttft_ms": (second.ttft_s or 0) * 1000,
                     "cached_tokens": second.cached_tokens, "worker": second.worker, "ok": first.ok and second.ok,
                     "error": first.error or second.error}
        console.print(f"cross-worker, {name}: next turn on {second.worker}: TTFT {out[name]['ttft_ms']:.0f} ms, "
                      f"cached {second.cached_tokens}")
    out["ratio"] = out["shared tier"]["ttft_ms"] / out["recompute"]["ttft_ms"]
    return out


def _restart(model_dir: Path, args: argparse.Namespace, tmp: Path, console: Console) -> dict[str, Any]:
    disk = tmp / "restart-disk"
    prompt = _tokens(random.Random(args.seed + 2), args.restart_tokens)
    env = {"SLUICE_KVBM__DISK_DIR": str(disk), "SLUICE_KVBM__DISK_BYTES": str(int(args.disk_gib * (1 << 30)))}
    with _stack(model_dir, args, env, args.omp_threads) as stack:
        async def once() -> Trace:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
                return await _turn(session, stack, prompt, args.output_tokens)

        stack.start_worker("w1")
        stack.wait_ready(MODEL, 1, timeout=START_TIMEOUT_S)
        cold = asyncio.run(once())
        time.sleep(3.0)  # the offload to disk completes
        stack.kill("w1")
        stack.procs.pop("w1")  # gone for good: the stack's readiness check must not count it
        # Its registration outlives it by a lease: wait for it to go, so the prompt reaches the new worker.
        wait_until(lambda: stack.ready_workers().get(MODEL, 0) == 0, 60, "the killed worker's lease to end")
        stack.start_worker("w2")
        stack.wait_ready(MODEL, 1, timeout=START_TIMEOUT_S)
        warm = asyncio.run(once())
    out: dict[str, Any] = {"cold_ttft_ms": (cold.ttft_s or 0) * 1000, "restarted_ttft_ms": (warm.ttft_s or 0) * 1000,
           "cached_tokens": warm.cached_tokens, "prompt_tokens": len(prompt), "ok": cold.ok and warm.ok,
           "error": cold.error or warm.error}
    out["ratio"] = out["restarted_ttft_ms"] / out["cold_ttft_ms"] if out["cold_ttft_ms"] else None
    console.print(f"restart: {len(prompt)}-token prompt, cold {out['cold_ttft_ms']:.0f} ms, after a restart "
                  f"{out['restarted_ttft_ms']:.0f} ms from disk (cached {warm.cached_tokens})")
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--first-tokens", type=int, nargs=2, default=[1500, 2500])
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=24)
    ap.add_argument("--kv-cache-gib", type=float, default=0.2,
                    help="the engine's KV cache (fp32 SmolLM2: 46 KB a token, so 0.2 GiB holds 4,608 tokens)")
    ap.add_argument("--max-model-len", type=int, default=4608, help="what a KV cache that small can serve")
    ap.add_argument("--host-gib", type=float, default=1.0)
    ap.add_argument("--disk-gib", type=float, default=2.0)
    ap.add_argument("--restart-tokens", type=int, default=4000)
    ap.add_argument("--omp-threads", type=int, default=2)
    ap.add_argument("--steady-tokens", type=int, default=160, help="output of each steady-decode stream")
    ap.add_argument("--steady-rounds", type=int, default=3)
    ap.add_argument("--itl-pairs", type=int, default=4, help="pairs of fresh workers (tiers off, all tiers) for "
                    "offload's cost to decoding; 0 skips")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip", nargs="*", default=[], choices=["stopped", "cross-worker", "restart", "multi-turn"])
    ap.add_argument("--out", type=Path, default=RESULTS / "kvbm_vllm.json")
    return ap


def _report(console: Console, runs: list[dict], cases: dict) -> dict[str, float | None]:
    table = Table(title="KV tiers on vLLM (SmolLM2, CPU), one worker; TTFT in ms")
    for col in ("config", "requests", "errors", "TTFT mean", "TTFT p90", "return TTFT mean", "return p90",
                "cached share", "ITL p50", "decode ITL p50", "out tok/s"):
        table.add_column(col, justify="left" if col == "config" else "right")
    f = lambda v, spec=".0f": "-" if v is None else format(v, spec)  # noqa: E731
    for r in runs:
        table.add_row(r["config"], str(r["requests"]), str(r["errors"]), f(r["ttft_mean_ms"]), f(r["ttft_p90_ms"]),
                      f(r["return_ttft_mean_ms"]), f(r["return_ttft_p90_ms"]), f(r["cached_share"], ".2f"),
                      f(r["itl_p50_ms"], ".1f"), f(r["steady_itl_p50_ms"], ".1f"), f(r["output_tokens_per_s"], ".1f"))
    if runs:
        console.print(table)
    by = {r["config"]: r for r in runs}
    ratios: dict[str, float | None] = {}
    off = by.get("off")
    for r in runs:
        if off and r is not off and off["return_ttft_mean_ms"] and r["return_ttft_mean_ms"] is not None:
            ratios[f"{r['config']} / off return-turn TTFT mean (target <= 0.4)"] = r["return_ttft_mean_ms"] / off["return_ttft_mean_ms"]
        if off and r is not off and off["steady_itl_p50_ms"] and r["steady_itl_p50_ms"] is not None:
            ratios[f"{r['config']} / off steady decode ITL p50 (one run each)"] = \
                r["steady_itl_p50_ms"] / off["steady_itl_p50_ms"]
    if "decode_itl" in cases:
        itl = cases["decode_itl"]
        ratios[f"{itl['config']} / off decode ITL p50, mean of {len(itl['ratios'])} pairs (target <= 1.05)"] = itl["ratio_mean"]
        ratios["  its 95% interval's upper end"] = itl["ratio_ci95"][1]
        ratios["  the tiers' time in the engine's steps, share of decode time"] = itl["cost_share_mean"]["step"]
        ratios["  the offload thread's CPU, share of decode time"] = itl["cost_share_mean"]["offload_cpu"]
    if "cross_worker" in cases:
        ratios["cross-worker shared tier / recompute TTFT (target <= 0.3)"] = cases["cross_worker"]["ratio"]
    if "restart" in cases:
        ratios["restarted from disk / cold TTFT (target <= 0.3)"] = cases["restart"]["ratio"]
    for name, value in ratios.items():
        console.print(f"{name}: {'-' if value is None else f'{value:.3g}'}")
    return ratios


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    console = Console(width=160) if not Console().is_terminal else Console()
    model_dir = prepare_model(MODEL, Settings().models_dir, weights=True)
    runs: list[dict] = []
    cases: dict = {}
    with tempfile.TemporaryDirectory(prefix="sluice-kvbm-vllm-") as tmp_name:
        tmp = Path(tmp_name)
        if "multi-turn" not in args.skip:
            for config in args.configs:
                runs.append(_run_config(model_dir, args, config, tmp, console))
        if args.itl_pairs > 0:
            cases["decode_itl"] = _decode_itl_pairs(model_dir, args, tmp, console)
        if "stopped" not in args.skip:
            runs.append(_run_config(model_dir, args, "host+disk+shared", tmp, console, stop_shared_mid_run=True))
        if "cross-worker" not in args.skip:
            cases["cross_worker"] = _cross_worker(model_dir, args, tmp, console)
        if "restart" not in args.skip:
            cases["restart"] = _restart(model_dir, args, tmp, console)
    ratios = _report(console, runs, cases)
    out = {"benchmark": "kvbm_vllm", "engine": "vllm", "device": "cpu", "host": platform.node(),
           "python": platform.python_version(), "config": {k: str(v) for k, v in vars(args).items()},
           "runs": runs, "cases": cases, "ratios": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    console.print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
