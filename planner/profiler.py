"""Measures an engine's performance profile (planner.profile): the job behind ``sluice profile``.

Usage::

    profile = await run_profile(get_settings(), ProfileSpec(), progress=print)
    profile.save(Path("profile.json"))

It builds the one engine the settings configure (``settings.worker.engine``), in this process and on
the caller's event loop, exactly as a worker builds it (workers.engines.factory), and measures it
alone, one point at a time, with nothing else running:

* prefill: for each prompt length, ``repeats`` prompts of fresh random tokens (no block of one is in
  the prefix cache), each alone with ``max_tokens`` 1; ``ttft_s`` is the median time from submitting
  one to its first token;
* decode: for each context and batch, ``batch`` streams of ``context`` prompt tokens submitted
  together; once every stream has its first token (all admitted, every prefill done), each stream's
  next ``skip_tokens`` gaps are dropped (the step that prefilled the last prompt is in the first) and
  the ``decode_tokens`` after are kept; ``itl_s`` is the median gap over every stream, and the streams
  are then aborted.

The lengths asked for are clamped to what the engine takes (:func:`prefill_lengths`,
:func:`decode_points`): a prompt within the context length and the KV cache, a batch within
``max_num_seqs`` and, with its streams' room to generate, within the KV cache, so that no measured
request is ever preempted. The engine is shut down however the run ends, and the ``/dev/shm``
segments its processes held (vLLM's engine core) are removed once nothing holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt

from core.messages import SamplingParams
from core.settings import Settings
from core.shm import ShmEntries
from core.timing import TimingModel
from planner.profile import DecodePoint, PrefillPoint, Profile
from workers.engines.base import Engine, EngineInfo, EngineRequest
from workers.engines.factory import create_engine
from workers.engines.registry import ENGINES
from workers.timing_model import TimingFit

log = logging.getLogger(__name__)

#: Where a run reports what it measured, one line at a time (``print``, a logger, a progress bar).
Progress = Callable[[str], None]

#: The pause before each prefill prompt, so that it finds the engine idle: the previous request's last
#: step done with, not still being wound up (the mocker plans a step that starts within 5 ms of the
#: previous one's end from that end, which would shorten a TTFT by up to 5 ms).
_IDLE_S = 0.05

#: How long shutdown waits for an engine's processes to let go of their /dev/shm segments.
_SHM_RELEASE_S = 10.0


class ProfileError(RuntimeError):
    """A point could not be measured: the engine produced no token, or none within the time allowed."""


class ProfileSpec(BaseModel):
    """What to measure. The defaults profile the mocker's default settings in about 40 s (speedup 1); vLLM
    on a CPU wants much shorter lists (SmolLM2 on 2 cores: 4 minutes for 3 lengths and 6 decode points,
    90 s of them its start)."""

    model_config = ConfigDict(frozen=True)

    #: Prompt lengths of the prefill table, and how many prompts of each (the median is kept).
    isls: tuple[PositiveInt, ...] = Field((128, 512, 1024, 2048, 4096, 8192), min_length=1)
    repeats: PositiveInt = 3
    #: Tokens each decode stream holds, and how many streams decode together.
    contexts: tuple[PositiveInt, ...] = Field((512, 2048, 8192), min_length=1)
    batches: tuple[PositiveInt, ...] = Field((1, 2, 4, 8, 16, 32, 64, 128, 256), min_length=1)
    #: Per decode stream, once all have started: gaps dropped, then gaps measured.
    skip_tokens: NonNegativeInt = 4
    decode_tokens: PositiveInt = 16
    #: Room kept below the context length for a decode stream to generate while the others are
    #: admitted: longer contexts are measured at ``context_length - decode_headroom``.
    decode_headroom: PositiveInt = 256
    #: One short request before measuring (vLLM's first request pays for lazy initialisation).
    warmup: bool = True
    #: Seed of the prompts' random tokens (the same spec sends the same prompts).
    seed: int = 0
    #: The most one point may take before the run fails with ProfileError.
    point_timeout_s: PositiveFloat = 600.0
    #: What the profile says it was measured on; None: this machine's CPU and the engine's settings.
    hardware: str | None = None


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """One decode point to measure: ``batch`` streams of ``context`` prompt tokens, each allowed
    ``max_tokens`` (:func:`decode_points`)."""

    context: int
    batch: int
    max_tokens: int


def prefill_lengths(spec: ProfileSpec, info: EngineInfo) -> list[int]:
    """The prompt lengths to measure: ``spec.isls`` clamped to ``min(context_length - 1,
    kv_blocks * block_size - 1)`` (the prompt and its one output token fit the context and the whole KV
    cache), sorted, without repeats."""
    longest = min(info.context_length, info.kv_blocks * info.block_size) - 1
    return sorted({min(isl, longest) for isl in spec.isls if longest >= 1})


def decode_tokens_needed(spec: ProfileSpec, info: EngineInfo, context: int, batch: int) -> int:
    """``max_tokens`` of a decode stream: its first stream generates one token per step while the others
    are admitted, ``admission = ceil(batch * context / max_batched_tokens)`` steps (one prompt a step
    when the engine does not say its budget), then ``skip_tokens + decode_tokens`` more are measured.
    Twice the admission plus two leaves room for an engine that admits more slowly than its budget."""
    budget = info.max_batched_tokens or context
    admission = -(-batch * context // budget)
    return 2 * admission + spec.skip_tokens + spec.decode_tokens + 2


def decode_fits(spec: ProfileSpec, info: EngineInfo, context: int, batch: int) -> bool:
    """Whether ``batch`` streams of ``context`` tokens can run to their ``max_tokens`` together without
    a preemption: ``batch <= max_num_seqs``, ``context + max_tokens <= context_length`` and
    ``batch * ceil((context + max_tokens) / block_size) <= kv_blocks``."""
    tokens = context + decode_tokens_needed(spec, info, context, batch)
    blocks = -(-tokens // info.block_size)
    return batch <= info.max_num_seqs and tokens <= info.context_length and batch * blocks <= info.kv_blocks


def decode_points(spec: ProfileSpec, info: EngineInfo) -> list[DecodePlan]:
    """The decode points to measure. Contexts are clamped to ``context_length - decode_headroom``;
    within each, a batch that does not fit (:func:`decode_fits`) is replaced by the largest that does,
    so the table reaches the engine's capacity at every context. Sorted by context, then batch."""
    plans: list[DecodePlan] = []
    longest = info.context_length - spec.decode_headroom
    for context in sorted({min(c, longest) for c in spec.contexts if longest >= 1}):
        batches: set[int] = set()
        for wanted in spec.batches:
            batch = min(wanted, info.max_num_seqs)
            while batch >= 1 and not decode_fits(spec, info, context, batch):
                batch -= 1
            if batch >= 1:
                batches.add(batch)
        plans += [DecodePlan(context, b, decode_tokens_needed(spec, info, context, b)) for b in sorted(batches)]
    return plans


