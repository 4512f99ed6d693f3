"""A background loop owned by one object: started once, woken or ticking, stopped by cancelling.

Usage::

    self._loop = BackgroundLoop("usage-shipper", self.flush, interval_s=1.0, backoff=Backoff(1.0))
    self._loop.start()       # on the running event loop; does nothing while the loop already runs
    self._loop.wake()        # never blocks: run the step soon
    await self._loop.stop()  # cancel and wait until it has ended; does nothing when not running

Invariants:

* The loop waits until it is woken or ``interval_s`` has passed since the last step ended (without an
  interval it waits for a wake only), then runs ``step`` once. Wakes coalesce: any number of wakes
  while it waits give one step. The wake flag is cleared just before a step starts, so a wake that
  arrives during a step is never lost: it gives one more step.
* A step that raises is logged (its traceback the first time in a row, one line afterwards), handed
  to ``on_error``, and run again after a pause of ``backoff.delay_s(n)`` for the n-th failure in a
  row; a step that returns, or :meth:`BackgroundLoop.reset_backoff`, starts the count afresh. Wakes
  during a pause add nothing. No failure ends the loop, and every retry sleeps first: a step that
  fails at once (its connection gone) cannot starve the event loop.
* :meth:`BackgroundLoop.stop` cancels the loop wherever it waits or pauses. A step in progress is
  cancelled too, unless the loop was made with ``finish_step_on_stop=True`` (a flush that must not
  be cut between sending and knowing it was sent): then the step ends first and no other follows.

Every caller is on the event loop that started the loop: the wake flag is an :class:`asyncio.Event`,
not thread-safe. One-off coroutines that only need accounting for belong to ``core.background``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Beyond this many failures in a row the pause no longer grows (and ``factor ** n`` cannot overflow).
_MAX_GROWTH_STEPS = 64


@dataclass(frozen=True, slots=True)
class Backoff:
    """Pauses between retries: ``first_s`` after the first failure in a row, multiplied by ``factor``
    after each further one, up to ``max_s`` (and never below ``first_s``, whatever ``max_s`` says)."""

    first_s: float = 0.5
    max_s: float = 5.0
    factor: float = 2.0

    def delay_s(self, failures: int) -> float:
        """The pause after the ``failures``-th failure in a row (1, 2, ...)."""
        grown = self.first_s * self.factor ** min(max(failures - 1, 0), _MAX_GROWTH_STEPS)
        return max(self.first_s, min(self.max_s, grown))


Step = Callable[[], Awaitable[None]]
ErrorHook = Callable[[Exception], None]


class BackgroundLoop:
    def __init__(self, name: str, step: Step, *, interval_s: float | None = None, backoff: Backoff = Backoff(),
                 on_error: ErrorHook | None = None, finish_step_on_stop: bool = False) -> None:
        self.name = name  # the task's name, and what the failure warnings call it
        self.interval_s = interval_s
        self.backoff = backoff
        self.failures = 0  # failures in a row of the current step
        self._step = step
        self._on_error = on_error
        self._finish_step_on_stop = finish_step_on_stop
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_step = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the loop (waiting for its first wake or tick); a no-op while it runs."""
        if self.running:
            return
        self.failures = 0
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    def wake(self) -> None:
        """Run the step soon; wakes before it starts coalesce into one step."""
        self._wake.set()

    def reset_backoff(self) -> None:
        """The step in progress made progress (a session connected): its next failure pauses ``first_s``."""
        self.failures = 0

    async def stop(self) -> None:
        """Cancel the loop and wait until it has ended; a no-op when it is not running."""
        task, self._task = self._task, None
        if task is None:
            return
        if not (self._finish_step_on_stop and self._in_step):
            task.cancel()
        # asyncio.wait, not ``await task``: a cancellation of the caller itself still propagates.
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended with an error", self.name, exc_info=task.exception())

    async def _run(self) -> None:
        me = asyncio.current_task()
        while self._task is me:  # stop() forgets the task: a step let finish is the last one
            if self.failures:
                await asyncio.sleep(self.backoff.delay_s(self.failures))
            else:
                await self._wait()
            self._wake.clear()
            self._in_step = True
            try:
                await self._step()
            except Exception as exc:  # noqa: BLE001 - a background loop outlives its failures
                self._failed(exc)
            else:
                self.failures = 0
            finally:
                self._in_step = False

    async def _wait(self) -> None:
        if self.interval_s is None:
            await self._wake.wait()
            return
        try:
            async with asyncio.timeout(self.interval_s):
                await self._wake.wait()
        except TimeoutError:
            pass

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        delay = self.backoff.delay_s(self.failures)
        if self.failures == 1:
            log.warning("%s failed; retrying in %.2f s", self.name, delay, exc_info=exc)
        else:
            log.warning("%s failed again (%d in a row): %r; retrying in %.2f s", self.name, self.failures, exc, delay)
        if self._on_error is not None:
            try:
                self._on_error(exc)
            except Exception:  # noqa: BLE001 - the hook must not end the loop either
                log.exception("%s: the failure hook failed", self.name)
