"""Frontend registry: each frontend's lease holds its record, and a sorted set lists the live ones.

Layout (core.keys): ``frontend:{id}`` is a string with the lease's TTL whose value is the frontend's
:class:`FrontendRecord` (JSON); ``frontends`` is a sorted set of frontend ids scored by lease expiry
(unix seconds). Workers only ask whether a frontend's lease exists (workers.host drops the requests
of a frontend without one); ``sluice status`` and the Prometheus discovery read the records. Every
renewal also drops the entries whose lease ended more than :data:`FORGET_AFTER_S` ago, so the set
stays as small as the number of frontends that ran lately.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import cast

import redis.asyncio as aioredis

from core.keys import Keys
from core.redis_values import text

#: How long a frontend whose lease ended stays in the sorted set (it is listed as live only while its
#: lease lasts).
FORGET_AFTER_S = 600.0


#: The counters of :class:`LoadCounters`, in the order a record's ``load`` lists them.
LOAD_FIELDS = (
    "arrived", "finished", "input_tokens", "output_tokens", "ttft_s", "ttft_n", "decode_s", "gaps", "context_tokens",
)


def decode_context_tokens(prompt_tokens: int, completion_tokens: int) -> float:
    """A request's generated tokens times the mean context they were generated at."""
    return completion_tokens * (prompt_tokens + completion_tokens / 2)


@dataclass(slots=True)
class LoadCounters:
    """What one frontend process served of one model since it started (counters only grow): the load the
    planner reads (planner.observe), which differences two readings to get an interval's rate, mean input
    and output lengths, mean TTFT and mean ITL.

    ``arrived`` counts requests as they are routed; the rest count finished requests: prompt and generated
    tokens, the TTFT of those that streamed a token (``ttft_s`` summed over ``ttft_n``), and their decode
    time (first token to last, ``decode_s``) over the gaps between their tokens (``gaps``): ``decode_s /
    gaps`` is the interval's token-weighted mean ITL.
    """

    arrived: int = 0
    finished: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    ttft_n: int = 0
    decode_s: float = 0.0
    gaps: int = 0
    #: Each finished request's generated tokens times the context they were generated at, on average its
    #: prompt and half its answer (:func:`decode_context_tokens`): over ``output_tokens``, the context the
    #: interval's decode steps held, weighted by tokens (a mix of long prompts with short answers and short
    #: prompts with long ones holds less than its mean lengths say).
    context_tokens: float = 0.0

    def as_list(self) -> list[float]:
        return [getattr(self, name) for name in LOAD_FIELDS]

    @classmethod
    def from_list(cls, values: list[float]) -> LoadCounters:
        """Counters from a record's list; a shorter list (an older writer) leaves the rest 0."""
        out = cls()
        for name, value in zip(LOAD_FIELDS, values, strict=False):
            setattr(out, name, type(getattr(out, name))(value))
        return out


@dataclass(frozen=True, slots=True)
class FrontendRecord:
    """What a frontend publishes with every renewal of its lease."""

    frontend_id: str
    #: Its HTTP API's base URL, and its Prometheus endpoint.
    url: str
    metrics_url: str
    #: The deployment's routing mode (requests may override it).
    router_mode: str
    started_at: float
    #: Requests it was serving at the renewal.
    in_flight: int = 0
    updated_at: float = 0.0
    #: Per model, the :class:`LoadCounters` since the frontend started, as lists (``LOAD_FIELDS``).
    load: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LiveFrontend:
    record: FrontendRecord
    lease_expires_at: float


_FIELDS = frozenset(f.name for f in fields(FrontendRecord))


def decode_record(raw: bytes | str) -> FrontendRecord | None:
    """A record from a lease's value; None for a value that holds none (a frontend of an older release
    wrote ``1``)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or not {"frontend_id", "url", "metrics_url"} <= data.keys():
        return None
    return FrontendRecord(**{k: v for k, v in data.items() if k in _FIELDS})


class FrontendRegistry:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    async def renew(self, record: FrontendRecord, ttl_s: float) -> None:
        """Hold the frontend's lease for ``ttl_s`` more seconds, with ``record`` as its value (one round trip)."""
        now = time.time()
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.frontend_lease(record.frontend_id), json.dumps(asdict(record)), px=int(ttl_s * 1000))
            pipe.zadd(self.keys.frontends, {record.frontend_id: now + ttl_s})
            pipe.zremrangebyscore(self.keys.frontends, "-inf", now - FORGET_AFTER_S)
            await pipe.execute()

    async def remove(self, frontend_id: str) -> None:
        """End the lease now (a clean shutdown): workers drop the frontend's requests without waiting."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.frontend_lease(frontend_id))
            pipe.zrem(self.keys.frontends, frontend_id)
            await pipe.execute()

    async def live(self) -> list[LiveFrontend]:
        """Frontends whose lease has not ended, in two round trips."""
        entries = cast(list[tuple[bytes, float]], await self.client.zrangebyscore(
            self.keys.frontends, time.time(), "+inf", withscores=True))
        if not entries:
            return []
        values = await self.client.mget([self.keys.frontend_lease(text(fid)) for fid, _ in entries])
        out = []
        for (_, expiry), raw in zip(entries, values, strict=True):
            record = decode_record(raw) if raw is not None else None
            if record is not None:
                out.append(LiveFrontend(record, float(expiry)))
        return out
