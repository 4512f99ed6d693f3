"""What a migration costs a client: two mocker workers (speedup 1), the same greedy requests run
twice on the same stack, pinned alternately to each worker: once undisturbed (the reference), once
with one worker killed (SIGKILL) mid-stream.

Each run sends its requests in two waves. The first half starts at once; when every first-wave
stream on the doomed worker has streamed ``kill_after`` pieces of text, the kill run kills that
worker, and both runs send the second half right away, so that half the doomed worker's requests
are mid-stream when it dies and half reach it only afterwards, while its lease still names it
live (they wait in its queue and have streamed nothing). The frontend moves both kinds to the
other worker once the lease expires. Compared, per request, with the same request in the
reference run: the text (token-exact), TTFT (the extra TTFT of requests that had not streamed),
the longest pause between two pieces of text, and the total time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from bench.devstack import Stack
from bench.reliability.stack import MODEL, completion, counter, mocker_stack, pinned
from bench.sse_trace import Trace, stream_trace
from bench.stats import pct

VICTIM, SURVIVOR = "victim", "survivor"
MIGRATIONS = "sluice_request_migrations_total"


@dataclass(frozen=True, slots=True)
class MigrationConfig:
    requests: int = 32
    max_tokens: int = 400
    #: Pieces of text every first-wave stream on the victim has received when it is killed.
    kill_after: int = 100
    timeout_s: float = 120.0


def _worker_of(i: int) -> str:
    return (VICTIM, SURVIVOR)[i % 2]


def _body(i: int, cfg: MigrationConfig) -> dict:
    return completion(f"Request {i}: tell me a long story about the sea.", cfg.max_tokens)


async def _until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.005)


async def _run(stack: Stack, cfg: MigrationConfig, kill: bool) -> tuple[list[Trace], float | None]:
    """One run of both waves; returns the traces in request order and when the victim was killed."""
    url = f"{stack.base_url}/v1/completions"
    half = cfg.requests // 2
    arrived = [0] * cfg.requests
    killed_at = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as session:
        def launch(i: int) -> asyncio.Task[Trace]:
            def seen(trace: Trace) -> None:
                arrived[i] = len(trace.token_times)
            return asyncio.create_task(stream_trace(session, url, _body(i, cfg), pinned(_worker_of(i)), seen))

        tasks = [launch(i) for i in range(half)]
        watched = [i for i in range(half) if _worker_of(i) == VICTIM]

        def reached() -> bool:
            if any(tasks[i].done() and arrived[i] < cfg.kill_after for i in watched):
                raise RuntimeError(f"a stream ended before {cfg.kill_after} pieces of text: more tokens needed")
            return all(arrived[i] >= cfg.kill_after for i in watched)
        await _until(reached, cfg.timeout_s, f"the victim's streams to reach {cfg.kill_after} pieces")
        if kill:
            await asyncio.to_thread(stack.kill, VICTIM)
            killed_at = time.perf_counter()
        tasks += [launch(i) for i in range(half, cfg.requests)]
        return list(await asyncio.gather(*tasks)), killed_at


def _ms(values: list[float]) -> dict:
    ms = [v * 1000 for v in values]
    return {"p50": pct(ms, 50), "p99": pct(ms, 99), "max": max(ms) if ms else None}


def _group(name: str, ids: list[int], ref: list[Trace], run: list[Trace], extra_ttft: bool) -> dict:
    pairs = [(ref[i], run[i]) for i in ids if ref[i].ok and run[i].ok]
    return {
        "group": name, "streams": len(ids),
        "ttft_ms": _ms([r.first_token_s for _, r in pairs]),
        "extra_ttft_ms": _ms([r.first_token_s - f.first_token_s for f, r in pairs]) if extra_ttft else None,
        "longest_pause_ms": _ms([r.max_gap_s for _, r in pairs]),
        "total_ms": _ms([r.total_s for _, r in pairs]),
        "total_vs_reference_p50": pct([r.total_s / f.total_s for f, r in pairs], 50),
    }


def measure(cfg: MigrationConfig) -> dict:
    env = {"SLUICE_WORKER__MOCKER__SPEEDUP": "1"}
    with mocker_stack([VICTIM, SURVIVOR], env, "mig") as (_, stack):
        asyncio.run(_run(stack, MigrationConfig(requests=4, max_tokens=8, kill_after=1), kill=False))  # warm-up
        ref, _ = asyncio.run(_run(stack, cfg, kill=False))
        before = counter(stack.base_url, MIGRATIONS)
        run, killed_at = asyncio.run(_run(stack, cfg, kill=True))
        migrations = counter(stack.base_url, MIGRATIONS) - before
    assert killed_at is not None
    on_victim = [i for i in range(cfg.requests) if _worker_of(i) == VICTIM]
    mid = [i for i in on_victim if run[i].token_times and run[i].token_times[0] < killed_at]
    before_first = [i for i in on_victim if i not in mid]
    undisturbed = [i for i in range(cfg.requests) if _worker_of(i) == SURVIVOR]
    groups = [_group("migrated mid-stream", mid, ref, run, False),
              _group("migrated before its first token", before_first, ref, run, True),
              _group("undisturbed (other worker)", undisturbed, ref, run, False),
              _group("reference run (no kill)", list(range(cfg.requests)), ref, ref, False)]
    migrated_total = pct([run[i].total_s for i in on_victim if run[i].ok], 50)
    undisturbed_total = pct([run[i].total_s for i in undisturbed if run[i].ok], 50)
    return {
        "config": {"model": MODEL, "workers": 2, "speedup": 1, **dataclasses.asdict(cfg)},
        "migrations": migrations,
        "errors": sum(not t.ok for t in run), "reference_errors": sum(not t.ok for t in ref),
        "first_error": next((t.error for t in (*ref, *run) if t.error), None),
        "token_exact": sum(r.ok and r.text == f.text for f, r in zip(ref, run, strict=True)),
        "compared": cfg.requests,
        "migrated_over_undisturbed_total": (migrated_total / undisturbed_total
                                            if migrated_total and undisturbed_total else None),
        "groups": groups,
    }
