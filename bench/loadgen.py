"""A small streaming load generator for OpenAI-compatible servers (aiohttp, one keep-alive
connection pool): closed loop, fixed concurrency, per-request TTFT / inter-token latency."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson


@dataclass(frozen=True, slots=True)
class RequestResult:
    ok: bool
    ttft_s: float
    itl_s: float | None
    tokens: int
    total_s: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RunResult:
    concurrency: int
    wall_s: float
    results: list[RequestResult]


async def _one(session: aiohttp.ClientSession, url: str, body: dict) -> RequestResult:
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    chunks_with_text = 0
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                return RequestResult(False, 0, None, 0, time.perf_counter() - t0, f"HTTP {resp.status}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = orjson.loads(data)
                if "error" in event:
                    return RequestResult(False, 0, None, tokens, time.perf_counter() - t0, str(event["error"]))
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content") or choice.get("text")
                    if text:
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        chunks_with_text += 1
    except (TimeoutError, aiohttp.ClientError) as exc:
        return RequestResult(False, 0, None, tokens, time.perf_counter() - t0, repr(exc))
    if first is None:
        return RequestResult(False, 0, None, tokens, time.perf_counter() - t0, "no tokens")
    itl = (last - first) / (tokens - 1) if tokens > 1 and last is not None else None
    return RequestResult(True, first - t0, itl, tokens, time.perf_counter() - t0)


async def run_load(url: str, make_body: Callable[[int], dict], concurrency: int, requests: int,
                   timeout_s: float = 120) -> RunResult:
    """Send ``requests`` streaming requests, ``concurrency`` at a time (closed loop)."""
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        counter = iter(range(requests))
        results: list[RequestResult] = []

        async def lane() -> None:
            for i in counter:
                results.append(await _one(session, url, make_body(i)))

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return RunResult(concurrency, time.perf_counter() - t0, results)
