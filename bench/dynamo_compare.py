"""Sluice against NVIDIA Dynamo, in real time, on chat workloads under KV pressure:
``make bench-dynamo`` (or ``python -m bench.dynamo_compare``).

Both systems run 4 mocker workers with the same timing model (Dynamo's published one, which Sluice's
mocker follows), the same block size and the same small KV cache, at speedup 1 (real time); the same
client replays the same seeded trace against each, one system at a time, each started cold:

* ``prefix`` — shared prefixes: single-turn requests, each one of 48 system prompts (2,000-3,500
  tokens, Zipf popularity) and a question of its own (bench.chat_workloads.prefix_workload);
* ``multiturn`` — conversations that grow turn by turn, each prompt the whole conversation so far
  (bench.chat_workloads.multiturn_workload).

The working set of either is about twice the fleet's KV cache (4 × 1,024 blocks of 16 tokens), so
the caches evict and where a request goes decides what it finds cached. Outputs are short (16-48
tokens). Prompts are text made of words that are one token each for SmolLM2's tokenizer (both
systems serve it), and a conversation's earlier replies are the trace's own canned text, so every
system sees exactly the same prompts whatever its mocker answered.

Systems: Dynamo 1.6.1 with its KV router (the anchor, ``../shared/anchors/dynamo/dynamo.sh``;
``install`` it once), Sluice with each ``--modes`` (default: ``kv`` with its default cost, the
block formula; ``kv-time``, the predicted time to first token; ``round_robin``; ``least_loaded``).
Beside the real runs, ``--virtual-modes`` (default ``kv,round_robin,oracle``) replays each round's trace
on the virtual clock (bench.router_quality: the same mockers in one process, every Redis call and all
of the system's own work costing zero time, canned replies in the history as here): what each policy
would reach with no overhead at all. ``oracle`` reads the engines' real caches and queues and picks the
shortest predicted first step (bench.oracle_policy), a reference no router can run; where even it stays
above a target ratio against Dynamo's real run, no router over these engines reaches that target.

``--parity`` instead checks that the two engines step alike: one worker each, the same bursts of
concurrent unique prompts (8 × 2,700 tokens, 16 × 500), each request's TTFT by rank. With equal
engines the ranks differ by a constant (each system's own overhead before the engine), and the gaps
between ranks (the steps) agree.

Per run: requests, errors, the cached ratio (cached prompt tokens / prompt tokens, from each
response's ``usage``), TTFT mean, p50 and p90 (the client's clock: request sent
to first text), and ratios against Dynamo's run of the same round. ``--rounds`` repeats everything,
alternating the order of the systems; the table shows each round. Writes
bench/results/dynamo_compare.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table
from tokenizers import Tokenizer

from bench.chat_workloads import Turn, Workload, multiturn_workload, prefix_workload
from bench.devstack import REPO, RedisServer, Stack, free_port
from bench.router_quality import simulate
from bench.sse_trace import sse_events
from bench.stats import pct
from core.settings import MockerSettings, RouterSettings, Settings
from workers.models.prepare import prepare_model

MODEL = "smollm2"
WORKERS = 4
BLOCK = 16
KV_BLOCKS = 1024
DYNAMO = REPO.parent / "shared" / "anchors" / "dynamo" / "dynamo.sh"
RESULTS = REPO / "bench" / "results" / "dynamo_compare.json"


def workloads(seed: int) -> dict[str, Workload]:
    return {
        "prefix": prefix_workload(seed, prompts=48, prompt_tokens=(2000, 3500), requests=720, duration_s=40,
                                  question_tokens=(30, 120), output_tokens=(16, 48)),
        "multiturn": multiturn_workload(seed, users=96, turns=5, start_s=30, first_tokens=(1500, 3000),
                                        user_tokens=(100, 300), output_tokens=(16, 48), think_s=3.0),
    }


# ---- prompts as text ------------------------------------------------------------------------------
def one_token_words(tokenizer: Tokenizer) -> list[str]:
    """Lowercase words that SmolLM2's tokenizer writes as one token with their leading space."""
    words = sorted(t[1:] for t in tokenizer.get_vocab() if t.startswith("Ġ") and t[1:].isascii()
                   and t[1:].isalpha() and t[1:].islower() and len(t) >= 4)
    return [w for w in words if len(tokenizer.encode(" " + w, add_special_tokens=False).ids) == 1]


