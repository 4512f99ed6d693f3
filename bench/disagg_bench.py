"""What disaggregation buys: `python -m bench.disagg_bench` (`make bench-disagg`).

Mocker workers with the published timing model (speedup 1), equal worker counts: aggregated
(2 agg workers; 4) against disaggregated (1 prefill + 1 decode; 2 + 2). In each run, streams with
short prompts decode continuously (``--decoders`` per pair of workers, closed loop) while long
prompts (4K-8K tokens, each new to every cache) arrive at a steady rate. Reported: TTFT of the long
prompts (p50/p99) and the inter-token latency of the decoding streams (every gap between two
tokens, p50/p99). Prints a table; writes bench/results/disagg.json. The raw NIXL figure for the
KV-transfer comparison comes from ``python -m bench.nixl_raw``.

``--engine vllm`` (run with .venv-vllm's python) makes the same comparison on vLLM CPU with the
real model, 2 aggregated workers against 1 prefill + 1 decode, each worker with one OpenMP thread
(two processes share the two cores of a small machine: no target, reported). Its defaults are
scaled to what a CPU computes (``--vllm-*`` below); writes bench/results/disagg_vllm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table
from tokenizers import Tokenizer

from bench.devstack import RedisServer, Stack
from bench.sse_trace import sse_events
from bench.stats import pct
from core.settings import Settings
from workers.models.prepare import prepare_model

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2"
#: name -> pools of the workers (equal counts within a pair).
TOPOLOGIES = {
    "agg-2": ["agg", "agg"],
    "disagg-1p1d": ["prefill", "decode"],
    "agg-4": ["agg"] * 4,
    "disagg-2p2d": ["prefill", "prefill", "decode", "decode"],
}


@dataclass
class Samples:
    long_ttft_s: list[float] = field(default_factory=list)
    decode_gaps_s: list[float] = field(default_factory=list)
    errors: int = 0
    long_done: int = 0


async def _stream(session: aiohttp.ClientSession, url: str, body: dict, on_token) -> float | None:  # noqa: ANN001
    """Stream one completion; ``on_token(now)`` per chunk with text. Returns TTFT (None: failed)."""
    t0 = time.perf_counter()
    first = None
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return None
        async for event in sse_events(resp):
            if "error" in event:
                return None
            if any(c.get("text") for c in event.get("choices") or ()):
                now = time.perf_counter()
                first = first or now
                on_token(now)
    return None if first is None else first - t0


#: The vLLM comparison: two workers, one OpenMP thread each, a small KV cache; prompts that take
#: seconds (not milliseconds) to prefill on a CPU. Two vLLM workers keep a 2-core machine's run
#: queue at 8-10: a worker's heartbeat was seen 5.8 s late during a prefill, so the lease is long.
VLLM_ENV = {"SLUICE_ENGINE": "vllm", "SLUICE_WORKER__VLLM__OMP_THREADS": "1", "SLUICE_WORKER__VLLM__KV_CACHE_GIB": "0.5",
            "SLUICE_WORKER__VLLM__MAX_NUM_SEQS": "16", "SLUICE_DISAGG__MIN_TOKENS": "512",
            "SLUICE_WORKER__LEASE_TTL_S": "30"}
VLLM_DEFAULTS = {"seconds": 150.0, "warmup": 10.0, "decoders": 4, "decode_tokens": 64, "long_rate": 0.05,
                 "long_min": 1024, "long_max": 2048}


def _long_prompt(rng: random.Random, tokenizer: Tokenizer, tokens: int) -> str:
    """About ``tokens`` tokens of random words, new to every cache (a fresh tag first)."""
    words = " ".join(f"w{rng.randrange(10_000)}" for _ in range(tokens))
    ids = tokenizer.encode(f"{uuid.uuid4().hex} {words}").ids[:tokens]
    return tokenizer.decode(ids)


async def _workload(url: str, pairs: int, tokenizer: Tokenizer, args: argparse.Namespace) -> Samples:
    samples = Samples()
    rng = random.Random(7)
    stop_at = time.perf_counter() + args.seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        measure_from = stop_at - args.seconds + args.warmup

        def gap_recorder() -> Callable[[float], None]:
            """Records the gap between consecutive tokens of one stream, after the warm-up."""
            last: list[float] = []

            def gap(now: float) -> None:
                if last and now > measure_from:
                    samples.decode_gaps_s.append(now - last[0])
                last[:] = [now]
            return gap

        async def decoder(i: int) -> None:
            while time.perf_counter() < stop_at:
                gap = gap_recorder()
                body = {"model": MODEL, "prompt": f"Decoder {i} {uuid.uuid4().hex}: tell a story.",
                        "max_tokens": args.decode_tokens, "ignore_eos": True, "stream": True}
                if await _stream(session, url, body, gap) is None:
                    samples.errors += 1

        async def long_one(tokens: int) -> None:
            body = {"model": MODEL, "prompt": _long_prompt(rng, tokenizer, tokens), "max_tokens": 16, "ignore_eos": True,
                    "stream": True}
            ttft = await _stream(session, url, body, lambda now: None)
            if ttft is None:
                samples.errors += 1
            else:
                samples.long_ttft_s.append(ttft)
                samples.long_done += 1

        async def arrivals() -> None:
            await asyncio.sleep(args.warmup)
            pending = []
            while time.perf_counter() < stop_at:
                pending.append(asyncio.create_task(long_one(rng.randrange(args.long_min, args.long_max))))
                await asyncio.sleep(rng.expovariate(args.long_rate * pairs))
            await asyncio.gather(*pending)

        await asyncio.gather(arrivals(), *(decoder(i) for i in range(args.decoders * pairs)))
    return samples


def run_topology(name: str, pools: list[str], server: RedisServer, tok: Path, args: argparse.Namespace) -> dict:
    env = {"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_WORKER__TASK_EVENTS": "0"}
    if args.engine == "vllm":
        env.update(VLLM_ENV)
    stack = Stack(redis_url=server.url, namespace=f"dis{uuid.uuid4().hex[:6]}", model_path=tok, env_extra=env)
    try:
        for i, pool in enumerate(pools):
            stack.start_worker(f"{pool[0]}{i}", SLUICE_POOL=pool)
        stack.start_frontend(SLUICE_AUTH="0")
        stack.wait_ready(MODEL, workers=len(pools), timeout=600 if args.engine == "vllm" else 60)
        tokenizer = Tokenizer.from_file(str(tok / "tokenizer.json"))
        samples = asyncio.run(_workload(f"{stack.base_url}/v1/completions", len(pools) // 2, tokenizer, args))
    finally:
        stack.stop()
    ms = [v * 1000 for v in samples.decode_gaps_s]
    ttft = [v * 1000 for v in samples.long_ttft_s]
    return {"topology": name, "workers": len(pools), "long_prompts": samples.long_done, "errors": samples.errors,
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
            "itl_ms_p50": pct(ms, 50), "itl_ms_p99": pct(ms, 99), "itl_samples": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("mocker", "vllm"), default="mocker")
    parser.add_argument("--seconds", type=float, default=40.0, help="length of each run")
    parser.add_argument("--warmup", type=float, default=5.0, help="decoders only, not measured")
    parser.add_argument("--decoders", type=int, default=32, help="decoding streams per pair of workers")
    parser.add_argument("--decode-tokens", type=int, default=256, help="max_tokens of each decoding stream")
    parser.add_argument("--long-rate", type=float, default=0.5, help="long prompts per second per pair of workers")
    parser.add_argument("--long-min", type=int, default=4096, help="shortest long prompt, tokens")
    parser.add_argument("--long-max", type=int, default=8192, help="longest long prompt, tokens")
    parser.add_argument("--only", nargs="*", choices=list(TOPOLOGIES), help="run these topologies only")
    args = parser.parse_args()
    if args.engine == "vllm":  # CPU-sized defaults for what was not given
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in sys.argv[1:] if a.startswith("--")}
        for key, value in VLLM_DEFAULTS.items():
            if key not in given:
                setattr(args, key, value)
        args.only = args.only or ["agg-2", "disagg-1p1d"]
    tok = prepare_model(MODEL, Settings().models_dir, weights=args.engine == "vllm", progress=False)
    server = RedisServer().start()
    rows = []
    try:
        for name, pools in TOPOLOGIES.items():
            if args.only and name not in args.only:
                continue
            rows.append(run_topology(name, pools, server, tok, args))
    finally:
        server.stop()
    engine = "mocker, speedup 1" if args.engine == "mocker" else "vLLM CPU, SmolLM2-135M, 1 thread per worker"
    table = Table(width=140, title=f"Long prompts ({args.long_min}-{args.long_max} tokens, {args.long_rate}/s per pair) "
                        f"while {args.decoders} streams per pair decode ({engine})")
    for col in rows[0]:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()))
    by_name = {row["topology"]: row for row in rows}
    ratios = {}
    for agg, dis in (("agg-2", "disagg-1p1d"), ("agg-4", "disagg-2p2d")):
        if agg in by_name and dis in by_name:
            a, d = by_name[agg], by_name[dis]
            ratios[f"{dis}/{agg}"] = {key: d[key] / a[key] for key in ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50",
                                                                      "itl_ms_p99") if a[key] and d[key]}
    Console().print(table)
    for name, values in ratios.items():
        Console().print(f"{name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in values.items()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "disagg.json" if args.engine == "mocker" else "disagg_vllm.json"
    (RESULTS / name).write_text(json.dumps({"args": vars(args), "runs": rows, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
