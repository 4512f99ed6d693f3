"""Real-model benchmark: `make bench-vllm` (or `.venv-vllm/bin/python -m bench.vllm_bench`).

Sluice (one frontend + one vLLM worker, over Celery and Redis) against vLLM's own OpenAI server
(``python -m vllm.entrypoints.openai.api_server``) on the same prepared model, the same engine
settings (dtype, block size, max_num_seqs, KV cache size, OpenMP threads, prefix caching, eager
mode), the same streaming chat prompts and the same concurrency levels (1 and 8). Both are started (one after
the other), then loaded in turn, never at once (a small CPU machine has two cores), for several
rounds that alternate which goes first; each level reports its median round. Reported per system and level:
output tokens/s, TTFT p50/p99, inter-token latency p50; then the ratios Sluice / vLLM. Targets:
throughput >= 0.95x, TTFT p50 at most +10 ms. Prints a table; writes bench/results/vllm.json.

Differences that stay on purpose: the Sluice worker also publishes vLLM's KV cache events (the
router needs them) and Celery task events (Flower needs them); vLLM's server does neither.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.devstack import Processes, RedisServer, Stack, free_port
from bench.loadgen import run_load
from bench.stats import cpu_seconds, pct
from core.settings import Settings
from core.shm import descendants
from workers.models.prepare import prepare_model

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2"
WORDS = ("river stone cloud garden lantern music paper window orange silver forest candle bridge "
         "winter mountain harbor").split()
START_TIMEOUT_S = 300


@dataclass(frozen=True)
class EngineConfig:
    """The engine settings both servers get. On ``cpu``: float32, eager, a KV cache of ``kv_cache_gib``,
    OpenMP threads. On ``cuda``: the model's dtype, CUDA graphs (vLLM's production default) and a share
    of the GPU's memory each (both servers are up at once)."""

    device: str = "cpu"
    dtype: str = "float32"
    block_size: int = 32
    max_num_seqs: int = 8
    kv_cache_gib: float = 1.0
    omp_threads: int = os.cpu_count() or 1
    gpu_memory_utilization: float = 0.4

    @classmethod
    def for_device(cls, device: str, max_num_seqs: int) -> EngineConfig:
        if device == "cuda":
            return cls(device="cuda", dtype="auto", block_size=16, max_num_seqs=max_num_seqs)
        return cls(max_num_seqs=max_num_seqs)

    def sluice_env(self) -> dict[str, str]:
        env = {"SLUICE_ENGINE": "vllm", "SLUICE_WORKER__VLLM__DTYPE": self.dtype,
               "SLUICE_WORKER__VLLM__BLOCK_SIZE": str(self.block_size),
               "SLUICE_WORKER__VLLM__MAX_NUM_SEQS": str(self.max_num_seqs)}
        if self.device == "cuda":
            return {**env, "SLUICE_WORKER__VLLM__GPU_MEMORY_UTILIZATION": str(self.gpu_memory_utilization),
                    "SLUICE_WORKER__VLLM__ENFORCE_EAGER": "false"}
        return {**env, "SLUICE_WORKER__VLLM__KV_CACHE_GIB": str(self.kv_cache_gib),
                "SLUICE_WORKER__VLLM__OMP_THREADS": str(self.omp_threads)}

    def vllm_args(self) -> list[str]:
        """What workers/engines/vllm/engine.py gives vLLM, as server flags."""
        common = ["--dtype", self.dtype, "--block-size", str(self.block_size), "--max-num-seqs", str(self.max_num_seqs),
                  "--enable-prefix-caching", "--disable-log-stats"]
        if self.device == "cuda":
            return [*common, "--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        return [*common, "--kv-cache-memory-bytes", str(int(self.kv_cache_gib * (1 << 30))), "--enforce-eager"]

    def vllm_env(self) -> dict[str, str]:
        """The OpenMP setup the Sluice worker makes on a CPU (vllm_engine._configure_cpu_threads)."""
        if self.device == "cuda":
            return {}
        return {"OMP_NUM_THREADS": str(self.omp_threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def chat_body(i: int, max_tokens: int) -> dict:
    rng = random.Random(i)
    words = " ".join(rng.choice(WORDS) for _ in range(12))
    return {"model": MODEL, "messages": [{"role": "user", "content": f"Tell a story about: {i} {words}"}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def summarize(run, cpu_front: float | None) -> dict:  # noqa: ANN001
    ok = [r for r in run.results if r.ok]
    n = len(run.results)
    ttft = [r.ttft_s * 1000 for r in ok]
    itl = [r.itl_s * 1000 for r in ok if r.itl_s is not None]
    return {
        "concurrency": run.concurrency, "requests": n, "errors": n - len(ok), "wall_s": run.wall_s,
        "tokens_per_s": sum(r.tokens for r in ok) / run.wall_s,
        "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99), "itl_ms_p50": pct(itl, 50),
        "frontend_cpu_ms_per_req": cpu_front * 1000 / n if cpu_front is not None else None,
        "first_error": next((r.error for r in run.results if not r.ok), None),
    }


async def measure(url: str, level: int, requests_per_slot: int, max_tokens: int, front_pids: list[int]) -> dict:
    before = cpu_seconds(front_pids)
    run = await run_load(url, lambda i: chat_body(i, max_tokens), level, level * requests_per_slot, timeout_s=600)
    after = cpu_seconds(front_pids)
    return summarize(run, sum(after[p] - before[p] for p in front_pids) if front_pids else None)


async def warm_up(url: str, max_tokens: int) -> None:
    """The first requests of a fresh engine allocate and warm caches: keep them out of the numbers."""
    await run_load(url, lambda i: chat_body(10**6 + i, max_tokens), 2, 4)


# ---- the two systems --------------------------------------------------------------------------------
@dataclass
class Server:
    """A system under load: its chat URL and the processes whose CPU is its frontend's."""

    name: str
    url: str
    front_pids: list[int]
    stop: Callable[[], None]


def start_vllm_server(model_dir: Path, cfg: EngineConfig) -> Server:
    port = free_port()
    processes = Processes(prefix="sluice-bench-vllm-")  # stopped, its log removed, however the bench ends
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), *cfg.vllm_args()]
    # Its engine sockets in the processes' own directory, removed with them.
    server = processes.spawn("vllm", cmd, {**os.environ, **cfg.vllm_env(), "VLLM_RPC_BASE_PATH": str(processes.workdir)})

    try:
        server.wait_serving(f"http://127.0.0.1:{port}/v1/models", "vLLM's OpenAI server", START_TIMEOUT_S,
                            interval=0.5)
    except BaseException:
        processes.stop()
        raise
    return Server("vLLM server", f"http://127.0.0.1:{port}/v1/chat/completions", [server.popen.pid], processes.stop)


def sluice_name(processes: int) -> str:
    return "Sluice" if processes == 1 else f"Sluice ({processes} frontend processes)"


def start_sluice(model_dir: Path, cfg: EngineConfig, frontend_processes: list[int]) -> list[Server]:
    """One vLLM worker and, in front of it, one frontend per entry of ``frontend_processes`` (that many
    processes each, on ports of their own), so that every variant drives the same engine."""
    redis = RedisServer().start()
    stack = Stack(redis_url=redis.url, namespace=f"bench{uuid.uuid4().hex[:6]}", model_path=model_dir,
                  env_extra=cfg.sluice_env())

    def stop() -> None:
        stack.stop()
        redis.stop()

    servers = []
    try:
        stack.start_worker("bench-vllm")
        for i, count in enumerate(frontend_processes):
            port = stack.port if i == 0 else free_port()
            front = stack.processes.spawn(f"frontend-{i}", [sys.executable, "-m", "sluice", "serve", "--port", str(port),
                                                            "--processes", str(count), "--log-level", "warning"],
                                          stack.env())
            front.wait_serving(f"http://127.0.0.1:{port}/health", "the frontend", START_TIMEOUT_S, interval=0.5)
            servers.append((count, port, front))
        stack.wait_ready(MODEL, 1, timeout=START_TIMEOUT_S)
    except BaseException:
        stop()
        raise
    out = []
    for i, (count, port, front) in enumerate(servers):
        pids = [front.popen.pid, *descendants(front.popen.pid)]
        out.append(Server(sluice_name(count), f"http://127.0.0.1:{port}/v1/chat/completions", pids,
                          stop if i == 0 else (lambda: None)))
    return out


def median_row(rows: list[dict]) -> dict:
    """The round with the median throughput (a whole measured row, not a mix of rounds), with every
    round's rows kept for the paired comparison."""
    ranked = sorted(rows, key=lambda r: r["tokens_per_s"])
    return {**ranked[len(ranked) // 2], "rounds": [r["tokens_per_s"] for r in rows], "round_rows": rows}


def run_all(model_dir: Path, cfg: EngineConfig, args: argparse.Namespace) -> dict[str, list[dict]]:
    """Start both (one after the other), then measure them in turn, alternating which goes first,
    so that other load on the machine hits both alike; report each level's median round."""
    servers: list[Server] = []
    try:
        if args.only in (None, "vllm"):
            servers.append(start_vllm_server(model_dir, cfg))
        if args.only in (None, "sluice"):
            servers.extend(start_sluice(model_dir, cfg, args.frontend_processes))
        for server in servers:
            asyncio.run(warm_up(server.url, args.max_tokens))
        raw: dict[str, dict[int, list[dict]]] = {s.name: {level: [] for level in args.concurrency} for s in servers}
        for round_no in range(args.rounds):
            for level in args.concurrency:
                order = servers if round_no % 2 == 0 else servers[::-1]
                for server in order:
                    row = asyncio.run(measure(server.url, level, args.requests_per_slot, args.max_tokens,
                                              server.front_pids))
                    raw[server.name][level].append(row)
                    print(f"round {round_no + 1} {server.name:12s} c={level}: {row['tokens_per_s']:.1f} tok/s, "
                          f"TTFT p50 {row['ttft_ms_p50'] or 0:.1f} ms", flush=True)
    finally:
        for server in servers:
            server.stop()
    return {name: [median_row(rows) for rows in by_level.values()] for name, by_level in raw.items()}


# ---- report -------------------------------------------------------------------------------------------
def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def ratios(sluice: list[dict], vllm: list[dict]) -> list[dict]:
    """Sluice against vLLM round by round (the two ran back to back, so machine load hits both alike),
    then the median over rounds of each paired ratio or difference."""
    out = []
    for s, v in zip(sluice, vllm, strict=True):
        pairs = list(zip(s["round_rows"], v["round_rows"], strict=True))
        through = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs if b["tokens_per_s"]]
        ttft = [a["ttft_ms_p50"] - b["ttft_ms_p50"] for a, b in pairs
                if a["ttft_ms_p50"] is not None and b["ttft_ms_p50"] is not None]
        itl = [a["itl_ms_p50"] / b["itl_ms_p50"] for a, b in pairs if a["itl_ms_p50"] and b["itl_ms_p50"]]
        out.append({
            "concurrency": s["concurrency"],
            "throughput_ratio": pct(through, 50), "throughput_ratio_rounds": through,
            "ttft_p50_delta_ms": pct(ttft, 50), "ttft_p50_delta_ms_rounds": ttft,
            "itl_p50_ratio": pct(itl, 50),
        })
    return out


def print_table(results: dict[str, list[dict]], compared: dict[str, list[dict]], device: str) -> None:
    table = Table(title=f"Sluice + vLLM vs vLLM's own OpenAI server (streaming chat, SmolLM2-135M, {device})")
    for col in ("system", "conc", "reqs", "err", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
                "front CPU ms/req"):
        table.add_column(col, justify="right" if col != "system" else "left")
    for system, rows in results.items():
        for r in rows:
            table.add_row(system, str(r["concurrency"]), str(r["requests"]), str(r["errors"]), _fmt(r["tokens_per_s"]),
                          _fmt(r["ttft_ms_p50"]), _fmt(r["ttft_ms_p99"]), _fmt(r["itl_ms_p50"]),
                          _fmt(r["frontend_cpu_ms_per_req"]))
    for name, rows in compared.items():
        for c in rows:
            table.add_row(f"{name}/vLLM", str(c["concurrency"]), "", "", _fmt(c["throughput_ratio"], ".3f") + "x",
                          _fmt(c["ttft_p50_delta_ms"], "+.1f"), "", _fmt(c["itl_p50_ratio"], ".3f") + "x", "",
                          style="bold")
    console = Console(width=max(Console().width, 132))
    console.print(table)
    console.print("…/vLLM rows: median over rounds of the paired (same-round) ratio or difference")
    for name, rows in compared.items():
        for c in rows:
            console.print(f"  {name}, c={c['concurrency']}: throughput ratio per round "
                          f"{', '.join(f'{x:.3f}' for x in c['throughput_ratio_rounds'])}; TTFT p50 delta per round "
                          f"{', '.join(f'{x:+.1f}' for x in c['ttft_p50_delta_ms_rounds'])} ms")
    console.print("targets: throughput >= 0.95x, TTFT p50 <= +10 ms (CPU) / within +10% (GPU)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cpu: vLLM's CPU build, eager; cuda: vLLM's CUDA build, CUDA graphs, a GPU memory share each")
    ap.add_argument("--concurrency", type=int, nargs="+", default=None, help="levels (default: 1 8 on cpu, 1 32 128 on cuda)")
    ap.add_argument("--requests-per-slot", type=int, default=4, help="requests per level = level x this")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (ignore_eos)")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per system and level (median reported)")
    ap.add_argument("--only", choices=["sluice", "vllm"], default=None, help="measure one system only")
    ap.add_argument("--frontend-processes", type=int, nargs="+", default=[1], metavar="N",
                    help="Sluice frontends to measure, each with N processes, all in front of the one worker")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm.json", help="where the JSON goes")
    args = ap.parse_args()
    args.concurrency = args.concurrency or ([1, 32, 128] if args.device == "cuda" else [1, 8])

    model_dir = prepare_model(MODEL, Settings().models_dir, weights=True)
    cfg = EngineConfig.for_device(args.device, max(8, *args.concurrency))
    results = run_all(model_dir, cfg, args)
    compared = {name: ratios(rows, results["vLLM server"]) for name, rows in results.items()
                if name != "vLLM server" and "vLLM server" in results}
    print_table(results, compared, args.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"time": time.time(), "engine": cfg.__dict__, "max_tokens": args.max_tokens,
                                    "results": results, "ratios": compared}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