def steady_gaps(outputs: Sequence[Sequence[tuple[float, int]]], started_at: float, skip: int) -> list[float]:
    """The inter-token gaps of decode streams in their steady part. ``outputs[i]``: stream ``i``'s
    outputs as ``(time, tokens)``, in order; ``started_at``: when the last stream got its first token.
    Of each stream's outputs after ``started_at``, each gives ``(its time - the previous output's) /
    its tokens``; the first ``skip`` of each stream are dropped."""
    gaps: list[float] = []
    for outs in outputs:
        mine = [(t - outs[k - 1][0]) / n for k, (t, n) in enumerate(outs) if k and t > started_at]
        gaps += mine[skip:]
    return gaps


class _Prompts:
    """Prompts that share no block with any other of the run: the first token of each is new (a
    counter over the ordinary ids), the rest random. Ids start at ``min(1000, vocab_size // 2)``,
    past every model's special tokens."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self._low, self._high = min(1000, vocab_size // 2), vocab_size
        self._rng = random.Random(seed)
        self._made = 0

    def take(self, length: int) -> list[int]:
        first = self._low + self._made % (self._high - self._low)
        self._made += 1
        return [first, *(self._rng.randrange(self._low, self._high) for _ in range(length - 1))]


@dataclass
class _Streams:
    """The outputs of one decode point's streams as they arrive. ``stop`` is set once every stream has
    ``want`` outputs after the last stream's first (or when any stream ends: see :meth:`_Run.decode`)."""

    count: int
    want: int
    outputs: list[list[tuple[float, int]]] = field(init=False)
    started_at: float | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _started: int = 0
    _after: list[int] = field(init=False)
    _satisfied: int = 0

    def __post_init__(self) -> None:
        self.outputs = [[] for _ in range(self.count)]
        self._after = [0] * self.count

    def record(self, i: int, at: float, tokens: int) -> None:
        self.outputs[i].append((at, tokens))
        if self.started_at is None:
            if len(self.outputs[i]) == 1:
                self._started += 1
                if self._started == self.count:
                    self.started_at = at
            return
        self._after[i] += 1
        if self._after[i] == self.want:
            self._satisfied += 1
            if self._satisfied == self.count:
                self.stop.set()


