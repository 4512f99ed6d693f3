"""One streamed completion, traced: when each piece of text arrived, the whole text, the status,
the serving worker and ``Retry-After``. The reliability bench compares traces of the same request
with and without a failure (aiohttp, the caller's session)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import orjson

WORKER_HEADER = "x-sluice-worker"


@dataclass(slots=True)
class Trace:
    """``sent_at``, ``token_times`` and ``ended_at`` are ``time.perf_counter()`` readings; a chunk
    with text counts as one arrival. ``ok``: status 200, no error event, some text."""

    status: int = 0
    sent_at: float = field(default_factory=time.perf_counter)
    ended_at: float = 0.0
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    worker: str | None = None
    retry_after: str | None = None
    error: str | None = None
    #: The ``code`` of an error event (``stream_interrupted``, ``worker_lost``...).
    error_code: str | None = None
    #: From the usage event (``stream_options.include_usage``): prompt tokens, and those the engine reused.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and bool(self.token_times)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.sent_at if self.token_times else None

    @property
    def first_token_s(self) -> float:
        """The TTFT of a trace that has a token (every ``ok`` one)."""
        if not self.token_times:
            raise ValueError("no token arrived on this trace")
        return self.token_times[0] - self.sent_at

    @property
    def total_s(self) -> float:
        return self.ended_at - self.sent_at

    @property
    def max_gap_s(self) -> float:
        """The longest wait between two arrivals: the pause a client saw mid-stream."""
        times = self.token_times
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """The JSON events of a streamed answer (``[DONE]`` and comments left out)."""
    async for raw in resp.content:
        line = raw.strip()
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            yield orjson.loads(line[5:])


async def stream_trace(session: aiohttp.ClientSession, url: str, body: dict, headers: dict[str, str] | None = None,
                       on_text: Callable[[Trace], None] | None = None) -> Trace:
    """Stream one completion (``/v1/completions`` or chat); ``on_text(trace)`` after each arrival.
    Failures (a status other than 200, an error event, a broken connection) end up in the trace."""
    trace = Trace()
    pieces: list[str] = []
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            trace.status = resp.status
            trace.worker = resp.headers.get(WORKER_HEADER)
            trace.retry_after = resp.headers.get("Retry-After")
            if resp.status != 200:
                trace.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return trace
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = orjson.loads(data)
                if "error" in event:
                    trace.error = str(event["error"])
                    trace.error_code = (event["error"] or {}).get("code")
                    break
                usage = event.get("usage")
                if usage:
                    trace.prompt_tokens, trace.completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
                    trace.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                for choice in event.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content") or choice.get("text")
                    if text:
                        trace.token_times.append(time.perf_counter())
                        pieces.append(text)
                        if on_text is not None:
                            on_text(trace)
    except (TimeoutError, aiohttp.ClientError) as exc:
        trace.error = repr(exc)
    finally:
        trace.text = "".join(pieces)
        trace.ended_at = time.perf_counter()
    return trace
