"""The profiler (planner.profiler) on the mocker, whose timing is known (workers.engines.mocker.timing):
the TTFT and ITL it measures are held to the mocker's own formulas, within tolerances wide enough for a
slow, shared machine and narrow enough to catch a measurement that is 0, doubled, or of the wrong step.
The planning of the points (what fits the engine) is pure and checked exactly."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import psutil
import pytest

from core.settings import MockerSettings, Settings, WorkerSettings
from planner.profile import Profile
from planner.profiler import (
    DecodePlan,
    ProfileSpec,
    decode_points,
    decode_tokens_needed,
    prefill_lengths,
    run_profile,
    steady_gaps,
)
from workers.engines.base import EngineInfo
from workers.engines.mocker.timing import decode_ms, prefill_ms

#: Simulated time runs twice as fast: a few seconds for the whole profile, steps still milliseconds long.
SPEEDUP = 2.0
MOCKER = MockerSettings(speedup=SPEEDUP, kv_blocks=2048, block_size=16, max_num_seqs=32, max_num_batched_tokens=1024)
#: 3000 tokens are prefilled in three chunks (1024, 1024, 952); batch 16 of 1024 tokens fills half the cache.
SPEC = ProfileSpec(isls=(256, 1024, 3000), repeats=3, contexts=(256, 1024), batches=(1, 4, 16),
                   skip_tokens=2, decode_tokens=8)
#: Measured over predicted: wide, for a loaded 2-core machine (sleeps run late, never early: a suite's other
#: processes stretched 10 ms steps past 1.5x once), and still narrow enough to catch a profile that measured
#: nothing, or ten times the time.
LOW, HIGH = 0.5, 3.0


def mocker_settings(mocker: MockerSettings = MOCKER) -> Settings:
    return Settings(model="profile-test", worker=WorkerSettings(engine="mocker", mocker=mocker))


def predicted_ttft_s(isl: int, mocker: MockerSettings = MOCKER) -> float:
    """One prompt alone: one step per chunk of ``max_num_batched_tokens``, prefill time only."""
    budget = mocker.max_num_batched_tokens
    chunks = [min(budget, isl - start) for start in range(0, isl, budget)]
    return sum(prefill_ms(c) for c in chunks) / mocker.speedup / 1000


def predicted_itl_s(plan: DecodePlan, spec: ProfileSpec = SPEC, mocker: MockerSettings = MOCKER) -> float:
    """A decode step at the KV usage of ``batch`` streams each about halfway through the measured tokens
    (the first admitted ones a little further on)."""
    tokens = plan.context + spec.skip_tokens + spec.decode_tokens // 2
    usage = plan.batch * -(-tokens // mocker.block_size) / mocker.kv_blocks
    return decode_ms(usage) / mocker.speedup / 1000


def engine_info(*, block_size: int = 16, kv_blocks: int = 1000, max_num_seqs: int = 64, context_length: int = 4096,
                max_batched_tokens: int = 2048) -> EngineInfo:
    return EngineInfo(model="m", engine="mocker", block_size=block_size, kv_blocks=kv_blocks,
                      max_num_seqs=max_num_seqs, context_length=context_length, vocab_size=49152,
                      max_batched_tokens=max_batched_tokens)


@pytest.fixture(scope="module")
async def profile() -> Profile:
    lines: list[str] = []
    result = await run_profile(mocker_settings(), SPEC, progress=lines.append)
    assert any("prefill isl=3000" in line for line in lines)
    return result


# ---- planning (pure) ----
def test_prefill_lengths_are_clamped_to_the_context_and_the_cache() -> None:
    spec = ProfileSpec()
    assert prefill_lengths(spec, engine_info()) == [128, 512, 1024, 2048, 4095]
    assert prefill_lengths(spec, engine_info(kv_blocks=100)) == [128, 512, 1024, 1599]


def test_decode_points_reach_the_capacity_of_each_context() -> None:
    spec, info = ProfileSpec(), engine_info()
    # 2 * ceil(8 * 512 / 2048) admission steps + 4 skipped + 16 measured + 2
    assert decode_tokens_needed(spec, info, 512, 8) == 26
    points: dict[int, list[int]] = {}
    for plan in decode_points(spec, info):
        points.setdefault(plan.context, []).append(plan.batch)
    # 512: 29 streams of ceil((512 + 2 * 8 + 22) / 16) = 35 blocks would need 1015 > 1000 blocks.
    # 2048: 8 streams of ceil((2048 + 38) / 16) = 131 blocks would need 1048. 8192 is clamped to 4096 - 256.
    assert points == {512: [1, 2, 4, 8, 16, 28], 2048: [1, 2, 4, 7], 3840: [1, 2, 4]}
    assert all(p.batch * -(-(p.context + p.max_tokens) // 16) <= 1000 for p in decode_points(spec, info))


def test_decode_batches_stop_at_max_num_seqs() -> None:
    plans = decode_points(ProfileSpec(contexts=(128,)), engine_info(max_num_seqs=12, kv_blocks=100_000))
    assert [p.batch for p in plans] == [1, 2, 4, 8, 12]


def test_steady_gaps_start_once_every_stream_has_started() -> None:
    outputs = [
        [(0.0, 1), (1.0, 1), (2.0, 1), (3.0, 1), (4.0, 2)],  # started first; its gap to 2.0 spans the last start
        [(1.5, 1), (2.5, 1), (3.5, 1)],  # the last to start, at 1.5
    ]
    assert steady_gaps(outputs, started_at=1.5, skip=0) == [1.0, 1.0, 0.5, 1.0, 1.0]
    assert steady_gaps(outputs, started_at=1.5, skip=1) == [1.0, 0.5, 1.0]


# ---- measured on the mocker ----
def measured_engine_info() -> EngineInfo:
    """What the profiled mocker (:data:`MOCKER`) tells the profiler about itself."""
    return engine_info(block_size=16, kv_blocks=2048, max_num_seqs=32, context_length=8192, max_batched_tokens=1024)


async def test_prefill_ttft_follows_the_mockers_chunked_prefill_time(profile: Profile) -> None:
    assert [p.isl for p in profile.prefill] == [256, 1024, 3000]
    for point in profile.prefill:
        expected = predicted_ttft_s(point.isl)
        assert LOW * expected <= point.ttft_s <= HIGH * expected, (point, expected)


async def test_decode_itl_follows_the_mockers_step_time(profile: Profile) -> None:
    plans = decode_points(SPEC, measured_engine_info())
    assert [(p.context, p.batch) for p in profile.decode] == [(p.context, p.batch) for p in plans]
    for plan, point in zip(plans, profile.decode, strict=True):
        expected = predicted_itl_s(plan)
        assert LOW * expected <= point.itl_s <= HIGH * expected, (point, expected)


async def test_decode_itl_grows_with_the_kv_the_batch_holds(profile: Profile) -> None:
    by_usage = sorted(profile.decode, key=lambda p: p.batch * p.context)
    lightest, heaviest = by_usage[0], by_usage[-1]
    assert (lightest.batch, lightest.context) == (1, 256) and (heaviest.batch, heaviest.context) == (16, 1024)
    # decode_ms: about 5.9 ms at an empty cache, 26 ms at half full (before the speedup).
    assert heaviest.itl_s > 3 * lightest.itl_s
    # Any two points the mocker sets at least twice apart are measured in that order. Neighbours in KV are
    # not compared: their steps differ by a fraction of a millisecond, less than a loaded machine's
    # sleeps run late.
    plans = decode_points(SPEC, measured_engine_info())
    points = list(zip([predicted_itl_s(plan) for plan in plans], profile.decode, strict=True))
    pairs = [(a, b) for pa, a in points for pb, b in points if pb >= 2 * pa]
    assert pairs and all(b.itl_s > a.itl_s for a, b in pairs), pairs


async def test_profile_describes_the_engine_and_round_trips(profile: Profile, tmp_path: Path) -> None:
    assert (profile.engine, profile.model) == ("mocker", "profile-test")
    assert (profile.kv_tokens, profile.max_num_seqs) == (2048 * 16, 32)
    assert profile.created_at > 0 and '"speedup":2.0' in profile.hardware
    path = tmp_path / "profile.json"
    profile.save(path)
    assert Profile.load(path) == profile


async def test_the_profile_keeps_the_engines_step_time_model(profile: Profile) -> None:
    """Fitted from the run's own steps: the mocker's published model (at its speed), to a few percent."""
    from core.timing import TimingModel

    model = TimingModel.decode_text(profile.timing)
    assert model is not None
    for tokens in (256, 1024):
        assert model.prefill_ms(tokens) == pytest.approx(prefill_ms(tokens) / SPEEDUP, rel=0.1)
    assert model.decode_ms(0.3) == pytest.approx(decode_ms(0.3) / SPEEDUP, rel=0.1)


def _leftovers() -> tuple[set[str], list[psutil.Process], list[asyncio.Task[object]]]:
    threads = {t.name for t in threading.enumerate()}
    tasks = [t for t in asyncio.all_tasks() if t.get_name() == "mocker-scheduler"]
    return threads, psutil.Process().children(recursive=True), tasks


async def test_the_engine_is_shut_down_after_a_run() -> None:
    threads, children, before = _leftovers()  # the session's loop may hold other tests' tasks
    small = ProfileSpec(isls=(64,), repeats=1, contexts=(64,), batches=(2,), skip_tokens=1, decode_tokens=2)
    await run_profile(mocker_settings(), small)
    after_threads, after_children, scheduler = _leftovers()
    assert set(scheduler) <= set(before) and after_threads <= threads and after_children == children


async def test_the_engine_is_shut_down_when_a_run_fails() -> None:
    def fail_on_decode(line: str) -> None:
        if line.startswith("decode"):
            raise RuntimeError("interrupted")

    before = _leftovers()[2]
    small = ProfileSpec(isls=(64,), repeats=1, contexts=(64,), batches=(2,), skip_tokens=1, decode_tokens=2)
    with pytest.raises(RuntimeError, match="interrupted"):
        await run_profile(mocker_settings(), small, progress=fail_on_decode)
    assert set(_leftovers()[2]) <= set(before)
