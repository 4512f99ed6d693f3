"""Frontend and platform benchmark: `make bench` (or `python -m bench.frontend_bench`).

Starts a private Redis and the stack (one frontend process, two mocker workers that do not sleep),
then drives streaming chat completions (~24 prompt tokens, 16 output tokens) at concurrency 1, 32
and 256: requests/s, streamed tokens/s, TTFT and inter-token latency p50/p99, and CPU seconds per
request of the frontend process and of the whole platform (frontend + workers + Redis).
With ``--dynamo`` it runs the same load against NVIDIA Dynamo (the anchor in shared/anchors, if
installed) in the same run and reports ratios; ``--rounds N`` measures every system N times at each
level, alternating which goes first (both stay up meanwhile). Prints a table; writes bench/results/frontend.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.devstack import Processes, RedisServer, Stack
from bench.floor.launch import start_celery, start_http
from bench.loadgen import run_load
from bench.stats import cpu_seconds, pct
from core.settings import Settings
from core.shm import descendants
from workers.models.prepare import prepare_model

RESULTS = Path(__file__).resolve().parent / "results"
WORDS = ("river stone cloud garden lantern music paper window orange silver forest candle bridge "
         "winter mountain harbor").split()
MODEL = "smollm2"
DYNAMO_URL = "http://127.0.0.1:8100"


@dataclass(frozen=True)
class Target:
    """A running system to measure: its endpoint, the frontend's process and all of its processes, each
    with the role it plays (``frontend``, a worker's name, ``redis``, ...)."""

    url: str
    front_pid: int
    processes: dict[int, str]
    model: str


def chat_body(i: int, model: str = MODEL) -> dict:
    rng = random.Random(i)
    words = " ".join(rng.choice(WORDS) for _ in range(9))
    return {"model": model, "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": f"{i} {words}"}],
            "max_tokens": 16, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def summarize(run, cpu: dict[str, float], front: str) -> dict:  # noqa: ANN001
    """The table's row for one level; ``cpu`` is CPU seconds per process role, ``front`` the frontend's role."""
    ok = [r for r in run.results if r.ok]
    n = len(run.results)
    cpu_front = cpu.get(front)
    cpu_all = sum(cpu.values()) if cpu else None
    tokens = sum(r.tokens for r in ok)
    ttft = [r.ttft_s * 1000 for r in ok]
    itl = [r.itl_s * 1000 for r in ok if r.itl_s is not None]
    return {
        "concurrency": run.concurrency, "requests": n, "errors": n - len(ok),
        "req_per_s": len(ok) / run.wall_s, "tokens_per_s": tokens / run.wall_s,
        "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
        "itl_ms_p50": pct(itl, 50), "itl_ms_p99": pct(itl, 99),
        "frontend_cpu_ms_per_req": cpu_front * 1000 / n if cpu_front is not None else None,
        "platform_cpu_ms_per_req": cpu_all * 1000 / n if cpu_all is not None else None,
        "cpu_ms_per_req_by_process": {role: seconds * 1000 / n for role, seconds in cpu.items()},
        "first_error": next((r.error for r in run.results if not r.ok), None),
    }


async def measure(target: Target, concurrency: int, requests: int) -> dict:
    model = target.model
    await run_load(target.url, lambda i: chat_body(10**6 + i, model), min(concurrency, 32), min(200, requests))  # warm-up
    before = cpu_seconds(target.processes)
    run = await run_load(target.url, lambda i: chat_body(i, model), concurrency, requests)
    after = cpu_seconds(target.processes)
    cpu: dict[str, float] = {}
    for pid, role in target.processes.items():
        cpu[role] = cpu.get(role, 0.0) + after[pid] - before[pid]
    return summarize(run, cpu, target.processes[target.front_pid])


def sluice_stack(workers: int, task_events: bool = True, router: str = "kv",
                 frontend_processes: int = 1) -> tuple[RedisServer, Stack]:
    tok = prepare_model(MODEL, Settings().models_dir, weights=False, progress=False)
    redis = RedisServer().start()
    stack = Stack(redis_url=redis.url, namespace=f"bench{uuid.uuid4().hex[:6]}", model_path=tok,
                  env_extra={"SLUICE_WORKER__MOCKER__NO_SLEEP": "true", "SLUICE_ROUTER_MODE": router,
                             "SLUICE_WORKER__TASK_EVENTS": "true" if task_events else "false",
                             "SLUICE_FRONTEND__PROCESSES": str(frontend_processes)})
    try:
        for i in range(workers):
            stack.start_worker(f"bench{i}")
        stack.start_frontend()
        stack.wait_ready(MODEL, workers)
    except BaseException:
        stack.stop()
        redis.stop()
        raise
    return redis, stack


