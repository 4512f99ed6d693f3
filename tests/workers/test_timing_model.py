"""The worker's own timing model: fitted from its steps, it recovers the mocker's configured model."""

from __future__ import annotations

import asyncio
import random

import pytest

from core.messages import SamplingParams
from core.settings import MockerSettings
from core.timing import TimingModel
from workers.engines.base import EngineRequest, StepStats
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.timing import step_ms
from workers.timing_model import TimingFit, fit

#: The mocker's published model (workers/engines/mocker/timing.py).
PREFILL = (16.50142, 1.518344e-02, 4.209989e-07)
DECODE = (5.74, 54.01, -25.74)


def assert_recovers(model: TimingModel | None, speedup: float) -> None:
    assert model is not None
    assert model.prefill == pytest.approx(tuple(c / speedup for c in PREFILL), rel=1e-6)
    assert model.decode == pytest.approx(tuple(c / speedup for c in DECODE), rel=1e-6)


@pytest.mark.parametrize("speedup", [1.0, 4.0])
def test_a_fit_of_the_mockers_step_times_recovers_its_model(speedup: float) -> None:
    rng = random.Random(7)
    steps = []
    for _ in range(300):
        t = rng.choice([0, rng.randrange(1, 8192)])
        decoding = rng.random() < 0.7 or t == 0
        u = rng.random()
        steps.append((t, decoding, u, step_ms(t, int(decoding), u, speedup)))
    assert_recovers(fit(steps), speedup)


def test_the_model_travels_as_text_exactly() -> None:
    model = TimingModel((16.5, 0.0151, 4.2e-07), (5.74, 54.01, -25.74))
    assert TimingModel.decode_text(model.encode()) == model
    assert TimingModel.decode_text("") is None and TimingModel.decode_text("1,2,x,4,5,6") is None
    assert model.step_ms(0, False, 0.3) == 0.0
    assert model.step_ms(100, True, 0.5) == pytest.approx(16.5 + 1.51 + 4.2e-3 + 5.74 + 27.005 - 6.435)


def test_too_few_steps_give_no_model() -> None:
    f = TimingFit(min_steps=4)
    for _ in range(3):
        f.observe(StepStats(0.02, prefill_tokens=100, decode_tokens=0, kv_usage=0.1))
    f.observe(StepStats(None, preemptions=1))  # untimed: not a step of the fit
    assert f.model() is None


async def test_a_running_mockers_own_steps_recover_its_configured_model() -> None:
    """The engine's steps as the worker observes them (prefill alone, decode alone, mixed), at
    the usages they ran at."""
    engine = MockerEngine("m", MockerSettings(no_sleep=True, speedup=2.0, kv_blocks=2048, block_size=16))
    timing = TimingFit(min_steps=32)
    engine.on_step = timing.observe
    await engine.start()
    rng = random.Random(3)

    async def one(i: int) -> None:
        await asyncio.sleep(rng.random() * 0.01)
        prompt = [rng.randrange(100, 40_000) for _ in range(rng.randrange(20, 3000))]
        sampling = SamplingParams(max_tokens=rng.randrange(1, 40), temperature=0, ignore_eos=True)
        async for _ in engine.generate(EngineRequest(f"r{i}", prompt, sampling)):
            pass

    try:
        await asyncio.gather(*(one(i) for i in range(60)))
    finally:
        await engine.shutdown()
    assert_recovers(timing.model(), 2.0)


def test_noisy_steps_never_make_a_longer_prompt_cheaper() -> None:
    """Prefill steps of 60 to 700 tokens whose times level off (as on a busy CPU) fit a concave
    parabola by plain least squares, which predicts a 4,000-token prompt as free; the fit keeps the
    per-token and quadratic terms at 0 or above instead."""
    rng = random.Random(3)
    steps = []
    for _ in range(200):
        t = rng.randrange(60, 700)
        ms = 500 + 5 * t - 0.004 * t * t + rng.gauss(0, 40)  # flattening: a negative quadratic term
        steps.append((t, False, 0.0, ms))
        steps.append((0, True, rng.random(), 150 + rng.gauss(0, 10)))
    model = fit(steps)
    assert model is not None and model.prefill[1] >= 0 and model.prefill[2] >= 0
    assert model.prefill_ms(4000) > model.prefill_ms(700) > model.prefill_ms(100) > 0
    assert model.decode_ms(0.5) == pytest.approx(150, abs=10)


def test_decode_steps_at_nearly_one_usage_fit_a_constant_not_a_wild_curve() -> None:
    """A small model's few requests hold 1-3% of its cache: noisy decode steps over that span would fit
    slopes that predict an idle worker (usage 0) or a full one far from anything measured. The fit keeps
    decode time constant there (their mean), and fits the usage terms once the steps span enough of it."""
    rng = random.Random(5)
    narrow = [(0, True, rng.uniform(0.005, 0.03), 58 + rng.gauss(0, 15)) for _ in range(200)]
    narrow += [(t, False, 0.0, 30 + 0.2 * t) for t in (rng.randrange(20, 400) for _ in range(50))]
    model = fit(narrow)
    assert model is not None and model.decode[1:] == (0.0, 0.0)
    mean = sum(ms for _, decoding, _, ms in narrow if decoding) / 200
    assert model.decode_ms(0.0) == pytest.approx(mean, rel=1e-6) == model.decode_ms(1.0)

    wide = [(0, True, u, 20 + 40 * u) for u in (rng.uniform(0.0, 0.2) for _ in range(200))]
    linear = fit(wide)
    assert linear is not None and linear.decode == pytest.approx((20, 40, 0), abs=1e-6)


def test_a_few_similar_prompts_fit_a_prefill_that_grows_with_the_prompt() -> None:
    """Steps of prompts of 28-34 tokens whose noise slopes downwards leave no per-token term to a plain
    non-negative fit, and a flat prefill would price a 4,000-token prompt like a 30-token one; the fit
    makes prefill proportional to the prompt instead, through the steps' mean."""
    rng = random.Random(11)
    steps = [(t, False, 0.0, 60 - 0.8 * t + rng.gauss(0, 2)) for t in (rng.randrange(28, 35) for _ in range(20))]
    steps += [(0, True, 0.01, 50 + rng.gauss(0, 5)) for _ in range(100)]
    model = fit(steps)
    assert model is not None and model.prefill[0] == 0 and model.prefill[2] == 0
    assert model.prefill_ms(4000) > model.prefill_ms(100) > 0
    prefill = [(t, ms) for t, decoding, _, ms in steps if not decoding]
    mean_ms = sum(ms for _, ms in prefill) / len(prefill)
    assert model.prefill_ms(31) == pytest.approx(mean_ms, rel=0.1)
