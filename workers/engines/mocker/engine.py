"""The mocker: a simulated engine with a real scheduler, a real paged KV cache and fake math.

Usage: ``SLUICE_ENGINE=mocker sluice worker`` (options under ``SLUICE_WORKER__MOCKER__*``, see
:class:`core.settings.MockerSettings`); in tests, ``MockerEngine("m", MockerSettings(no_sleep=True))``.

What it simulates, step by step, like vLLM's scheduler and Dynamo's mocker:

* one scheduler task runs steps (forward passes) while there is work. A step first gives every
  running request its next chunk (one token when decoding, a prefill chunk otherwise), oldest
  first, then admits waiting requests in arrival order while fewer than ``max_num_seqs`` run,
  the step's token budget (``max_num_batched_tokens``, long prompts are prefilled in chunks)
  is not spent and their blocks fit in the KV cache;
* a request's leading full prompt blocks found in the prefix cache are not computed (its
  ``cached_tokens``), but the last prompt token always is, as in vLLM;
* when a running request needs a block and none is free or evictable, the newest running
  request is preempted: its blocks are released and it waits again, first in line, to recompute
  its prompt and output (mostly from the prefix cache);
* each step lasts the time :mod:`workers.engines.mocker.timing` gives it (Dynamo's published
  model); the scheduler sleeps until the step's end and only then hands out the step's tokens,
  so time to first token includes the prefill. With ``no_sleep`` steps take no simulated time;
* tokens come from :mod:`workers.engines.mocker.tokens`, a hash of prompt, seed and position;
  with a script (``SLUICE_WORKER__MOCKER__SCRIPT``, :mod:`workers.engines.mocker.script`), a
  prompt that matches an entry gets that entry's text instead.

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
import enum
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import ContextLengthExceeded, InvalidRequest, UpstreamError
from core.messages import LORA, AllBlocksCleared, FinishReason, SamplingParams, TokenLogprob, Usage
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
from workers.engines.mocker.kv import KvBlockManager
from workers.engines.mocker.script import MockerScript
from workers.engines.mocker.timing import step_ms
from workers.engines.mocker.tokens import FIRST_TOKEN_ID, choose, finish_reason, prompt_logprobs, stream_key

log = logging.getLogger(__name__)

#: A step that starts this soon after the previous step's planned end is planned from that end,
#: so the loop's wake-up lateness does not add up over a run of busy steps; after a longer gap
#: (the engine was idle, or the host starved it) the plan restarts from now.
_CATCH_UP_S = 0.005


class _State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"  # finished computing, or aborted: holds no blocks


def _certain(token: int, sampling: SamplingParams) -> TokenLogprob | None:
    """A scripted token's logprobs: the script leaves no other choice."""
    return None if sampling.logprobs is None else TokenLogprob(0.0, [(token, 0.0)][:sampling.logprobs])


@dataclass(slots=True, eq=False)
class _Request:
    """One request: what the scheduler computes, and what its output stream has handed out.

    Invariant while running: the request holds the cached blocks ``chain[:num_computed // B]``
    plus ``uncached`` blocks, together covering its first ``num_computed`` tokens and the
    chunk scheduled next. Waiting and done requests hold no blocks.
    """

    request_id: str
    sampling: SamplingParams
    tokens: list[int]  # the prompt, then every generated token
    prompt_len: int
    key: int  # the token stream (mocker_tokens.stream_key)
    root: int  # the block-hash chain's seed (model, LoRA)
    chain: list[BlockHash]  # hashes of the full blocks of ``tokens`` known so far
    state: _State = _State.WAITING
    num_computed: int = 0  # tokens whose KV is in the cache
    uncached: int = 0
    cached_tokens: int | None = None  # set at first admission
    # the output stream
    pending: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    emitted: int = 0
    finish: FinishReason | None = None
    error: Exception | None = None
    waiter: asyncio.Future[None] | None = None
    # disaggregation
    carried: int = 0  # generated tokens at the end of ``tokens`` from the start (the prefill worker's)
    export: bool = False  # a prefill for a decode worker: hold the blocks at the end
    remote_tokens: int = 0  # prompt tokens whose KV is read from the prefill worker
    pulled: bool = False  # the read is done (the simulated transfer time has passed)
    script: tuple[int, ...] | None = None  # a scripted output (workers.engines.mocker.script)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # handed out with the first output
    transferred_tokens: int = 0

    @property
    def closed(self) -> bool:
        return self.finish is not None or self.error is not None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


