"""Redis restarts under load: two mocker workers (speedup 1) and a few clients that keep long
streams open (each opens the next when its stream ends; after a 503 it waits what ``Retry-After``
says). ``restarts`` times: Redis is stopped (``SHUTDOWN NOSAVE``: it comes back empty), probed
with requests while it is away (expected: 503 with ``Retry-After``, at once), started again on the
same port, and timed from the moment it answers a PING to the first request served again. The
probes that fail meanwhile are counted by status; one that gets no answer within
``probe_timeout_s`` counts as hung (a request admitted before the frontend has subscribed to its
token channel again can lose every token and wait for them).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import aiohttp
import redis

from bench.devstack import RedisServer
from bench.reliability.stack import MODEL, completion, mocker_stack
from bench.sse_trace import Trace, stream_trace
from bench.stats import pct


@dataclass(frozen=True, slots=True)
class RestartConfig:
    restarts: int = 5
    outage_s: float = 2.0
    streams: int = 4
    #: Long enough to be in flight when Redis goes (about 6 ms a token at speedup 1).
    stream_tokens: int = 2000
    #: Streams run this long after service is back before the next stop.
    settle_s: float = 3.0
    probe_interval_s: float = 0.1
    #: A probe not answered by then counts as hung (a request can wait for tokens that were lost).
    probe_timeout_s: float = 5.0
    recovery_timeout_s: float = 60.0


@dataclass
class _Clients:
    """The streaming clients' outcomes and their streams now open."""

    outcomes: Counter = field(default_factory=Counter)
    current: dict[int, Trace] = field(default_factory=dict)

    def in_flight(self) -> int:
        return sum(1 for t in self.current.values() if t.token_times and not t.ended_at)


async def _client(session: aiohttp.ClientSession, url: str, i: int, cfg: RestartConfig, clients: _Clients) -> None:
    n = 0
    while True:
        body = completion(f"Stream {i}.{n}: tell me everything.", cfg.stream_tokens)
        trace = await stream_trace(session, url, body, on_text=lambda t: clients.current.__setitem__(i, t))
        n += 1
        if trace.ok:
            clients.outcomes["completed"] += 1
        elif trace.status == 200:
            clients.outcomes[f"error event {trace.error_code}" + ("" if trace.token_times else " before text")] += 1
            await asyncio.sleep(0.5)
        else:
            clients.outcomes[f"HTTP {trace.status}"] += 1
            await asyncio.sleep(float(trace.retry_after or 1))


async def _post(session: aiohttp.ClientSession, url: str, body: dict, timeout_s: float) -> tuple[int, float, str | None]:
    """Status (0: no answer within ``timeout_s``), latency and ``Retry-After`` of one request."""
    t0 = time.perf_counter()
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
            return resp.status, time.perf_counter() - t0, resp.headers.get("Retry-After")
    except (TimeoutError, aiohttp.ClientError):
        return 0, time.perf_counter() - t0, None


def _status_name(status: int, cfg: RestartConfig) -> str:
    return str(status) if status else f"no answer in {cfg.probe_timeout_s:.0f} s"


def _shutdown(server: RedisServer) -> None:
    """``SHUTDOWN NOSAVE``, then reap the process (``RedisServer.start`` makes a new one)."""
    client = redis.Redis.from_url(server.url)
    try:
        client.shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # the server closed the connection as it went
    finally:
        client.close()
    assert server.proc is not None
    server.proc.wait(10)
    server.proc = None


async def _cycles(server: RedisServer, base_url: str, cfg: RestartConfig) -> dict:
    url = f"{base_url}/v1/completions"
    probe = completion("Are you there?", 4, stream=False)
    clients = _Clients()
    probes: list[tuple[int, float, str | None]] = []
    recoveries, in_flight = [], []
    recovering: Counter = Counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        tasks = [asyncio.create_task(_client(session, url, i, cfg, clients)) for i in range(cfg.streams)]
        for _ in range(cfg.restarts):
            await asyncio.sleep(cfg.settle_s)
            in_flight.append(clients.in_flight())
            await asyncio.to_thread(_shutdown, server)
            down_until = time.perf_counter() + cfg.outage_s
            while time.perf_counter() < down_until:
                probes.append(await _post(session, url, probe, cfg.probe_timeout_s))
                await asyncio.sleep(cfg.probe_interval_s)
            await asyncio.to_thread(server.start)
            back = time.perf_counter()
            while (status := (await _post(session, url, probe, cfg.probe_timeout_s))[0]) != 200:
                recovering[_status_name(status, cfg)] += 1
                if time.perf_counter() - back > cfg.recovery_timeout_s:
                    raise TimeoutError(f"nothing served {cfg.recovery_timeout_s:.0f}s after Redis came back")
                await asyncio.sleep(0.05)
            recoveries.append(time.perf_counter() - back)
        for task in tasks:  # a long stream would hold the end up for seconds
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    refused = [p for p in probes if p[0] == 503]
    latency_ms = [p[1] * 1000 for p in refused]
    return {
        "recovery_s": {"p50": pct(recoveries, 50), "max": max(recoveries), "each": recoveries},
        "streams_in_flight_at_stop": in_flight,
        "outage_probes": len(probes), "outage_503": len(refused),
        "outage_503_with_retry_after": sum(p[2] is not None for p in refused),
        "outage_other_statuses": dict(Counter(_status_name(p[0], cfg) for p in probes if p[0] != 503)),
        "outage_503_ms": {"p50": pct(latency_ms, 50), "p99": pct(latency_ms, 99), "max": max(latency_ms, default=None)},
        "recovery_probe_failures": dict(recovering),
        "stream_outcomes": dict(clients.outcomes),
    }


def measure(cfg: RestartConfig) -> dict:
    with mocker_stack(["rr0", "rr1"], {"SLUICE_WORKER__MOCKER__SPEEDUP": "1"}, "rr") as (server, stack):
        result = asyncio.run(_cycles(server, stack.base_url, cfg))
    return {"config": {"model": MODEL, "workers": 2, "speedup": 1, **asdict(cfg)}, **result}