def text_of(tokens: list[int], words: list[str]) -> str:
    return "".join(" " + words[t % len(words)] for t in tokens)


def canned_reply(user: int, turn: int, n: int) -> list[int]:
    """The trace's own reply of ``n`` tokens, what later turns carry in their history."""
    rng = random.Random(user * 1000 + turn)
    return [rng.randrange(100, 49_000) for _ in range(n)]


# ---- the replay -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Result:
    ok: bool
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    error: str = ""


async def _request(session: aiohttp.ClientSession, url: str, prompt: str, n: int) -> Result:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": n, "min_tokens": n, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    usage: dict = {}
    try:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                return Result(False, 0, 0, 0, f"HTTP {resp.status}")
            async for event in sse_events(resp):
                if "error" in event:
                    return Result(False, 0, 0, 0, str(event["error"])[:100])
                if first is None and any(c.get("text") for c in event.get("choices") or ()):
                    first = time.perf_counter()
                usage = event.get("usage") or usage
    except aiohttp.ClientError as exc:
        return Result(False, 0, 0, 0, type(exc).__name__)
    if first is None:
        return Result(False, 0, 0, 0, "no text")
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return Result(True, first - t0, int(usage.get("prompt_tokens", 0)), int(cached))


async def replay(url: str, workload: Workload, words: list[str]) -> list[Result]:
    """Every conversation on its own task: a turn is sent at its time (after the previous reply and
    the think time), its prompt the conversation so far."""
    results: list[Result] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def talk(convo: list) -> None:
            history = list(workload.system[convo[0].user])
            for k, turn in enumerate(convo):
                await asyncio.sleep(turn.arrival_s)
                history += turn.new_tokens
                results.append(await _request(session, url, text_of(history, words), turn.output_tokens))
                history += canned_reply(turn.user, k, turn.output_tokens)

        await asyncio.gather(*(talk(c) for c in workload.conversations))
    return results


def summarize(results: list[Result]) -> dict:
    ok = [r for r in results if r.ok]
    ttfts = [1000 * r.ttft_s for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return {"requests": len(results), "errors": len(results) - len(ok),
            "cached_ratio": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
            "ttft_mean_ms": statistics.fmean(ttfts) if ttfts else None,
            "ttft_p50_ms": pct(ttfts, 50), "ttft_p90_ms": pct(ttfts, 90),
            "first_errors": sorted({r.error for r in results if not r.ok})[:3]}


# ---- the systems ----------------------------------------------------------------------------------
@dataclass
class System:
    name: str
    start: Callable[[], tuple[str, Callable[[], None]]]  # -> (base url, stop)


def dynamo_system(script: Path, router: str = "kv", workers: int = WORKERS) -> System:
    """Dynamo's frontend with its router mode ``router`` (``kv``, ``round-robin``, ``random``)."""
    def start() -> tuple[str, Callable[[], None]]:
        port = free_port()
        env = {**os.environ, "PORT": str(port), "WORKERS": str(workers), "BLOCK": str(BLOCK),
               "KV_BLOCKS": str(KV_BLOCKS), "SPEEDUP": "1.0", "ROUTER": router}
        subprocess.run(["bash", str(script), "start"], env=env, check=True, capture_output=True, timeout=180)
        def stop() -> None:
            subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, timeout=60, check=False)

        return f"http://127.0.0.1:{port}", stop
    return System(f"dynamo {router}", start)


def sluice_system(name: str, model_dir: Path, extra_env: dict[str, str], workers: int = WORKERS) -> System:
    """``name``: a routing mode, or ``kv-time`` / ``kv-blocks`` (the ``kv`` mode with that cost)."""
    mode, _, cost = name.partition("-")
    env = {**extra_env, **({"SLUICE_ROUTER__COST": cost} if cost else {})}

    def start() -> tuple[str, Callable[[], None]]:
        redis = RedisServer().start()
        stack = Stack(redis_url=redis.url, namespace=f"cmp{uuid.uuid4().hex[:6]}", model_path=model_dir,
                      env_extra={"SLUICE_ENGINE": "mocker", "SLUICE_ROUTER_MODE": mode,
                                 "SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_WORKER__MOCKER__BLOCK_SIZE": str(BLOCK),
                                 "SLUICE_WORKER__MOCKER__KV_BLOCKS": str(KV_BLOCKS), **env})

        def stop() -> None:
            stack.stop()
            redis.stop()

        try:
            for i in range(workers):
                stack.start_worker(f"m{i + 1}")
            stack.start_frontend()
            stack.wait_ready(MODEL, workers, timeout=120)
        except BaseException:
            stop()
            raise
        return stack.base_url, stop
    return System(f"sluice {name}", start)