# A token a step produced for a request, and the finish reason if it was the last one.
_Delivery = tuple[_Request, int, FinishReason | None, TokenLogprob | None]


class MockerEngine(Engine):
    def __init__(self, model: str, settings: MockerSettings, context_length: int = 8192,
                 *, kv_events: bool = True, kv_hold_s: float = 30.0, script: MockerScript | None = None) -> None:
        #: False simulates an engine that reports nothing about its cache (the routers' approximate mode).
        self.publishes_kv_events = kv_events
        self.model = model
        self.settings = settings
        self.context_length = context_length
        self.script = script
        #: The longest prompt + output a request may reach: the model's context, capped by the KV
        #: cache (a lone request must always fit, or preemption could never make room for it).
        self.max_model_len = min(context_length, settings.kv_blocks * settings.block_size)
        self._kv = KvBlockManager(settings.kv_blocks, settings.block_size)
        self._waiting: deque[_Request] = deque()
        self._running: dict[str, _Request] = {}  # in admission order: oldest first
        self._live: dict[str, _Request] = {}  # every request whose stream has not ended
        self._roots: dict[str | None, int] = {}
        #: LoRA adapters loaded: name to directory.
        self._loras: dict[str, str] = {}
        self._sink: KvEventSink = discard_kv_events
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._stopped = False
        #: Finished ``kv_export`` requests whose blocks wait for the decode worker's read, and the
        #: timers that end their hold.
        self.kv_hold_s = kv_hold_s
        self._held: dict[str, tuple[_Request, asyncio.TimerHandle]] = {}
        self._pulls: dict[str, asyncio.TimerHandle] = {}
        #: Running requests sent back to wait during the step being scheduled.
        self._preempted = 0

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
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="mocker-scheduler")
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
                    handle = self._handle(req) if req.request_id in self._held else None
                    yield EngineOutput(tokens, req.finish, self._usage(req), kv_handle=handle, logprobs=logprobs,
                                       prompt_logprobs=prompt_lps)
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
        return WorkerLoad(
            running=len(self._running), waiting=len(self._waiting),
            active_blocks=self._kv.active_blocks, total_blocks=self._kv.num_blocks,
        )

    async def clear_kv_cache(self) -> None:
        self._kv.clear()
        emit_kv_events(self._sink, self._kv.take_events())

    def cached_block_hashes(self) -> list[int]:
        return self._kv.cached_hashes()

    def cached_block_count(self) -> int:
        return self._kv.cached_count

    # ---- what a simulation may read (benchmarks' reference policies; no router can see this) ---
    def prompt_hit_tokens(self, token_ids: Sequence[int], lora: str | None = None) -> int:
        """Prompt tokens the prefix cache would reuse if ``token_ids`` were admitted now (as at
        admission: whole leading blocks, the last prompt token always computed)."""
        bs = self.settings.block_size
        hit = self._kv.cached_prefix(block_hashes(token_ids, bs, self._root(lora)))
        return min(hit, (len(token_ids) - 1) // bs) * bs

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens admitted or waiting whose KV is not computed yet (cache hits of waiting requests
        not subtracted: they are known only at admission)."""
        running = sum(r.prompt_len - r.num_computed for r in self._running.values() if r.num_computed < r.prompt_len)
        return running + sum(len(r.tokens) - r.num_computed for r in self._waiting)

    async def release_transfer(self, request_id: str) -> None:
        held = self._held.pop(request_id, None)
        if held is not None:
            req, timer = held
            timer.cancel()
            self._release(req)

    async def shutdown(self) -> None:
        self._stopped = True
        for req in list(self._live.values()):
            self._drop(req)
            self._close(req, finish="abort")
        for request_id in list(self._held):
            await self.release_transfer(request_id)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ---- requests in and out ------------------------------------------------------------------
    def _enqueue(self, request: EngineRequest) -> _Request:
        prompt = request.token_ids
        sampling = request.sampling
        if self._task is None or self._task.done() or self._stopped or self._wakeup is None:
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
        req = _Request(
            request_id=request.request_id, sampling=sampling, tokens=list(prompt), prompt_len=prompt_len,
            key=key, root=root,
            chain=block_hashes(prompt, self.settings.block_size, root), carried=request.carried_tokens,
            export=request.kv_export,
            script=self.script.output_for(prompt[:prompt_len]) if self.script is not None else None,
            prompt_logprobs=None if sampling.prompt_logprobs is None else
            prompt_logprobs(prompt[:prompt_len], self.settings.vocab_size, sampling.prompt_logprobs),
        )
        self._live[req.request_id] = req
        handle = request.kv_handle
        if handle and handle.get("engine") == "mocker" and handle.get("block_size") == self.settings.block_size:
            self._start_pull(req, min(int(handle.get("num_tokens", 0)), prompt_len))
        else:
            self._waiting.append(req)
            self._wakeup.set()
        return req

    # ---- disaggregation -----------------------------------------------------------------------
    def _handle(self, req: _Request) -> dict[str, object]:
        return {"engine": "mocker", "num_tokens": req.prompt_len, "block_size": self.settings.block_size}

    def _start_pull(self, req: _Request, remote_tokens: int) -> None:
        """Read the prompt's KV from the prefill worker: the blocks not cached here move, taking
        ``blocks x kv_bytes_per_block / transfer_gb_per_s``; the request waits meanwhile (as vLLM's
        do in WAITING_FOR_REMOTE_KVS) and then runs with only the rest of its prompt to compute."""
        s = self.settings
        bs = s.block_size
        req.remote_tokens = remote_tokens
        moved = max(0, -(-remote_tokens // bs) - self._kv.cached_prefix(req.chain))
        delay = 0.0 if s.no_sleep else moved * s.kv_bytes_per_block / (s.transfer_gb_per_s * 1e9) / s.speedup
        loop = asyncio.get_running_loop()
        if delay > self.kv_hold_s:
            # The prefill worker frees the blocks at the end of its hold: a read that would take
            # longer fails then, and the request computes its whole prompt here (as vLLM's
            # kv_load_failure_policy="recompute" does).
            self._pulls[req.request_id] = loop.call_later(self.kv_hold_s, self._pull_failed, req)
        else:
            self._pulls[req.request_id] = loop.call_later(delay, self._pulled, req)

    def _pulled(self, req: _Request) -> None:
        self._pulls.pop(req.request_id, None)
        if req.closed or req.state is not _State.WAITING or self._wakeup is None:
            return
        req.pulled = True
        self._waiting.append(req)
        self._wakeup.set()

    def _pull_failed(self, req: _Request) -> None:
        self._pulls.pop(req.request_id, None)
        if req.closed or req.state is not _State.WAITING or self._wakeup is None:
            return
        log.warning("request %s: the KV read from the prefill worker timed out after %.1f s; computing the "
                    "prompt here", req.request_id, self.kv_hold_s)
        req.remote_tokens = 0
        self._waiting.append(req)
        self._wakeup.set()

    def _hold(self, req: _Request) -> None:
        """A finished export keeps its blocks for the decode worker's read, at most ``kv_hold_s``."""
        timer = asyncio.get_running_loop().call_later(
            self.kv_hold_s, lambda: asyncio.ensure_future(self.release_transfer(req.request_id)))
        self._held[req.request_id] = (req, timer)

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

    def _root(self, lora: str | None) -> int:
        """The block-hash chain's seed for an adapter (router.hashing.root_hash), computed once."""
        root = self._roots.get(lora)
        if root is None:
            root = self._roots[lora] = root_hash(self.model, lora)
        return root

    def _usage(self, req: _Request) -> Usage:
        return Usage(prompt_tokens=req.prompt_len, completion_tokens=req.emitted + req.carried,
                     cached_tokens=req.cached_tokens or 0, transferred_tokens=req.transferred_tokens)

    def _close(self, req: _Request, *, finish: FinishReason | None = None, error: Exception | None = None) -> None:
        """End the request's stream (it still hands out its pending tokens)."""
        req.finish, req.error = finish, error
        self._live.pop(req.request_id, None)
        req.wake()

    def _deliver(self, deliveries: Sequence[_Delivery]) -> None:
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

    # ---- KV blocks ----------------------------------------------------------------------------
    def _drop(self, req: _Request) -> None:
        """Take a request out of the scheduler, releasing its blocks."""
        if req.state is _State.RUNNING:
            del self._running[req.request_id]
            self._release(req)
        elif req.state is _State.WAITING:
            pull = self._pulls.pop(req.request_id, None)
            if pull is not None:
                pull.cancel()
            else:
                self._waiting.remove(req)
        req.state = _State.DONE

    def _release(self, req: _Request) -> None:
        self._kv.release(req.chain[: req.num_computed // self.settings.block_size], req.uncached)
        req.uncached = 0

    def _preempt(self, req: _Request) -> None:
        """Send a running request back to the head of the queue; it recomputes from scratch."""
        self._preempted += 1
        del self._running[req.request_id]
        self._release(req)
        req.num_computed = 0
        req.pulled = False  # the read KV went with the blocks (what stays cached is a hit next time)
        req.state = _State.WAITING
        self._waiting.appendleft(req)

    def _reserve(self, req: _Request, chunk: int) -> bool:
        """Allocate the blocks ``req``'s next ``chunk`` tokens need, preempting the newest running
        requests while the cache is short. False when ``req`` itself had to be preempted."""
        bs = self.settings.block_size
        held = req.num_computed // bs + req.uncached
        need = -(-(req.num_computed + chunk) // bs) - held
        while need > self._kv.available:
            victim = next(reversed(self._running.values()))
            self._preempt(victim)
            if victim is req:
                return False
        self._kv.allocate(need)
        req.uncached += need
        return True

    def _register_full_blocks(self, req: _Request, start: int, end: int) -> None:
        """Blocks ``start..end-1`` of ``req`` just filled up: name them and put them in the cache."""
        bs = self.settings.block_size
        chain = req.chain
        known = len(chain)
        if known < end:  # blocks of generated tokens: continue the chain
            if known == 0:
                chain.extend(block_hashes(req.tokens[: end * bs], bs, req.root))
            else:
                chain.extend(block_hashes(
                    req.tokens[(known - 1) * bs : end * bs], bs, req.root, start_block=1, parent=chain[known - 1]))
        for i in range(start, end):
            self._kv.register(chain[i], chain[i - 1] if i else None)
        req.uncached -= end - start

    # ---- the scheduler ------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        planned_end = loop.time()
        while True:
            if not self._running and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            start = loop.time()
            try:
                step, deliveries = self._step()
            except Exception as exc:  # noqa: BLE001 - fail the requests, keep the engine serving
                log.exception("mocker scheduler step failed")
                self._fail_all(exc)
                continue
            emit_kv_events(self._sink, self._kv.take_events())
            assert step.duration_s is not None
            if self.settings.no_sleep:
                await asyncio.sleep(0)
            else:
                base = planned_end if start - planned_end < _CATCH_UP_S else start
                planned_end = base + step.duration_s
                await asyncio.sleep(max(0.0, planned_end - loop.time()))
            emit_step(self.on_step, step)
            self._deliver(deliveries)

    def _step(self) -> tuple[StepStats, list[_Delivery]]:
        """Schedule and compute one step; returns what it did (its simulated duration, also with
        ``no_sleep``) and the tokens it produced."""
        batch: list[tuple[_Request, int]] = []
        self._preempted = 0
        # The decode part reads the KV usage as the step begins, before its own chunks take blocks:
        # what the running requests hold. Dynamo's mocker steps as if it did the same: only so do the
        # two step alike, to a few milliseconds, in ``python -m bench.dynamo_compare --parity``.
        kv_usage = self._kv.active_blocks / self._kv.num_blocks
        budget, preempted = self._schedule_running(batch, self.settings.max_num_batched_tokens)
        if not preempted:
            self._admit(batch, budget)
        prefill_tokens = decoding = 0
        for req, chunk in batch:
            if req.num_computed >= req.prompt_len and req.num_computed == len(req.tokens) - 1:
                decoding += 1
            else:
                prefill_tokens += chunk
        deliveries = [d for req, chunk in batch if (d := self._compute(req, chunk)) is not None]
        duration_s = step_ms(prefill_tokens, decoding, kv_usage, self.settings.speedup) / 1000.0
        return StepStats(duration_s, prefill_tokens, decoding, self._preempted, kv_usage), deliveries

    def _schedule_running(self, batch: list[tuple[_Request, int]], budget: int) -> tuple[int, bool]:
        """Give running requests their next chunk, oldest first; returns the token budget left and
        whether a request was preempted (then nobody new is admitted this step, as in vLLM)."""
        waiting_before = len(self._waiting)
        for req in list(self._running.values()):
            if budget <= 0:
                break
            if req.state is not _State.RUNNING:  # preempted to make room for an older request
                continue
            chunk = min(len(req.tokens) - req.num_computed, budget)
            if self._reserve(req, chunk):
                budget -= chunk
                batch.append((req, chunk))
        return budget, len(self._waiting) > waiting_before

    def _admit(self, batch: list[tuple[_Request, int]], budget: int) -> None:
        """Move waiting requests to running, in order, while they fit in this step."""
        s = self.settings
        bs = s.block_size
        while self._waiting and budget > 0 and len(self._running) < s.max_num_seqs:
            req = self._waiting[0]
            hit = min(self._kv.cached_prefix(req.chain), (len(req.tokens) - 1) // bs)
            # A pulled request holds the prefill worker's KV for its first ``remote_tokens`` tokens.
            computed = max(hit * bs, min(req.remote_tokens, len(req.tokens) - 1) if req.pulled else 0)
            chunk = min(len(req.tokens) - computed, budget)
            need = -(-(computed + chunk) // bs) - hit
            reused = req.chain[:hit]
            if not self._kv.can_allocate(need, reused):
                break
            self._waiting.popleft()
            self._kv.acquire(reused)
            self._kv.allocate(need)
            req.num_computed, req.uncached, req.state = hit * bs, need, _State.RUNNING
            if computed > hit * bs:  # the blocks read from the prefill worker enter the cache here
                self._register_full_blocks(req, hit, computed // bs)
                req.num_computed = computed
                if req.cached_tokens is None:
                    req.transferred_tokens = computed - hit * bs
            if req.cached_tokens is None:
                req.cached_tokens = hit * bs
            self._running[req.request_id] = req
            budget -= chunk
            batch.append((req, chunk))

    def _compute(self, req: _Request, chunk: int) -> _Delivery | None:
        """Run ``chunk`` tokens of ``req``; once its KV has caught up, it samples the next token."""
        bs = self.settings.block_size
        before = req.num_computed // bs
        req.num_computed += chunk
        after = req.num_computed // bs
        if after > before:
            self._register_full_blocks(req, before, after)
        if req.num_computed < len(req.tokens):  # a prefill chunk short of the end
            return None
        position = len(req.tokens) - req.prompt_len
        if req.script is not None and position < len(req.script):
            token, logprob = req.script[position], _certain(req.script[position], req.sampling)
        else:
            token, logprob = choose(req.key, position, req.sampling, self.settings.vocab_size,
                                    req.tokens, req.prompt_len)
        req.tokens.append(token)
        reason = finish_reason(token, len(req.tokens) - req.prompt_len, len(req.tokens), req.sampling,
                               self.max_model_len)
        if reason is None and req.script is not None and position + 1 == len(req.script) \
                and not req.sampling.ignore_eos:
            reason = "stop"  # the script's end, as a model's end-of-sequence token
        if reason is not None:
            del self._running[req.request_id]
            if req.export:
                self._hold(req)
            else:
                self._release(req)
            req.state = _State.DONE
        return req, token, reason, logprob

    def _fail_all(self, exc: BaseException) -> None:
        """After a scheduler fault the state cannot be trusted: fail every request and start over
        with an empty KV cache."""
        for req in list(self._live.values()):
            req.state = _State.DONE
            self._close(req, error=UpstreamError(f"mocker scheduler failed: {type(exc).__name__}: {exc}"))
        self._waiting.clear()
        self._running.clear()
        self._kv = KvBlockManager(self.settings.kv_blocks, self.settings.block_size)
        emit_kv_events(self._sink, [AllBlocksCleared()])

    def _on_scheduler_exit(self, task: asyncio.Task[None]) -> None:
        """The scheduler ends only when shutdown cancels it; anything else is a bug that must not
        leave requests waiting forever."""
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            return
        log.error("mocker scheduler died", exc_info=exc)
        self._fail_all(exc)
