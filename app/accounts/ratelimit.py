"""Per-key request and token rates, counted in Redis so that every frontend replica shares them.

Fixed one-minute windows (``core.keys.RATE_WINDOW_S``), numbered ``floor(unix_time / 60)`` on the
frontend's clock (frontends are expected to keep NTP time; a skewed clock only shifts where its
windows start). Each key has one hash per window, ``r`` requests admitted and ``t`` tokens charged.

* Admission is one round trip: a Lua script checks both limits and counts the request, atomically,
  so a burst from many replicas admits exactly ``rpm`` requests per window. A refused request is
  not counted.
* Tokens (prompt + completion) are charged when a request finishes, because the completion's length
  is unknown before. A request is admitted while the window's charged tokens plus its prompt fit in
  ``tpm``; requests already running when the limit is crossed still finish, so a key can overshoot
  ``tpm`` by what it had in flight. Charges are batched: one pipelined round trip per wake-up.
* A refusal's Retry-After is the time left in the window, rounded up (at least 1 s).
* A prompt larger than the whole ``tpm`` can never be admitted: that is a 400, not a 429.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from core.errors import InvalidRequest, RateLimited
from core.keys import RATE_WINDOW_S, RATE_WINDOW_TTL_S, Keys
from core.loops import BackgroundLoop, Backoff
from core.lua import lua_script

log = logging.getLogger(__name__)



def window_of(now: float) -> int:
    return int(now // RATE_WINDOW_S)


def retry_after_s(now: float) -> int:
    """Whole seconds until the window containing ``now`` ends (at least 1)."""
    return max(1, math.ceil((window_of(now) + 1) * RATE_WINDOW_S - now))


#: The first pause before retrying charges Redis refused (it grows while Redis stays away).
CHARGE_RETRY_S = 1.0


class RateLimiter:
    def __init__(self, client: aioredis.Redis, keys: Keys, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.keys = keys
        self.clock = clock
        self._admit = client.register_script(lua_script("app.accounts", "admit.lua"))
        self._charges: defaultdict[str, int] = defaultdict(int)
        # A flush in progress at close() is let finish: cut, its charges would be neither kept nor counted.
        self._charger = BackgroundLoop("rate-charges", self.flush, backoff=Backoff(first_s=CHARGE_RETRY_S),
                                       finish_step_on_stop=True)

    async def admit(self, key_id: str, rpm: int | None, tpm: int | None, prompt_tokens: int) -> None:
        """Count one request against the key's current window, or raise RateLimited (nothing counted)."""
        if rpm is None and tpm is None:
            return
        if tpm is not None and prompt_tokens > tpm:
            raise InvalidRequest(f"The prompt has {prompt_tokens} tokens, more than this key may use in a minute "
                                 f"({tpm} tokens per minute): it can never be admitted.", code="request_too_large")
        now = self.clock()
        verdict = await self._admit(keys=[self.keys.rate(key_id, window_of(now))],
                                    args=[-1 if rpm is None else rpm, -1 if tpm is None else tpm,
                                          prompt_tokens, RATE_WINDOW_TTL_S])
        if verdict == 0:
            return
        wait = retry_after_s(now)
        if verdict == 1:
            raise RateLimited(f"Rate limit reached: {rpm} requests per minute for this key. "
                              f"Try again in {wait}s.", retry_after_s=wait)
        raise RateLimited(f"Rate limit reached: {tpm} tokens per minute for this key. Try again in {wait}s.",
                          retry_after_s=wait)

    def charge(self, key_id: str, tokens: int) -> None:
        """Add ``tokens`` to the key's current window, soon (never blocks)."""
        if tokens <= 0:
            return
        self._charges[self.keys.rate(key_id, window_of(self.clock()))] += tokens
        self._charger.wake()

    async def flush(self) -> None:
        """Write the pending charges now (one pipelined round trip). Charges that fail are kept for later."""
        if not self._charges:
            return
        charges, self._charges = self._charges, defaultdict(int)
        pipe = self.client.pipeline(transaction=False)
        for key, tokens in charges.items():
            pipe.hincrby(key, "t", tokens)
            pipe.expire(key, RATE_WINDOW_TTL_S)
        try:
            await pipe.execute()
        except RedisError:
            for key, tokens in charges.items():
                self._charges[key] += tokens
            raise

    async def start(self) -> None:
        """Write charges in the background, a round trip per wake-up; failed ones are retried."""
        self._charger.start()

    async def close(self) -> None:
        await self._charger.stop()
        try:
            await self.flush()
        except RedisError as exc:
            log.warning("dropping %d pending token charges: %s", len(self._charges), exc)
