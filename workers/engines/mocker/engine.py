"""The mocker: a simulated engine with a real scheduler, a real paged KV cache and fake math.

Usage: ``SLUICE_ENGINE=mocker sluice worker`` (options under ``SLUICE_WORKER__MOCKER__*``, see
:class:`core.settings.MockerSettings`); in tests, ``MockerEngine("m", MockerSettings(no_sleep=True))``.

This module is the :class:`~workers.engines.base.Engine` API over the parts, split as Dynamo's
mocker is: :mod:`~workers.engines.mocker.scheduler` (the queues, admission, the steps and their
time), :mod:`~workers.engines.mocker.transfer` (KV held for and read from another worker, for
disaggregated prefill and decode), :mod:`~workers.engines.mocker.kv` (the paged KV cache),
:mod:`~workers.engines.mocker.tokens` and :mod:`~workers.engines.mocker.script` (what a request
outputs). Here live the requests' streams, their validation, LoRA adapters and the lifecycle.

Errors: :meth:`MockerEngine.generate` raises (at its first ``__anext__``) a
:class:`core.errors.InvalidRequest` for a bad request and :class:`core.errors.ContextLengthExceeded`
for a prompt that can never fit (longer than the context length, or needing more KV blocks than
the engine has), and :class:`core.errors.UpstreamError` when the scheduler failed or the engine
is not running. No output has ``finish_reason="error"``: the exception carries the message.
A scheduler failure fails every request, empties the KV cache and reports
:class:`~core.messages.AllBlocksCleared`; the scheduler then goes on serving new requests.

``clear_kv_cache`` drops every cached block that no running request holds and reports
``AllBlocksCleared`` followed by ``BlockStored`` for the blocks still held (see
:meth:`workers.engines.mocker.kv.KvBlockManager.clear`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from core.errors import ContextLengthExceeded, InvalidRequest, UpstreamError
from core.messages import LORA, AllBlocksCleared, FinishReason, Usage
from core.settings import MockerSettings
from router.hashing import BlockHash, block_hashes, root_hash
from router.registry import WorkerLoad
from workers.engines.base import (
    Engine,
    EngineInfo,
    EngineOutput,
    EngineRequest,
    EngineStartError,
    KvEventSink,
    StepStats,
    discard_kv_events,
    emit_kv_events,
    emit_step,
)
from workers.engines.mocker.request import Delivery, Request, RequestState
from workers.engines.mocker.scheduler import Scheduler
from workers.engines.mocker.script import MockerScript
from workers.engines.mocker.tiers import MockerTiers
from workers.engines.mocker.tokens import FIRST_TOKEN_ID, prompt_logprobs, stream_key
from workers.engines.mocker.transfer import KvTransfer
from workers.kvbm.tiers import TierReport

log = logging.getLogger(__name__)


class MockerEngine(Engine):
    def __init__(self, model: str, settings: MockerSettings, context_length: int = 8192,
                 *, kv_events: bool = True, kv_hold_s: float = 30.0, script: MockerScript | None = None,
                 tiers: MockerTiers | None = None) -> None:
        #: False simulates an engine that reports nothing about its cache (the routers' approximate mode).
        self.publishes_kv_events = kv_events
        self.model = model
        self._settings = settings
        self.context_length = context_length
        self.script = script
        #: The longest prompt + output a request may reach: the model's context, capped by the KV
        #: cache (a lone request must always fit, or preemption could never make room for it).
        self.max_model_len = min(context_length, settings.kv_blocks * settings.block_size)
        self._scheduler = Scheduler(settings, self.max_model_len, on_export=self._hold_export)
        #: Finished ``kv_export`` requests whose blocks wait for the decode worker's read, and reads
        #: of a prefill worker's KV in flight.
        self._transfer = KvTransfer(settings, self._scheduler, kv_hold_s)
        self._live: dict[str, Request] = {}  # every request whose stream has not ended
        self._roots: dict[str | None, int] = {}
        #: LoRA adapters loaded: name to directory.
        self._loras: dict[str, str] = {}
        self._sink: KvEventSink = discard_kv_events
        #: KV tiers below the cache (workers.engines.mocker.tiers), and the requests reading from them.
        self.tiers = tiers
        self._onboarding: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def settings(self) -> MockerSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: MockerSettings) -> None:
        """New settings reach the scheduler and the transfer at once (a test slows one engine's reads
        this way); the KV cache's size and ``max_model_len`` stay those the engine was built with."""
        self._settings = self._scheduler.settings = self._transfer.settings = settings

    @property
    def kv_hold_s(self) -> float:
        """How long a finished export's blocks wait for the decode worker's read."""
        return self._transfer.hold_s

    # ---- Engine interface ---------------------------------------------------------------------
    async def start(self, kv_sink: KvEventSink = discard_kv_events) -> None:
        s = self.settings
        if self._task is not None:
            raise EngineStartError("the mocker engine is already started")
        if s.vocab_size <= FIRST_TOKEN_ID:
            raise EngineStartError(f"mocker vocab_size must exceed {FIRST_TOKEN_ID} (ids below are special)")
        self.info = EngineInfo(
            model=self.model, engine="mocker", block_size=s.block_size, kv_blocks=s.kv_blocks,
            max_num_seqs=s.max_num_seqs, context_length=self.max_model_len, vocab_size=s.vocab_size,
            features=frozenset({LORA}), max_batched_tokens=s.max_num_batched_tokens,
        )
        self._sink = kv_sink if self.publishes_kv_events else discard_kv_events
        if self.tiers is not None:
            self._sink = self.tiers.wrap(self._sink)
            self.tiers.start()
        self._task = asyncio.get_running_loop().create_task(
            self._scheduler.run(self._sink, self._step_done, self._fail_all), name="mocker-scheduler")
        self._task.add_done_callback(self._on_scheduler_exit)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        req = self._enqueue(request)
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not req.pending and not req.closed:
                    req.waiter = loop.create_future()
                    await req.waiter
                    req.waiter = None
                if req.error is not None:
                    raise req.error
                tokens, req.pending = req.pending, []
                logprobs, req.pending_logprobs = (req.pending_logprobs or None), []
                prompt_lps, req.prompt_logprobs = req.prompt_logprobs, None
                if req.finish is not None:
                    yield EngineOutput(tokens, req.finish, self._usage(req), kv_handle=self._transfer.handle(req),
                                       logprobs=logprobs, prompt_logprobs=prompt_lps)
                    return
                yield EngineOutput(tokens, logprobs=logprobs, prompt_logprobs=prompt_lps)
        finally:
            if not req.closed:  # the consumer left early (closed or cancelled the iterator)
                self._drop(req)
                self._close(req, finish="abort")

    async def abort(self, request_id: str) -> None:
        req = self._live.get(request_id)
        if req is not None:
            self._drop(req)
            self._close(req, finish="abort")

    def load(self) -> WorkerLoad:
        s = self._scheduler
        return WorkerLoad(
            running=len(s.running), waiting=len(s.waiting) + len(self._onboarding),
            active_blocks=s.kv.active_blocks, total_blocks=s.kv.num_blocks,
            tier_credit=self.tiers.credits() if self.tiers is not None else "",
        )

    async def clear_kv_cache(self) -> None:
        kv = self._scheduler.kv
        kv.clear()
        emit_kv_events(self._sink, kv.take_events())

    def cached_block_hashes(self) -> list[int]:
        return self._scheduler.kv.cached_hashes()

    def cached_block_count(self) -> int:
        return self._scheduler.kv.cached_count

    def tier_report(self) -> TierReport | None:
        return self.tiers.store.report() if self.tiers is not None else None

    def tier_block_hashes(self) -> dict[str, list[int]]:
        return self.tiers.store.snapshot() if self.tiers is not None else {}

    async def release_transfer(self, request_id: str) -> None:
        self._transfer.release(request_id)

    async def shutdown(self) -> None:
        self._stopped = True
        for req in list(self._live.values()):
            self._drop(req)
            self._close(req, finish="abort")
        self._transfer.release_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.tiers is not None:
            await self.tiers.close()

    async def load_lora(self, name: str, path: str) -> None:
        """An adapter is simulated: its directory must hold a PEFT ``adapter_config.json``, and its
        requests get their own token stream and their own block hashes (router.hashing salts them)."""
        if not (Path(path) / "adapter_config.json").is_file():
            raise InvalidRequest(f"no LoRA adapter at {path!r} (adapter_config.json not found)", param="lora_path",
                                 code="lora_not_found")
        if self._loras.get(name, path) != path:
            raise InvalidRequest(f"a LoRA adapter named {name!r} is already loaded from {self._loras[name]!r}",
                                 param="lora_name", code="lora_exists")
        self._loras[name] = path

    async def unload_lora(self, name: str) -> None:
        if self._loras.pop(name, None) is None:
            raise InvalidRequest(f"LoRA adapter {name!r} is not loaded", param="lora_name", code="lora_not_found")

    def loras(self) -> list[str]:
        return list(self._loras)

    # ---- what a simulation may read (benchmarks' reference policies; no router can see this) ---
    def prompt_hit_tokens(self, token_ids: Sequence[int], lora: str | None = None) -> int:
        """Prompt tokens the prefix cache would reuse if ``token_ids`` were admitted now (as at
        admission: whole leading blocks, the last prompt token always computed)."""
        _, hit = self._prompt_chain(token_ids, lora)
        return hit * self.settings.block_size

    def prompt_tier_read(self, token_ids: Sequence[int], lora: str | None = None) -> tuple[int, float]:
        """Past the prefix cache's hit, the prompt tokens this engine's KV tiers would onboard if ``token_ids``
        were admitted now, and the simulated seconds of that read (as at admission: only the tiers worth
        reading, the leading run held; the shared tier asked as the onboard asks it). (0, 0.0) without tiers."""
        tiers = self.tiers
        if tiers is None:
            return 0, 0.0
        chain, hit = self._prompt_chain(token_ids, lora)
        read = tiers.peek(chain[hit:])
        return len(read) * self.settings.block_size, tiers.simulated_s(read) if read else 0.0

    def _prompt_chain(self, token_ids: Sequence[int], lora: str | None) -> tuple[list[BlockHash], int]:
        """The prompt's block hashes that admission would consider (whole blocks, the last prompt token
        always computed) and how many leading ones the prefix cache holds."""
        chain = block_hashes(token_ids, self.settings.block_size, self._root(lora))
        chain = chain[:(len(token_ids) - 1) // self.settings.block_size]
        return chain, self._scheduler.kv.cached_prefix(chain)

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens admitted or waiting whose KV is not computed yet (cache hits of waiting requests
        not subtracted: they are known only at admission)."""
        return self._scheduler.pending_prefill_tokens()

    # ---- requests in and out ------------------------------------------------------------------
    def _enqueue(self, request: EngineRequest) -> Request:
        prompt = request.token_ids
        sampling = request.sampling
        if self._task is None or self._task.done() or self._stopped:
            raise UpstreamError("the mocker engine is not running")
        if request.request_id in self._live:
            raise InvalidRequest(f"request id {request.request_id!r} is already running")
        if not prompt:
            raise InvalidRequest("the prompt is empty", param="prompt")
        if sampling.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
        if len(prompt) > self.max_model_len:
            raise ContextLengthExceeded(
                f"the prompt has {len(prompt)} tokens; this engine takes at most {self.max_model_len} "
                f"(context length {self.context_length}, KV cache of {self.settings.kv_blocks} blocks "
                f"of {self.settings.block_size} tokens)",
                param="messages",
            )
        if not 0 <= request.carried_tokens < len(prompt) or request.carried_tokens >= sampling.max_tokens:
            raise InvalidRequest(f"carried_tokens {request.carried_tokens} does not fit the request")
        if request.lora is not None and request.lora not in self._loras:
            raise InvalidRequest(f"LoRA adapter {request.lora!r} is not loaded on this worker", param="model",
                                 code="lora_not_loaded")
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(64)
        root = self._root(request.lora)
        # An adapter changes the model's answers: its stream is the base stream's key mixed with its root.
        key = stream_key(prompt[:len(prompt) - request.carried_tokens], sampling.temperature, seed)
        key = key ^ root if request.lora is not None else key
        prompt_len = len(prompt) - request.carried_tokens
        req = Request(
            request_id=request.request_id, sampling=sampling, tokens=list(prompt), prompt_len=prompt_len,
            key=key, root=root,
            chain=block_hashes(prompt, self.settings.block_size, root), carried=request.carried_tokens,
            export=request.kv_export,
            script=self.script.output_for(prompt[:prompt_len]) if self.script is not None else None,
            prompt_logprobs=None if sampling.prompt_logprobs is None else
            prompt_logprobs(prompt[:prompt_len], self.settings.vocab_size, sampling.prompt_logprobs),
        )
        self._live[req.request_id] = req
        if not self._transfer.start_pull(req, request.kv_handle):
            self._admit_after_onboard(req)
        return req

    def _admit_after_onboard(self, req: Request) -> None:
        """Queue ``req``; first, if a tier may hold blocks past the cache's hit, read them (the request
        waits their simulated time off the scheduler, which goes on stepping the others)."""
        tiers = self.tiers
        if tiers is None:  # no tiers: nothing to look up on the request's way in
            self._scheduler.add(req)
            return
        bs = self.settings.block_size
        hit = self._scheduler.kv.cached_prefix(req.chain)
        rest = req.chain[hit:(len(req.tokens) - 1) // bs]
        tiers.store.touch(req.chain[:hit])
        if not tiers.might_hold(rest):
            self._scheduler.add(req)
            return

        async def onboard() -> None:
            try:
                blocks = await tiers.onboard(rest, req.chain[hit - 1] if hit else None)
            except Exception:  # noqa: BLE001 - a failed read is a recompute, never an error to the client
                log.exception("mocker KV onboard failed; recomputing")
                blocks = 0
            self._onboarding.pop(req.request_id, None)
            if req.closed:  # failed with the scheduler meanwhile
                return
            if blocks:
                req.remote_tokens, req.pulled, req.onboarded = (hit + blocks) * bs, True, True
            self._scheduler.add(req)

        self._onboarding[req.request_id] = asyncio.get_running_loop().create_task(onboard(), name="mocker-onboard")

    def _root(self, lora: str | None) -> int:
        """The block-hash chain's seed for an adapter (router.hashing.root_hash), computed once."""
        root = self._roots.get(lora)
        if root is None:
            root = self._roots[lora] = root_hash(self.model, lora)
        return root

    def _usage(self, req: Request) -> Usage:
        return Usage(prompt_tokens=req.prompt_len, completion_tokens=req.emitted + req.carried,
                     cached_tokens=req.cached_tokens or 0, transferred_tokens=req.transferred_tokens)

    def _close(self, req: Request, *, finish: FinishReason | None = None, error: Exception | None = None) -> None:
        """End the request's stream (it still hands out its pending tokens)."""
        req.finish, req.error = finish, error
        self._live.pop(req.request_id, None)
        req.wake()

    def _drop(self, req: Request) -> None:
        """Take a request out of the scheduler, or stop its KV read, releasing its blocks."""
        reading = self._onboarding.pop(req.request_id, None)
        if reading is not None:
            reading.cancel()
        elif not self._transfer.cancel_pull(req):
            self._scheduler.drop(req)
        req.state = RequestState.DONE

    def _hold_export(self, req: Request) -> None:
        """A finished ``kv_export`` request keeps its blocks for the decode worker's read."""
        self._transfer.hold(req)

    # ---- what the scheduler reports -----------------------------------------------------------
    def _step_done(self, step: StepStats, deliveries: Sequence[Delivery]) -> None:
        """A step's time has passed: report it, then hand out its tokens."""
        emit_step(self.on_step, step)
        for req, token, reason, logprob in deliveries:
            if req.closed:  # aborted while its step ran
                continue
            req.pending.append(token)
            if logprob is not None:
                req.pending_logprobs.append(logprob)
            req.emitted += 1
            if reason is not None:
                self._close(req, finish=reason)
            else:
                req.wake()

    def _fail_all(self, exc: BaseException) -> None:
        """After a scheduler fault the state cannot be trusted: fail every request and start over
        with an empty KV cache."""
        for req in list(self._live.values()):
            req.state = RequestState.DONE
            self._close(req, error=UpstreamError(f"mocker scheduler failed: {type(exc).__name__}: {exc}"))
        self._scheduler.reset()
        emit_kv_events(self._sink, [AllBlocksCleared()])

    def _on_scheduler_exit(self, task: asyncio.Task[None]) -> None:
        """The scheduler ends only when shutdown cancels it; anything else is a bug that must not
        leave requests waiting forever."""
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            return
        log.error("mocker scheduler died", exc_info=exc)
        self._fail_all(exc)
