"""The engines the conformance suite runs against.

Adding an engine is one entry in :data:`ENGINES`: a name, an async factory that starts it with
the given KV event sink, and the pytest marks that gate it (e.g. ``pytest.mark.vllm``). The
``engine`` fixture starts each engine once per session (a real engine loads a model) and every
conformance test shares it, so tests must leave it idle: every request they start ends.

Engine-specific test modules share the same running engine through :func:`shared_engine`
(tests/workers/test_vllm_engine.py does): vLLM starts in about a minute on CPU, so a session
starts it once, whichever fixture asks first, and stops it when the last user lets go. A test that
must end an engine (shutdown) takes a private one from the ``own_engine`` fixture instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from core.messages import FinishReason, SamplingParams
from core.settings import MockerSettings
from core.shm import ShmEntries
from tests.support.kv_events import KvEventLog
from tests.workers.vllm_support import VLLM_SKIP, start_vllm_engine
from workers.engines.base import Engine, KvEventSink
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.tokens import FIRST_TOKEN_ID, expected_output

#: The exact output of a request (tokens, finish reason), for engines that can predict it.
ExpectedOutput = Callable[[list[int], SamplingParams], tuple[list[int], FinishReason]]


@dataclass
class EngineCase:
    """A started engine with what the tests need to know about it."""

    name: str
    engine: Engine
    kv_events: KvEventLog
    expected: ExpectedOutput | None = None  # only simulated engines know their output in advance
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def prompt(self, n: int) -> list[int]:
        """A fresh prompt of ``n`` ordinary token ids (never shares a block with earlier ones)."""
        high = min(self.engine.info.vocab_size, 30000)
        return [self._rng.randrange(FIRST_TOKEN_ID + 100, high) for _ in range(n)]


@dataclass(frozen=True)
class EngineSpec:
    start: Callable[[KvEventSink], Awaitable[tuple[Engine, ExpectedOutput | None]]]
    marks: tuple[pytest.MarkDecorator, ...] = ()


async def _start_mocker(sink: KvEventSink) -> tuple[Engine, ExpectedOutput | None]:
    # Real time steps (speedup 1): a 16-token request takes about 100 ms, enough for the
    # batching test to tell one step per token from one step per token per request.
    engine = MockerEngine("conformance-model", MockerSettings(speedup=1.0, kv_blocks=4096), context_length=4096)
    await engine.start(sink)
    info = engine.info
    return engine, lambda prompt, sampling: expected_output(prompt, sampling, info.vocab_size, info.context_length)


ENGINES: dict[str, EngineSpec] = {
    "mocker": EngineSpec(_start_mocker),
    "vllm": EngineSpec(start_vllm_engine, marks=(pytest.mark.vllm, VLLM_SKIP)),
}


@dataclass
class _Shared:
    case: EngineCase
    users: int = 0
    #: The /dev/shm segments the engine's processes held once it started (see :func:`shut_down`).
    shm: ShmEntries = field(default_factory=lambda: ShmEntries(frozenset()))


_SHARED: dict[str, _Shared] = {}
_SHARED_LOCK = asyncio.Lock()


@contextlib.asynccontextmanager
async def shared_engine(name: str) -> AsyncIterator[EngineCase]:
    """The session's running engine ``name`` (started on first use, shut down after the last).

    Callers must hold it from session-scoped fixtures on the session's event loop.
    """
    async with _SHARED_LOCK:
        shared = _SHARED.get(name)
        if shared is None:
            log = KvEventLog()
            started, expected = await ENGINES[name].start(log)
            shared = _SHARED[name] = _Shared(EngineCase(name, started, log, expected))
            shared.shm = ShmEntries.held_by_descendants()
        shared.users += 1
    try:
        yield shared.case
    finally:
        async with _SHARED_LOCK:
            shared.users -= 1
            if shared.users == 0:
                del _SHARED[name]
                await shut_down(shared.case.engine, shared.shm)


_ENGINE_PARAMS = [pytest.param(name, marks=spec.marks) for name, spec in ENGINES.items()]


@pytest.fixture(scope="session", params=_ENGINE_PARAMS)
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[EngineCase]:
    async with shared_engine(request.param) as case:
        yield case


@pytest.fixture(params=_ENGINE_PARAMS)
async def own_engine(request: pytest.FixtureRequest) -> AsyncIterator[EngineCase]:
    """A freshly started engine for this test alone (it may shut it down; shut down after it anyway)."""
    log = KvEventLog()
    started, expected = await ENGINES[request.param].start(log)
    held = ShmEntries.held_by_descendants()
    try:
        yield EngineCase(request.param, started, log, expected)
    finally:
        await shut_down(started, held)


async def shut_down(engine: Engine, held: ShmEntries) -> None:
    """Shut ``engine`` down, then remove the /dev/shm segments its processes held (``held``, noted once it
    started) that nothing holds any more. vLLM kills its engine processes past a deadline, leaving their
    segments to the resource tracker of the process that started them: a worker's ends with the worker,
    this test process's only when the session has ended, after the run's leak check."""
    await engine.shutdown()
    await held.release(10)