@dataclass
class _Run:
    engine: Engine
    spec: ProfileSpec
    progress: Progress
    prompts: _Prompts
    _ids: int = 0

    def _request(self, tokens: list[int], max_tokens: int) -> EngineRequest:
        self._ids += 1
        return EngineRequest(f"profile-{self._ids}", tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))

    async def ttft_s(self, isl: int) -> float:
        """Time to the first token of one fresh ``isl``-token prompt on the idle engine."""
        request = self._request(self.prompts.take(isl), 1)
        first: float | None = None
        await asyncio.sleep(_IDLE_S)
        try:
            async with asyncio.timeout(self.spec.point_timeout_s):
                start = time.perf_counter()
                async for out in self.engine.generate(request):
                    if out.token_ids and first is None:
                        first = time.perf_counter() - start
        except TimeoutError:
            raise ProfileError(f"a prompt of {isl} tokens took over {self.spec.point_timeout_s:.0f} s") from None
        if first is None:
            raise ProfileError(f"a prompt of {isl} tokens ended without a token")
        return first

    async def prefill(self, isl: int) -> PrefillPoint:
        await self.engine.clear_kv_cache()
        ttft = statistics.median([await self.ttft_s(isl) for _ in range(self.spec.repeats)])
        self.progress(f"prefill isl={isl}: ttft {ttft * 1000:.1f} ms")
        return PrefillPoint(isl=isl, ttft_s=ttft)

    async def _stream(self, request: EngineRequest, i: int, streams: _Streams) -> None:
        try:
            async for out in self.engine.generate(request):
                if out.token_ids:
                    streams.record(i, time.perf_counter(), len(out.token_ids))
        finally:  # ended (aborted, finished or failed): nothing more comes, measure what there is
            streams.stop.set()

    async def decode(self, plan: DecodePlan) -> DecodePoint:
        await self.engine.clear_kv_cache()
        streams = _Streams(plan.batch, self.spec.skip_tokens + self.spec.decode_tokens)
        requests = [self._request(self.prompts.take(plan.context), plan.max_tokens) for _ in range(plan.batch)]
        tasks = [asyncio.create_task(self._stream(r, i, streams)) for i, r in enumerate(requests)]
        try:
            async with asyncio.timeout(self.spec.point_timeout_s):
                await streams.stop.wait()
        except TimeoutError:
            raise ProfileError(f"decode batch={plan.batch} context={plan.context} took over "
                               f"{self.spec.point_timeout_s:.0f} s") from None
        finally:
            for request in requests:
                await self.engine.abort(request.request_id)
            ended = await asyncio.gather(*tasks, return_exceptions=True)
        for result in ended:
            if isinstance(result, BaseException):
                raise result
        return self._itl(plan, streams)

    def _itl(self, plan: DecodePlan, streams: _Streams) -> DecodePoint:
        where = f"decode batch={plan.batch} context={plan.context}"
        if streams.started_at is None:
            raise ProfileError(f"{where}: a stream ended before every stream had started")
        gaps = steady_gaps(streams.outputs, streams.started_at, self.spec.skip_tokens)
        if not gaps:  # a stream ended early (the engine admitted more slowly than planned): take all
            gaps = steady_gaps(streams.outputs, streams.started_at, 0)
        if not gaps:
            raise ProfileError(f"{where}: no token came after every stream had started")
        itl = statistics.median(gaps)
        self.progress(f"{where}: itl {itl * 1000:.2f} ms ({len(gaps)} gaps)")
        return DecodePoint(batch=plan.batch, context=plan.context, itl_s=itl)

    async def warm_up(self, isl: int) -> None:
        async for _ in self.engine.generate(self._request(self.prompts.take(isl), 2)):
            pass


