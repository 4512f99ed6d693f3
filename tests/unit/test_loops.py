"""core.loops.BackgroundLoop: start/stop idempotence, wake coalescing, interval ticks, failures paused
with a growing backoff and retried, stopping wherever the loop is."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from core.loops import BackgroundLoop, Backoff


class Steps:
    """A step that records its calls; it fails while ``failures_left`` is positive."""

    def __init__(self, failures: int = 0, hold: asyncio.Event | None = None) -> None:
        self.calls: list[float] = []
        self.failures_left = failures
        self.hold = hold  # when set, each step waits for it (a step "in progress")
        self.entered = asyncio.Event()
        self.finished = 0

    async def __call__(self) -> None:
        self.calls.append(time.monotonic())
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.failures_left > 0:
            self.failures_left -= 1
            raise ConnectionError(f"down ({self.failures_left} more)")
        self.finished += 1


async def settle() -> None:
    """Let every ready callback run (a few loop turns)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_backoff_grows_caps_and_never_goes_below_the_first_pause() -> None:
    b = Backoff(first_s=0.5, max_s=5.0)
    assert [b.delay_s(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.delay_s(10_000) == 5.0  # no overflow however long the outage
    assert Backoff(first_s=2.0, max_s=1.0).delay_s(3) == 2.0
    assert Backoff(first_s=0.1, max_s=1.0, factor=3.0).delay_s(3) == pytest.approx(0.9)


async def test_start_and_stop_are_idempotent_and_a_stopped_loop_starts_afresh() -> None:
    step = Steps()
    loop = BackgroundLoop("t-idem", step)
    await loop.stop()  # never started: nothing to do
    loop.start()
    first = loop._task
    loop.start()
    assert loop._task is first and loop.running
    loop.wake()
    await settle()
    assert len(step.calls) == 1  # one task, so one step per wake
    await loop.stop()
    await loop.stop()
    assert not loop.running and first is not None and first.cancelled()
    loop.start()
    loop.wake()
    await settle()
    assert len(step.calls) == 2
    await loop.stop()


async def test_without_an_interval_it_runs_only_when_woken() -> None:
    step = Steps()
    loop = BackgroundLoop("t-wake-only", step)
    loop.start()
    await asyncio.sleep(0.05)
    assert step.calls == []
    loop.wake()
    await settle()
    assert len(step.calls) == 1
    await loop.stop()


async def test_wakes_before_a_step_coalesce_and_a_wake_during_a_step_gives_one_more() -> None:
    hold = asyncio.Event()
    step = Steps(hold=hold)
    loop = BackgroundLoop("t-coalesce", step)
    loop.start()
    for _ in range(5):
        loop.wake()
    await step.entered.wait()
    assert len(step.calls) == 1  # five wakes, one step
    for _ in range(3):
        loop.wake()  # arrive while the step runs: not lost, and coalesced
    hold.set()
    await settle()
    assert len(step.calls) == 2 and step.finished == 2
    await asyncio.sleep(0.02)
    assert len(step.calls) == 2  # nothing more without a new wake
    await loop.stop()


async def test_interval_ticks_without_wakes_and_a_wake_cuts_the_wait_short() -> None:
    step = Steps()
    loop = BackgroundLoop("t-tick", step, interval_s=0.02)
    loop.start()
    await asyncio.sleep(0.15)
    ticks = len(step.calls)
    assert 3 <= ticks <= 8
    gaps = [b - a for a, b in zip(step.calls, step.calls[1:], strict=False)]
    assert min(gaps) >= 0.015  # measured from one step's end to the next: no busy ticking
    await loop.stop()

    slow = BackgroundLoop("t-tick-slow", step, interval_s=60)
    slow.start()
    slow.wake()
    await settle()
    assert len(step.calls) == ticks + 1  # woken long before its tick
    await slow.stop()


async def test_a_failing_step_is_retried_after_a_growing_pause_then_the_count_resets(
        caplog: pytest.LogCaptureFixture) -> None:
    errors: list[Exception] = []
    step = Steps(failures=3)
    loop = BackgroundLoop("t-retry", step, backoff=Backoff(first_s=0.02, max_s=1.0), on_error=errors.append)
    loop.start()
    with caplog.at_level(logging.WARNING, logger="core.loops"):
        loop.wake()  # one wake: the retries need none
        for _ in range(100):
            if step.finished:
                break
            await asyncio.sleep(0.01)
    assert step.finished == 1 and len(step.calls) == 4
    gaps = [b - a for a, b in zip(step.calls, step.calls[1:], strict=False)]
    for gap, pause in zip(gaps, (0.02, 0.04, 0.08), strict=True):
        assert gap >= pause * 0.9  # the loop slept before every retry
    assert [str(e) for e in errors] == ["down (2 more)", "down (1 more)", "down (0 more)"]
    assert loop.failures == 0
    warnings = [r for r in caplog.records if r.name == "core.loops"]
    assert len(warnings) == 3 and warnings[0].exc_info is not None  # a traceback once, then one-liners
    assert all(r.exc_info is None for r in warnings[1:]) and "3 in a row" in warnings[2].getMessage()
    await loop.stop()


async def test_a_step_that_fails_at_once_forever_does_not_starve_the_event_loop() -> None:
    async def broken() -> None:
        raise ConnectionError("connection gone")

    calls = 0

    async def counting() -> None:
        nonlocal calls
        calls += 1
        await broken()

    loop = BackgroundLoop("t-starve", counting, backoff=Backoff(first_s=0.01, max_s=0.02))
    loop.start()
    loop.wake()
    started = time.monotonic()
    beats = 0
    while time.monotonic() - started < 0.2:
        await asyncio.sleep(0.005)  # the rest of the loop keeps running
        beats += 1
    await loop.stop()
    assert beats >= 10
    assert 2 <= calls <= 25  # about one try per 20 ms, not thousands


async def test_a_failing_error_hook_does_not_end_the_loop() -> None:
    def hook(exc: Exception) -> None:
        raise RuntimeError("hook broke")

    step = Steps(failures=1)
    loop = BackgroundLoop("t-hook", step, backoff=Backoff(first_s=0.01), on_error=hook)
    loop.start()
    loop.wake()
    for _ in range(100):
        if step.finished:
            break
        await asyncio.sleep(0.01)
    assert step.finished == 1 and loop.running
    await loop.stop()


async def test_a_step_that_resets_the_backoff_pauses_the_first_delay_after_each_failure() -> None:
    calls: list[float] = []

    async def session() -> None:  # connects (progress), then loses the connection
        calls.append(time.monotonic())
        loop.reset_backoff()
        raise ConnectionError("lost")

    loop = BackgroundLoop("t-reset", session, backoff=Backoff(first_s=0.05, max_s=1.0))
    loop.start()
    loop.wake()
    while len(calls) < 4:
        await asyncio.sleep(0.01)
    await loop.stop()
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert all(0.045 <= gap < 0.095 for gap in gaps)  # each 0.05 s, not 0.05, 0.1, 0.2


async def test_stop_cuts_a_backoff_pause_and_a_wait_at_once() -> None:
    step = Steps(failures=1)
    pausing = BackgroundLoop("t-stop-pause", step, backoff=Backoff(first_s=30.0, max_s=30.0))
    pausing.start()
    pausing.wake()
    await step.entered.wait()
    await settle()
    assert pausing.failures == 1  # now sleeping 30 s before its retry
    started = time.monotonic()
    await pausing.stop()
    assert time.monotonic() - started < 0.5 and len(step.calls) == 1

    waiting = BackgroundLoop("t-stop-wait", Steps(), interval_s=30.0)
    waiting.start()
    await settle()
    started = time.monotonic()
    await waiting.stop()
    assert time.monotonic() - started < 0.5


async def test_stop_cancels_a_step_in_progress_by_default() -> None:
    hold = asyncio.Event()
    step = Steps(hold=hold)
    loop = BackgroundLoop("t-stop-step", step)
    loop.start()
    loop.wake()
    await step.entered.wait()
    await loop.stop()
    assert step.finished == 0  # cut in the middle
    hold.set()
    await settle()
    assert step.finished == 0 and len(step.calls) == 1


async def test_finish_step_on_stop_lets_the_step_end_and_runs_no_other() -> None:
    hold = asyncio.Event()
    step = Steps(hold=hold)
    loop = BackgroundLoop("t-stop-finish", step, finish_step_on_stop=True)
    loop.start()
    loop.wake()
    await step.entered.wait()
    loop.wake()  # would give another step, but the loop is stopping
    stopping = asyncio.ensure_future(loop.stop())
    await settle()
    assert not stopping.done()  # waits for the step
    hold.set()
    await stopping
    assert step.finished == 1 and len(step.calls) == 1 and not loop.running

    idle = BackgroundLoop("t-stop-finish-idle", Steps(), finish_step_on_stop=True)
    idle.start()
    await settle()
    started = time.monotonic()
    await idle.stop()  # not in a step: cancelled at once
    assert time.monotonic() - started < 0.5


async def test_cancelling_the_caller_of_stop_propagates() -> None:
    hold = asyncio.Event()
    loop = BackgroundLoop("t-stop-cancel", Steps(hold=hold), finish_step_on_stop=True)
    loop.start()
    loop.wake()
    await settle()
    stopping = asyncio.ensure_future(loop.stop())
    await settle()
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    hold.set()
    await settle()