def canned_history(turn: Turn, k: int, answered: list[int]) -> list[int]:
    """What the real-time client puts in the history after turn ``k``: the trace's reply, whatever was answered."""
    return canned_reply(turn.user, k, turn.output_tokens)


def run_virtual(redis_url: str, mode: str, workload: Workload, seed: int) -> dict:
    """``mode`` (a Sluice routing mode, ``kv-time`` / ``kv-blocks``, or ``oracle``) over the same trace
    on the virtual clock: the fleet of this comparison with no system overhead
    (bench.router_quality.simulate)."""
    mocker = MockerSettings(block_size=BLOCK, kv_blocks=KV_BLOCKS)
    policy, _, cost = mode.partition("-")
    router = RouterSettings(cost=cost) if cost else RouterSettings()
    r = simulate(redis_url, policy, workload, WORKERS, mocker, seed, router, canned_history)
    return {"requests": r["requests"], "errors": 0, "cached_ratio": r["hit_ratio"],
            "ttft_mean_ms": r["ttft_virtual_mean_ms"], "ttft_p50_ms": r["ttft_virtual_p50_ms"],
            "ttft_p90_ms": r["ttft_virtual_p90_ms"], "first_errors": [], "wall_s": r["wall_s"]}


def run_one(system: System, workload: Workload, words: list[str]) -> dict:
    url, stop = system.start()
    try:
        t0 = time.perf_counter()
        results = asyncio.run(replay(url, workload, words))
        return {**summarize(results), "wall_s": time.perf_counter() - t0}
    finally:
        stop()


PARITY_BURSTS = ((2700, 8, 3), (500, 16, 3))  # (prompt tokens, concurrent requests, repeats)


async def bursts(url: str, words: list[str]) -> dict[str, list[float]]:
    """Each burst of PARITY_BURSTS: the median over its repeats of the TTFT (ms) of each rank."""
    rng = random.Random(9)
    out: dict[str, list[float]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for tokens, concurrent, repeats in PARITY_BURSTS:
            ranks: list[list[float]] = []
            for _ in range(repeats):
                texts = [text_of([rng.randrange(100, 49_000) for _ in range(tokens)], words) for _ in range(concurrent)]
                results = await asyncio.gather(*(_request(session, url, t, 16) for t in texts))
                ranks.append(sorted(1000 * r.ttft_s for r in results))
                await asyncio.sleep(1.5)  # the requests end and the cache empties of them
            out[f"{concurrent} x {tokens}"] = [statistics.median(col) for col in zip(*ranks, strict=True)]
    return out


def parity(systems: list[System], words: list[str], console: Console, out: Path) -> None:
    """Run :func:`bursts` against each system (of one worker); print each rank's TTFT and the steps."""
    found = {}
    for system in systems:
        url, stop = system.start()
        try:
            found[system.name] = asyncio.run(bursts(url, words))
        finally:
            stop()
    table = Table(title="Engine parity: one worker, bursts of concurrent unique prompts, TTFT by rank (ms, median of 3)")
    for col in ("burst", "system", "TTFT by rank", "steps (rank to rank)"):
        table.add_column(col)
    for burst in next(iter(found.values())):
        for name, rows in found.items():
            ttfts = rows[burst]
            steps = [b - a for a, b in zip(ttfts, ttfts[1:], strict=False) if b - a > 5]
            table.add_row(burst, name, " ".join(f"{t:.0f}" for t in ttfts), " ".join(f"{s:.0f}" for s in steps))
    console.print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"parity": found}, indent=1))
    console.print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="kv,kv-time,round_robin,least_loaded",
                    help="Sluice's routing modes; kv-time / kv-blocks: kv with that cost")
    ap.add_argument("--workloads", default="prefix,multiturn")
    ap.add_argument("--dynamo", type=Path, default=DYNAMO, help="the anchor's dynamo.sh ('' to leave Dynamo out)")
    ap.add_argument("--dynamo-modes", default="kv",
                    help="Dynamo's router modes to run (kv, round-robin, random); ratios are against its kv")
    ap.add_argument("--virtual-modes", default="kv,round_robin,oracle",
                    help="policies also replayed on the virtual clock (no system overhead); '' for none")
    ap.add_argument("--parity", action="store_true",
                    help="only check that the engines step alike (one worker each, bursts); writes dynamo_parity.json")
    ap.add_argument("--env", action="append", default=[], help="extra SLUICE_* setting for Sluice, NAME=VALUE")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    console = Console(width=150)
    model_dir = prepare_model(MODEL, Settings().models_dir, weights=False, progress=False)
    words = one_token_words(Tokenizer.from_file(str(model_dir / "tokenizer.json")))
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    workers = 1 if args.parity else WORKERS
    systems = [sluice_system(m, model_dir, extra_env, workers) for m in args.modes.split(",") if m]
    if str(args.dynamo) and args.dynamo.is_file():
        systems[:0] = [dynamo_system(args.dynamo, m, workers) for m in args.dynamo_modes.split(",") if m]
    else:
        console.print(f"[yellow]Dynamo's anchor not found at {args.dynamo}: Sluice's modes only[/]")
    if args.parity:
        parity(systems, words, console, args.out.with_name("dynamo_parity.json"))
        return
    runs: list[dict] = []
    virtual_redis = RedisServer().start()
    try:
        _rounds(args, systems, words, virtual_redis, runs, console)
    finally:
        virtual_redis.stop()
    report(args, runs, console)