async def run_profile(settings: Settings, spec: ProfileSpec, progress: Progress | None = None) -> Profile:
    """Build and start the engine ``settings`` configure, measure ``spec``'s points on it and shut it
    down (however the run ends). Raises what building or starting the engine raises
    (``EngineConfigError``, ``EngineStartError``), ProfileError, or a request's ``SluiceError``."""
    say = progress or (lambda _line: None)
    engine = create_engine(settings)
    steps = TimingFit()
    engine.on_step = steps.observe  # the engine's step-time model, kept with the profile (Profile.timing)
    held = ShmEntries(frozenset())
    try:
        await engine.start()
        held = ShmEntries.held_by_descendants()
        info = engine.info
        say(f"{info.engine} {info.model}: {info.kv_blocks} KV blocks of {info.block_size} tokens, "
            f"max_num_seqs {info.max_num_seqs}, context {info.context_length}, "
            f"max_batched_tokens {info.max_batched_tokens}")
        run = _Run(engine, spec, say, _Prompts(info.vocab_size, spec.seed))
        isls = prefill_lengths(spec, info)
        if spec.warmup:
            await run.warm_up(isls[0])
        prefill = [await run.prefill(isl) for isl in isls]
        decode = [await run.decode(plan) for plan in decode_points(spec, info)]
        return Profile(engine=info.engine, model=info.model, created_at=time.time(),
                       hardware=spec.hardware if spec.hardware is not None else _hardware(settings),
                       kv_tokens=info.kv_blocks * info.block_size, max_num_seqs=info.max_num_seqs,
                       prefill=prefill, decode=decode, timing=_encoded(steps.model()))
    finally:
        await _shut_down(engine, held)


async def _shut_down(engine: Engine, held: ShmEntries) -> None:
    """Shut ``engine`` down, then remove the /dev/shm segments its processes held (``held``) once nothing
    holds them: an engine process killed past its exit deadline leaves them to a resource tracker that
    runs until this process ends. A failing shutdown is logged, not raised: the run's own outcome (its
    profile, or what it raised) is what the caller needs."""
    try:
        await engine.shutdown()
    except Exception:  # noqa: BLE001 - see the docstring
        log.exception("engine shutdown failed")
    await held.release(_SHM_RELEASE_S)


def _encoded(model: TimingModel | None) -> str:
    return model.encode() if model is not None else ""


def _hardware(settings: Settings) -> str:
    """This machine's CPU and the engine's settings that differ from their defaults (a GPU engine names
    its device in them only if configured: the CPU line is what is always known)."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    engine = ENGINES.get(settings.worker.engine)
    tuned = engine.settings_of(settings).model_dump_json(exclude_defaults=True)
    return f"{cpu or 'unknown CPU'} x{os.cpu_count() or 1}; {engine.name} {tuned}"
