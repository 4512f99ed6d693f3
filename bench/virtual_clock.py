"""A virtual clock for simulations that talk to a real Redis: an asyncio loop whose time is simulated.

Usage::

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        runner.run(simulation())  # inside: aioredis.from_url(url, connection_class=VirtualClockConnection)

What is virtual: ``loop.time()``, hence every timer on the loop (``asyncio.sleep``, ``call_later``,
``asyncio.timeout``, redis-py's socket timeouts). It starts at 0.0 and moves only by jumps to the next
timer. ``time.time()``, ``time.perf_counter()`` and Redis's own ``TIME`` (which the routing scripts read
for prediction expiry) stay real.

The quiescence rule, applied wherever the loop would poll its selector:

* callbacks are ready (select timeout 0): poll I/O without waiting; the clock does not move;
* the next timer is due later (timeout > 0) and no Redis I/O is outstanding: poll I/O without waiting,
  and if nothing is ready, jump the clock to that timer instead of sleeping. A simulation that waits
  only on timers therefore runs as fast as the CPU allows, and its results do not depend on how fast
  that is;
* Redis I/O is outstanding (a reply awaited, a connection being opened, a write waiting for buffer
  space; counted by :class:`VirtualClockConnection`): the clock is frozen and the loop waits for real
  I/O, in slices of ``io_slice_s`` real seconds, while the timers keep waiting. Redis is instantaneous
  in virtual time, as it would be on an infinitely fast machine, and a timer can never fire early
  because a reply was slow;
* no timer at all (timeout None) and no Redis I/O outstanding: block on real I/O, as any loop does.

The slices exist so a lost reply cannot hang the loop unnoticed: after ``stall_s`` real seconds with
Redis I/O outstanding and no I/O arriving at all, the loop logs a warning and lets the clock move again
as if nothing were outstanding (until some I/O arrives), so the client's own socket timeout (a loop
timer; redis-py's default is 5 s) fails the call the normal way.

Limits:

* a blocking Redis command (``BLPOP`` with a timeout, ``WAIT``, a slow script) freezes virtual time for
  its real duration, up to ``stall_s``;
* the CPU the simulated parts spend costs zero virtual time: the router's own decision (hashing,
  packing, the Lua script inside Redis) is free in virtual time. A benchmark that wants to charge it
  must measure it in real time and add it itself;
* only I/O through :class:`VirtualClockConnection` is counted. Other sockets (a plain Redis client, an
  HTTP call) are polled before every jump but not waited for: their replies arrive "late" in virtual
  time;
* the order in which replies that are outstanding together come back, relative to each other and to
  the callbacks that run meanwhile at the same virtual instant, is real-time order; see the benchmark's
  notes on determinism.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import selectors
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis.asyncio as aioredis

log = logging.getLogger(__name__)

_Events = list[tuple[selectors.SelectorKey, int]]
_Poll = Callable[[float | None], _Events]


class _QuiescentSelector(selectors.DefaultSelector):
    """The platform's selector, whose ``select`` asks the loop how to wait."""

    def __init__(self, wait: Callable[[_Poll, float | None], _Events]) -> None:
        super().__init__()
        self._wait = wait

    def select(self, timeout: float | None = None) -> _Events:
        return self._wait(super().select, timeout)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is virtual (see the module docstring for the rule).

    ``redis_io`` counts the Redis operations in progress on this loop (:class:`VirtualClockConnection`
    keeps it); the clock never moves while it is above zero, unless the stall guard gave up.
    ``io_slice_s``: the longest single real wait while Redis I/O is outstanding. ``stall_s``: real
    seconds without any I/O, Redis I/O outstanding, after which the clock moves again.
    """

    def __init__(self, *, io_slice_s: float = 0.05, stall_s: float = 30.0) -> None:
        self._now = 0.0
        self.redis_io = 0
        self.io_slice_s = io_slice_s
        self.stall_s = stall_s
        self._stalled_since: float | None = None  # perf_counter of the first empty wait, Redis I/O outstanding
        self._stall_reported = False
        super().__init__(_QuiescentSelector(self._select))

    def time(self) -> float:
        return self._now

    @contextlib.contextmanager
    def redis_operation(self) -> Iterator[None]:
        """Hold the clock while the body awaits Redis (nestable)."""
        self.redis_io += 1
        try:
            yield
        finally:
            self.redis_io -= 1

    def _select(self, poll: _Poll, timeout: float | None) -> _Events:
        if timeout == 0:
            return poll(0)
        if self.redis_io == 0:
            self._stalled_since = None
            self._stall_reported = False
            return self._idle(poll, timeout)
        if self._stall_expired():
            events = self._idle(poll, timeout)
            if events:
                self._stalled_since = None
                self._stall_reported = False
            return events
        return self._wait_for_redis(poll)

    def _idle(self, poll: _Poll, timeout: float | None) -> _Events:
        """Nothing to wait for but timers: take ready I/O if any, else jump to the next timer."""
        if timeout is None:
            return poll(None)
        events = poll(0)
        if not events:
            self._now += timeout
        return events

    def _wait_for_redis(self, poll: _Poll) -> _Events:
        """Real waits of at most ``io_slice_s`` until I/O arrives or the stall guard expires."""
        if self._stalled_since is None:
            self._stalled_since = time.perf_counter()
        while True:
            left = self.stall_s - (time.perf_counter() - self._stalled_since)
            events = poll(min(self.io_slice_s, max(left, 0.0)))
            if events:
                self._stalled_since = None
                return events
            if left <= 0:
                return []  # the next select finds the guard expired and lets the clock move

    def _stall_expired(self) -> bool:
        if self._stalled_since is None or time.perf_counter() - self._stalled_since < self.stall_s:
            return False
        if not self._stall_reported:
            self._stall_reported = True
            log.warning("%d Redis operation(s) outstanding with no I/O for %.1f s of real time: the virtual "
                        "clock moves on (the client's socket timeout will end them)", self.redis_io, self.stall_s)
        return True


def _redis_operation() -> contextlib.AbstractContextManager[None]:
    loop = asyncio.get_running_loop()
    return loop.redis_operation() if isinstance(loop, VirtualClockLoop) else contextlib.nullcontext()


class VirtualClockConnection(aioredis.Connection):
    """A redis-py connection that tells a :class:`VirtualClockLoop` when it waits for Redis.

    Counted: ``read_response`` (what every command and every pipelined reply waits in; router.resp_channel
    sends the routing calls of a client with this connection class through the pool too), ``connect_check_health`` (both ``connect()`` and the lazy connect of
    ``send_packed_command`` go through it) and ``send_packed_command`` (a write waiting for buffer
    space). On any other loop it behaves as a plain ``Connection``.
    """

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        with _redis_operation():
            return await super().read_response(*args, **kwargs)

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        with _redis_operation():
            await super().connect_check_health(*args, **kwargs)

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        with _redis_operation():
            await super().send_packed_command(*args, **kwargs)
