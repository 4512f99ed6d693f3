"""A soak: many concurrent streams on one frontend for a while (closed loop: each of
``concurrency`` clients sends its next streamed completion as soon as the last one ends; the
clients start over the first half of the warm-up), mocker workers slowed down so that the streams
stay open (at speedup 0.04 with 1,000 streams a worker, a 32-token stream takes about 15 s) and
the frontend keeps up with the tokens on a small machine. Reported: errors (any status other than
200, error event or broken stream), requests, TTFT and total time of the requests sent after the
warm-up, and the frontend process's resident memory after the warm-up, at the end of the load and
once idle again (a leak shows as growth between the first two, both taken under the same load).

Admission control would refuse requests when hundreds at a time wait for their first token (the
slowed-down prefill), so the bound on waiting requests is raised to the concurrency and each
mocker may run its share of the streams at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import aiohttp
import psutil

from bench.reliability.stack import MODEL, completion, mocker_stack
from bench.sse_trace import Trace, stream_trace
from bench.stats import pct


@dataclass(frozen=True, slots=True)
class SoakConfig:
    seconds: float = 60.0
    concurrency: int = 2000
    #: Not measured: the clients start one after another over its first half (a ramp: started
    #: together, they would stay in lockstep, every request arriving in the same engine step); by
    #: its end the first requests have ended and the next ones run (at the default speed).
    warmup_s: float = 20.0
    workers: int = 2
    #: Mocker speed (1: the timing model); slow enough that the frontend keeps up with the tokens.
    speedup: float = 0.04
    max_tokens: int = 32
    rss_interval_s: float = 1.0
    timeout_s: float = 300.0

    def env(self) -> dict[str, str]:
        per_worker = -(-self.concurrency // self.workers)
        return {"SLUICE_WORKER__MOCKER__SPEEDUP": str(self.speedup),
                "SLUICE_WORKER__MOCKER__MAX_NUM_SEQS": str(max(256, per_worker)),
                "SLUICE_FRONTEND__MAX_WAITING_PER_WORKER": str(max(256, self.concurrency))}


@dataclass
class _Frontend:
    """The frontend process's resident memory (MiB) and CPU time (s) along the run."""

    process: psutil.Process
    series_mib: list[float] = field(default_factory=list)
    warm_mib: float | None = None
    warm_cpu_s: float = 0.0
    end_mib: float = 0.0
    end_cpu_s: float = 0.0
    idle_mib: float = 0.0

    def rss_mib(self) -> float:
        return self.process.memory_info().rss / 2**20

    def cpu_s(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system


async def _load(url: str, cfg: SoakConfig, frontend: _Frontend) -> tuple[list[Trace], tuple[float, float]]:
    """Runs the closed loop, sampling the frontend; returns every trace and the measured window
    (warm-up end, load end)."""
    traces: list[Trace] = []
    t0 = time.perf_counter()
    warm_at, stop_at = t0 + min(cfg.warmup_s, cfg.seconds / 2), t0 + cfg.seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as session:

        async def client(i: int) -> None:
            await asyncio.sleep((warm_at - t0) / 2 * i / cfg.concurrency)  # a ramp: no lockstep waves
            while time.perf_counter() < stop_at:
                traces.append(await stream_trace(session, url, completion(f"Soak {i}: tell a story.", cfg.max_tokens)))
                i += cfg.concurrency

        async def sample() -> None:
            while (now := time.perf_counter()) < stop_at:
                mib = frontend.rss_mib()
                frontend.series_mib.append(round(mib, 1))
                if frontend.warm_mib is None and now >= warm_at:
                    frontend.warm_mib, frontend.warm_cpu_s = mib, frontend.cpu_s()
                await asyncio.sleep(min(cfg.rss_interval_s, max(0.0, stop_at - time.perf_counter())))
            frontend.end_mib, frontend.end_cpu_s = frontend.rss_mib(), frontend.cpu_s()

        await asyncio.gather(sample(), *(client(i) for i in range(cfg.concurrency)))
    frontend.idle_mib = frontend.rss_mib()
    return traces, (warm_at, stop_at)


def measure(cfg: SoakConfig) -> dict:
    with mocker_stack([f"soak{i}" for i in range(cfg.workers)], cfg.env(), "soak") as (_, stack):
        fe = _Frontend(psutil.Process(stack.procs["frontend"].popen.pid))
        traces, (warm_at, stop_at) = asyncio.run(_load(f"{stack.base_url}/v1/completions", cfg, fe))
    failed = [t for t in traces if not t.ok]
    measured = [t for t in traces if t.ok and t.sent_at >= warm_at]
    ms = lambda values: {"p50": pct(values, 50), "p99": pct(values, 99), "max": max(values, default=None)}  # noqa: E731
    return {
        "config": {"model": MODEL, **asdict(cfg), "env": cfg.env()},
        "requests": len(traces), "errors": len(failed),
        "error_kinds": dict(Counter((t.error or "no text")[:80] for t in failed).most_common(5)),
        "measured_requests": len(measured),
        "req_per_s": sum(warm_at <= t.ended_at <= stop_at for t in traces if t.ok) / (stop_at - warm_at),
        "ttft_ms": ms([t.first_token_s * 1000 for t in measured]),
        "total_ms": ms([t.total_s * 1000 for t in measured]),
        "frontend_cpu_percent": 100 * (fe.end_cpu_s - fe.warm_cpu_s) / (stop_at - warm_at) if fe.warm_mib else None,
        "rss_warm_mib": fe.warm_mib, "rss_end_mib": fe.end_mib, "rss_idle_mib": fe.idle_mib,
        "rss_growth": fe.end_mib / fe.warm_mib - 1 if fe.warm_mib else None,
        "rss_series_mib": fe.series_mib,
    }