def dynamo_start(anchor: Path) -> tuple[int, dict[int, str]] | None:
    script = anchor / "dynamo.sh"
    if not script.exists():
        return None
    env = {"SPEEDUP": "1000", "WORKERS": "2", "PORT": "8100"}
    r = subprocess.run(["bash", str(script), "start"], env={**__import__("os").environ, **env},
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        return None
    run_dir = Path(__import__("os").environ.get("TMPDIR", "/tmp")) / "sluice-anchor-dynamo" / "run"
    processes = {int(p.read_text()): p.stem for p in run_dir.glob("*.pid")}
    return int((run_dir / "frontend.pid").read_text()), processes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--requests", type=int, default=None, help="requests per level (default scales with level)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--task-events", choices=["on", "off", "both"], default="both",
                    help="Celery task events on the workers (Flower's task views need them; default: measure both)")
    ap.add_argument("--router", default="kv", help="Sluice's routing mode (Dynamo's anchor routes with its KV router)")
    ap.add_argument("--dynamo", action="store_true", help="also measure the Dynamo anchor (if installed)")
    ap.add_argument("--anchor", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "anchors" / "dynamo")
    ap.add_argument("--frontend-processes", type=int, default=1, metavar="N",
                    help="Sluice's frontend processes behind its port (SLUICE_FRONTEND__PROCESSES)")
    ap.add_argument("--floor", action="store_true",
                    help="also measure the floor servers of bench.floor (FastAPI alone; FastAPI + Celery + pub/sub)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every system this many times at each level, alternating their order")
    args = ap.parse_args()
    console = Console(width=200)
    variants = {"on": [True], "off": [False], "both": [True, False]}[args.task_events]
    levels = [(c, args.requests or max(300, min(3000, c * 20))) for c in args.concurrency]
    with contextlib.ExitStack() as running:
        targets: dict[str, Target] = {}
        for events in variants:
            redis, stack = sluice_stack(args.workers, events, args.router, args.frontend_processes)
            running.callback(redis.stop)
            running.callback(stack.stop)
            roles = {p.popen.pid: name for name, p in stack.procs.items()}
            # Several frontend processes: the supervisor's children count as the frontend too.
            roles.update(dict.fromkeys(descendants(stack.procs["frontend"].popen.pid), "frontend"))
            if redis.proc is not None:
                roles[redis.proc.pid] = "redis"
            targets["sluice" if events else "sluice (no task events)"] = Target(
                f"{stack.base_url}/v1/chat/completions", stack.procs["frontend"].popen.pid, roles, MODEL)
        if args.dynamo:
            started = dynamo_start(args.anchor)
            if started is None:
                console.print("[yellow]Dynamo anchor not installed or did not start; skipped[/]")
            else:
                running.callback(subprocess.run, ["bash", str(args.anchor / "dynamo.sh"), "stop"], capture_output=True)
                front_pid, roles = started
                httpx.get(f"{DYNAMO_URL}/v1/models", timeout=10)
                targets["dynamo"] = Target(f"{DYNAMO_URL}/v1/chat/completions", front_pid, roles, "smollm2")
        if args.floor:
            processes = Processes(prefix="sluice-floor-")
            running.callback(processes.stop)
            floor_redis = RedisServer().start()
            running.callback(floor_redis.stop)
            for name, server in (("floor: http", start_http(processes)),
                                 ("floor: celery", start_celery(processes, floor_redis, args.workers))):
                targets[name] = Target(server.url, server.front_pid, server.processes, MODEL)
        results: dict[str, list[dict]] = {name: [] for name in targets}
        for round_no in range(1, args.rounds + 1):
            order = list(targets) if round_no % 2 else list(reversed(targets))
            for c, n in levels:
                for name in order:
                    console.print(f"round {round_no}, {name}: concurrency {c}, {n} requests...")
                    row = asyncio.run(measure(targets[name], c, n))
                    results[name].append({"round": round_no, **row})

    table = Table(title="Sluice frontend + platform (mocker, no sleep, ~24-token prompts, 16 tokens, streaming)")
    for col in ("system", "round", "conc", "req/s", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms",
                "frontend CPU ms/req", "platform CPU ms/req", "errors"):
        table.add_column(col, justify="right")
    for system, rows in results.items():
        for r in rows:
            f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
            table.add_row(system, str(r["round"]), str(r["concurrency"]), f(r["req_per_s"], 1), f(r["tokens_per_s"], 0),
                          f(r["ttft_ms_p50"]), f(r["ttft_ms_p99"]), f(r["itl_ms_p50"], 3), f(r["itl_ms_p99"], 3),
                          f(r["frontend_cpu_ms_per_req"]), f(r["platform_cpu_ms_per_req"]), str(r["errors"]))
    console.print(table)
    by_process = Table(title="CPU ms per request, by process")
    for col in ("system", "round", "conc", "processes"):
        by_process.add_column(col, justify="left" if col == "processes" else "right")
    for system, rows in results.items():
        for r in rows:
            shown = ", ".join(f"{role} {ms:.2f}" for role, ms in sorted(r["cpu_ms_per_req_by_process"].items()))
            by_process.add_row(system, str(r["round"]), str(r["concurrency"]), shown)
    console.print(by_process)
    for system in (s for s in results if s != "dynamo" and "dynamo" in results):
        for s_row, d_row in zip(results[system], results["dynamo"], strict=True):
            ratio = {k: (s_row[k] / d_row[k]) if s_row.get(k) and d_row.get(k) else None
                     for k in ("req_per_s", "ttft_ms_p50", "frontend_cpu_ms_per_req", "platform_cpu_ms_per_req")}
            s_row["vs_dynamo"] = ratio
            shown = ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items() if v is not None)
            console.print(f"round {s_row['round']}, conc {s_row['concurrency']}: {system}/dynamo {shown}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "frontend.json"
    out.write_text(json.dumps({"time": time.time(), "results": results}, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