def _rounds(args: argparse.Namespace, systems: list[System], words: list[str], virtual_redis: RedisServer,
            runs: list[dict], console: Console) -> None:
    for rnd in range(args.rounds):
        loads = workloads(args.seed + rnd)
        order = systems if rnd % 2 == 0 else systems[::-1]
        for name in args.workloads.split(","):
            for system in order:
                row = {"round": rnd, "workload": name, "system": system.name,
                       **run_one(system, loads[name], words)}
                runs.append(row)
                console.print(f"round {rnd} {name:9} {system.name:20} cached {row['cached_ratio']:.3f} "
                              f"TTFT mean {row['ttft_mean_ms'] or 0:.1f} ms, errors {row['errors']}")
            for mode in filter(None, args.virtual_modes.split(",")):
                row = {"round": rnd, "workload": name, "system": f"virtual {mode}",
                       **run_virtual(virtual_redis.url, mode, loads[name], args.seed + rnd)}
                runs.append(row)
                console.print(f"round {rnd} {name:9} {row['system']:20} cached {row['cached_ratio']:.3f} "
                              f"TTFT mean {row['ttft_mean_ms']:.1f} model ms")


def report(args: argparse.Namespace, runs: list[dict], console: Console) -> None:
    ratios = []
    for row in runs:
        ref = next((r for r in runs if r["round"] == row["round"] and r["workload"] == row["workload"]
                    and r["system"] == "dynamo kv"), None)
        if ref and ref["ttft_mean_ms"] and row["ttft_mean_ms"] and ref["cached_ratio"]:
            row["ttft_vs_dynamo"] = row["ttft_mean_ms"] / ref["ttft_mean_ms"]
            row["cached_vs_dynamo"] = row["cached_ratio"] / ref["cached_ratio"]
            ratios.append(row)
    table = Table(title=f"Sluice vs Dynamo 1.6.1: {WORKERS} mocker workers × {KV_BLOCKS} blocks of {BLOCK}, real time")
    for col in ("round", "workload", "system", "requests", "errors", "cached", "TTFT mean", "p50", "p90",
                "TTFT / Dynamo", "cached / Dynamo"):
        table.add_column(col)
    for r in runs:
        table.add_row(str(r["round"]), r["workload"], r["system"], str(r["requests"]), str(r["errors"]),
                      f"{r['cached_ratio']:.3f}", f"{r['ttft_mean_ms'] or 0:.1f}", f"{r['ttft_p50_ms'] or 0:.1f}",
                      f"{r['ttft_p90_ms'] or 0:.1f}", f"{r.get('ttft_vs_dynamo', float('nan')):.2f}",
                      f"{r.get('cached_vs_dynamo', float('nan')):.2f}")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"workers": WORKERS, "kv_blocks": KV_BLOCKS, "block_size": BLOCK,
                                    "seed": args.seed, "runs": runs}, indent=1, default=str))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
