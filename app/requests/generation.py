"""One request's life on the platform: route, enqueue, stream back, detokenize, end cleanly.

:class:`Generation` is used as an async context manager. ``start()`` routes and enqueues (errors
there are client-visible HTTP errors: nothing has streamed yet); ``text()`` yields text as
deltas arrive (coalescing whatever arrived together); leaving the context always releases
everything: the stream registration, the router's in-flight prediction (released however the
request ends: done, error, cancel), the worker's request (cancelled unless it finished) and the
usage record. The first token delta tells the router the prompt is computed (``prefill_done``).

Migration: when the worker serving a request is lost (its lease expired: the hub fails the stream
with ``worker_lost``) before the request ended, the request continues on another live worker of
the model, which is given the prompt plus every token already streamed (``carried_tokens``) and
computes it as its prompt; the client sees only a pause. This covers a prefill worker lost before
the first token (the decode worker, or any other, prefills locally), a decode worker lost after
the hand-off, and a task that was queued on a worker that died. Each attempt has its own id on
the wire (``<request id>-r<n>``), so a lost worker that comes back cannot write into the new
attempt's stream; at most ``frontend.max_migrations`` moves per request.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from app.model_card import ModelCard
from app.output.text import TextAssembler
from app.protocol.common import SamplingFields
from app.requests.attempt import Attempt
from app.requests.observer import Outcome, RequestObserver
from core.errors import (
    STREAM_INTERRUPTED,
    ContextLengthExceeded,
    InvalidRequest,
    NoWorkerAvailable,
    Overloaded,
    RequestPlaneUnavailable,
    ShuttingDown,
    SluiceError,
    StreamStalled,
    UpstreamError,
)
from core.messages import ControlCommand, ErrorInfo, SamplingParams, StructuredOutput, TokenDelta, TokenLogprob
from core.task_requests import (
    DecodeTarget,
    GenerateRequest,
    PrefillRequest,
    ResumeRequest,
    request_to_builtins,
)
from core.wire import GENERATE_TASK, PREFILL_TASK, TaskParts, task_message_parts
from router.disagg import PrefillPlan, split_pools
from router.policies import RouteDecision, RouteRequest, RouterOverrides
from router.registry import LiveWorker
from router.request_plan import (
    DisaggMode,
    PlanRequest,
    disagg_mode,
    disagg_thresholds,
    plan_route,
    prefill_route_id,
)

if TYPE_CHECKING:
    from app.accounts.service import Principal
    from app.runtime import FrontendRuntime

log = logging.getLogger(__name__)

#: A worker's errors after which the request continues on another worker (up to the migration limit).
MOVABLE_ERRORS = ("worker_lost", "worker_draining", "engine_error")


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    stops: tuple[str, ...] = ()
    overrides: RouterOverrides = field(default_factory=RouterOverrides)
    #: OpenAI's ``user``: the application's id for its end user, written on the request's log line.
    user: str | None = None
    #: Whether the usage record charges the prompt (a request's later choices share the first's).
    charge_prompt: bool = True
    #: The LoRA adapter of ``model`` the request names (app.lora); its workers are those that hold it.
    lora: str | None = None


def resolve_max_tokens(requested: int | None, prompt_len: int, context_length: int, default: int,
                       prompt_param: str = "messages") -> int:
    """The completion budget: what was asked, or what fits; a prompt that leaves no room is a 400."""
    if prompt_len >= context_length:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context_length} tokens; the prompt has {prompt_len} tokens.",
            param=prompt_param)
    room = context_length - prompt_len
    if requested is None:
        return min(default, room)
    if requested > room:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the completion). "
            "Please reduce the prompt or the completion length.", param="max_tokens")
    return requested


class Generation:
    def __init__(self, rt: FrontendRuntime, spec: GenerationSpec, card: ModelCard,
                 principal: Principal | None) -> None:
        self.rt = rt
        self.spec = spec
        self.card = card
        self.principal = principal
        self.request_id = uuid.uuid4().hex
        self.prompt_tokens = len(spec.prompt_token_ids)
        self.completion_tokens = 0
        self.cached_tokens = 0
        #: Prompt tokens whose KV the serving worker read from a prefill worker (not in cached_tokens).
        self.transferred_tokens = 0
        self.finish_reason: str | None = None
        self.error_type: str | None = None
        self.pool = ""
        #: Disaggregation: where the prompt was computed (None: no prefill pool was considered).
        self.plan: PrefillPlan | None = None
        #: The first attempt's prefill worker (the usage record and the headers name it).
        self.prefill_worker_id: str | None = None
        #: The current attempt (None before ``start``; the last one stays after ``close``, for the
        #: response's headers).
        self.attempt: Attempt | None = None
        self._closed = False
        #: Every token streamed so far (what a migrated attempt is given), and the workers lost.
        self._generated: list[int] = []
        #: With ``sampling.logprobs``: (token id, its logprobs) of the tokens not yet handed out.
        self._logprobs: list[tuple[int, TokenLogprob]] = []
        #: With ``sampling.prompt_logprobs``: the prompt's, from the first attempt that gave them.
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self._lost: list[str] = []
        self._migrations = 0
        #: The worker this request counts against in admission control until its first token.
        self._waiting_on: str | None = None
        self.observer = RequestObserver(rt, spec.model, principal)
        self._deadline = self.observer.wall0 + rt.settings.frontend.request_timeout_s
        self._done = False

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        rt, spec = self.rt, self.spec
        workers = rt.directory.workers_for(spec.model, spec.lora)
        mode = self._mode = spec.overrides.mode or rt.settings.router.mode
        workers, prefill_workers = split_pools(workers)
        if not workers:
            raise NoWorkerAvailable(f"no decode or aggregated worker is serving {spec.model!r} right now; retry shortly")
        if spec.overrides.worker_id:
            workers = [w for w in workers if w.record.worker_id == spec.overrides.worker_id]
            if not workers:
                raise NoWorkerAvailable(f"worker {spec.overrides.worker_id!r} is not serving {spec.model!r}")
        try:
            workers = rt.admission.admit(spec.model, workers)
        except Overloaded:
            rt.metrics.admission_refusals.labels(spec.model).inc()
            raise
        prefill_workers = rt.admission.open_workers(prefill_workers)
        policy = rt.policy(mode)
        disagg = self._disagg_mode()
        payload = GenerateRequest(request_id=self.request_id, model=spec.model, token_ids=spec.prompt_token_ids,
                                  sampling=spec.sampling, reply_channel=rt.hub.channel, deadline=self._deadline,
                                  frontend_id=rt.frontend_id, lora=spec.lora)
        task = task_message_parts(GENERATE_TASK, [request_to_builtins(payload)], task_id=self.request_id,
                                  argsrepr=f"request {self.request_id}: {self.prompt_tokens} prompt tokens")
        request = PlanRequest(
            RouteRequest(self.request_id, spec.model, spec.prompt_token_ids, spec.lora, overrides=spec.overrides,
                         task=task),
            serving=workers, prefill=prefill_workers, disagg=disagg,
            thresholds=disagg_thresholds(rt.settings.disagg, spec.overrides),
            prefill_task=lambda decode: self._prefill_task(payload, decode))
        # The stream is registered before anything can reach a worker (the kv policy enqueues as it
        # routes): a first delta must find its request.
        stream = rt.hub.open(self.request_id, None)
        self._policy = policy
        self.observer.enqueued()
        attempt = Attempt(self.request_id, stream)
        try:
            plan = await plan_route(request, self._choose)
            self.plan = plan.disagg
            attempt.follow(plan)
            self.prefill_worker_id = attempt.prefill_worker
            for queue, parts in plan.to_push:
                await rt.enqueuer.push(queue, parts.for_queue(queue))
        except BaseException as exc:
            rt.hub.discard(self.request_id)
            policy.release(self.request_id)
            policy.release(self._prefill_key)
            if not isinstance(exc, SluiceError):
                # Redis failed under us: the task may have been enqueued before the reply was lost.
                # A broadcast cancel makes whichever worker gets it drop it at once.
                rt.send_control(rt.keys.control_broadcast, ControlCommand("cancel", self.request_id))
            raise
        self.attempt = attempt
        self._wait_on(attempt.serving)
        self.pool = workers[0].record.pool

    async def _choose(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        """The policy's decision, timed and counted in the routing metrics (with, in kv mode, the share
        of the prompt cached on the chosen worker)."""
        t0 = time.perf_counter()
        decision = await self._policy.choose(request, workers)
        seconds = time.perf_counter() - t0
        ratio = None
        if self._mode == "kv" and request.token_ids:
            chosen = next((w for w in workers if w.record.worker_id == decision.worker_id), None)
            if chosen is not None:
                ratio = min(1.0, decision.overlap_blocks * chosen.record.block_size / len(request.token_ids))
        self.rt.metrics.observe_decision(request.model, self._mode, decision.worker_id, seconds, ratio)
        return decision

    @property
    def _prefill_key(self) -> str:
        return prefill_route_id(self.request_id)

    def _disagg_mode(self) -> DisaggMode:
        try:
            return disagg_mode(self.spec.overrides.disagg, self.rt.settings.disagg.enabled)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="x-sluice-router") from None

    def _prefill_task(self, payload: GenerateRequest, decode: LiveWorker) -> TaskParts:
        """The prefill task for the decode worker ``decode``: the prefill worker pushes the decode task
        there itself once the prompt is computed."""
        prefill = PrefillRequest(**msgspec.structs.asdict(payload),
                                 decode=DecodeTarget(decode.record.worker_id, decode.record.queue))
        return task_message_parts(PREFILL_TASK, [request_to_builtins(prefill)], task_id=self._prefill_key,
                                  argsrepr=f"request {self.request_id}: prefill of {self.prompt_tokens} tokens "
                                           f"for {decode.record.worker_id}")

    def take_logprobs(self) -> list[tuple[int, TokenLogprob]]:
        """The logprobs of the tokens received since the last call (with ``sampling.logprobs``)."""
        out, self._logprobs = self._logprobs, []
        return out

    async def text(self) -> AsyncIterator[str]:
        """Client-visible text as it arrives; ends after the last delta. Raises UpstreamError on failure."""
        assert self.attempt is not None
        card = self.card
        assembler = TextAssembler(card.tokenizer, card.decode_stream(), self.spec.stops)
        stall = self.rt.settings.frontend.stall_timeout_s
        while True:
            left = self._deadline - time.time()
            queued = self._queued_left()
            try:
                batch = await self.attempt.stream.get_batch(max(min(stall, left, queued), 0.0))
            except TimeoutError:
                if queued <= min(stall, left):
                    self._fail("queue_timeout")
                    raise Overloaded(
                        f"no worker took the request within {self.rt.settings.frontend.max_queue_wait_s:g} s; "
                        "the model's workers are saturated", retry_after_s=self.rt.admission.retry_after_s,
                        code="queue_timeout") from None
                if left > stall and self._computing_prompt():
                    continue
                self._fail("timeout")
                # Which limit was waited for, not the clock afterwards: the loop's timers may fire a
                # little early against wall-clock time.
                if left <= stall:
                    raise UpstreamError("the request did not finish before its deadline", code="timeout") from None
                raise StreamStalled(f"no tokens from the worker for {stall:.0f} s") from None
            attempt = self.attempt
            self.observer.taken(attempt.stream.started_at)
            token_ids: list[int] = []
            last = None
            for delta in batch:
                token_ids.extend(delta.token_ids)
                if delta.logprobs:
                    self._logprobs.extend(zip(delta.token_ids, delta.logprobs, strict=False))
                if delta.prompt_logprobs and self.prompt_logprobs is None:
                    self.prompt_logprobs = delta.prompt_logprobs
                if delta.is_last:
                    last = delta
            if token_ids:
                self.observer.tokens(len(token_ids))
                if attempt.awaiting_first:
                    attempt.awaiting_first = False
                    self._wait_on(None)
                    self._policy.prefill_done(attempt.wire_id)
                    self._policy.release(self._prefill_key)  # the prefill worker is done with it
                self._generated.extend(token_ids)
                self.completion_tokens += len(token_ids)
                text = assembler.add(token_ids)
                if assembler.stopped:
                    self.finish_reason = "stop"
                    self._cancel_on_worker()
                    if text:
                        yield text
                    return
                if text:
                    yield text
            if last is not None:
                if last.error is None and last.finish_reason not in ("stop", "length"):
                    # Ended by the worker, not by the request (an abort the frontend did not ask for, an
                    # engine error from an older worker): a failure, moved on like one, never an answer.
                    last = msgspec.structs.replace(last, error=ErrorInfo(
                        "engine_error", f"worker {attempt.serving} ended the request early ({last.finish_reason})"))
                if self._worker_lost(last):
                    await self._migrate(last.error)
                    continue
                if self._past_migration_limit(last) and last.error is not None:
                    self._done = True
                    self.error_type = "migration_limit"
                    limit = self._migration_limit()
                    raise UpstreamError(f"{last.error.message}; the request was not moved to another worker: "
                                        f"it reached its migration limit ({self._migrations} of {limit})",
                                        code="migration_limit")
                if last.error is not None and last.worker_id is None:
                    # The frontend ended the stream (Redis connection lost, a gap, shutting down),
                    # not the worker: tell the worker, which may still be running it.
                    self._cancel_on_worker()
                self._done = True
                if last.error is not None:
                    self.error_type = last.error.code or last.error.type
                    if last.error.type == ShuttingDown.code:
                        raise ShuttingDown(last.error.message)
                    if last.error.type == STREAM_INTERRUPTED:  # Redis went away under it: retry, as for a 503
                        self.error_type = RequestPlaneUnavailable.code
                        raise RequestPlaneUnavailable(last.error.message)
                    if last.error.type == InvalidRequest.type:
                        raise InvalidRequest(last.error.message, code=last.error.code)
                    raise UpstreamError(f"the worker failed: {last.error.message}",
                                        code=last.error.code or last.error.type)
                if last.usage is not None:
                    self.cached_tokens = last.usage.cached_tokens
                    self.transferred_tokens = last.usage.transferred_tokens
                    self.completion_tokens = last.usage.completion_tokens
                self.finish_reason = "length" if last.finish_reason == "length" else "stop"
                tail = assembler.finish()
                if tail:
                    yield tail
                return

    def _queued_left(self) -> float:
        """Seconds the request may still wait for a worker to take it (inf once taken, or unbounded)."""
        limit, attempt = self.rt.settings.frontend.max_queue_wait_s, self.attempt
        if limit <= 0 or attempt is None or not attempt.awaiting_first or attempt.stream.started_at is not None:
            return float("inf")
        return attempt.queued_since + limit - time.monotonic()

    def _computing_prompt(self) -> bool:
        """No token yet from a worker whose lease is live: it is computing the prompt (a long one
        takes minutes on a CPU) or has it queued. Silence then is not a stall; a dead worker is
        noticed by its lease, and the deadline still holds."""
        attempt = self.attempt
        return (attempt is not None and attempt.awaiting_first and attempt.serving is not None
                and attempt.serving in self.rt.directory.alive)

    def _worker_lost(self, last: TokenDelta) -> bool:
        """The serving worker was lost (or, draining, refused the request) before the request ended,
        and the request may move on."""
        return (last.error is not None and last.error.type in MOVABLE_ERRORS
                and self._migrations < self._migration_limit()
                and len(self._generated) < self.spec.sampling.max_tokens)

    def _migration_limit(self) -> int:
        """How many times the request may move: the deployment's limit, or the request's own
        (``x-sluice-router: max_migrations=N``) where that is lower."""
        limit = self.rt.settings.frontend.max_migrations
        asked = self.spec.overrides.max_migrations
        return limit if asked is None else min(limit, int(asked))

    def _past_migration_limit(self, last: TokenDelta) -> bool:
        """The worker was lost with tokens still to come, and the request may not move again."""
        return (last.error is not None and last.error.type in MOVABLE_ERRORS
                and self._migrations >= self._migration_limit()
                and len(self._generated) < self.spec.sampling.max_tokens)

    async def _migrate(self, why: ErrorInfo | None = None) -> None:
        """Continue the request on another live worker: the prompt plus the tokens streamed so far,
        computed there as its prompt (a local prefill), numbered on from them. Raises UpstreamError
        when no other worker serves the model."""
        rt, spec = self.rt, self.spec
        old = self.attempt
        assert old is not None
        lost = old.serving
        if lost and lost not in self._lost:
            self._lost.append(lost)
        self._wait_on(None)
        rt.hub.discard(old.wire_id)
        self._policy.release(old.wire_id)
        self._policy.release(self._prefill_key)
        # Every worker of the old attempt drops it: a "lost" worker that was only slow (it may still
        # hand a decode task on, or be handed one), and the decode worker it was meant for (a cancel
        # that arrives before the task is remembered). A prefill worker also frees the blocks it
        # holds for the old attempt now instead of at its hold's end.
        old.cancel(rt)
        old.release_prefill(rt)
        workers = [w for w in rt.directory.by_model.get(spec.model, ())
                   if w.record.pool.serves_clients and w.record.worker_id not in self._lost
                   and (spec.lora is None or w.load.has_lora(spec.lora))]
        workers = rt.admission.open_workers(workers) or workers  # admitted already: it is not refused
        pinned = [w for w in workers if w.record.worker_id == spec.overrides.worker_id]
        if not workers:
            self._done = True
            self.error_type = "engine_error" if why is not None and why.type == "engine_error" else "worker_lost"
            said = why.message if why is not None else f"worker {lost} stopped responding"
            raise UpstreamError(f"{said}; no other worker serves {spec.model!r}", code=self.error_type)
        self._migrations += 1
        wire_id = f"{self.request_id}-r{self._migrations}"
        carried = len(self._generated)
        token_ids = [*spec.prompt_token_ids, *self._generated]
        sampling = spec.sampling if self.prompt_logprobs is None \
            else msgspec.structs.replace(spec.sampling, prompt_logprobs=None)  # had them: not again
        payload = ResumeRequest(request_id=wire_id, model=spec.model, token_ids=token_ids,
                                sampling=sampling, reply_channel=rt.hub.channel, deadline=self._deadline,
                                carried_tokens=carried, frontend_id=rt.frontend_id, lora=spec.lora)
        task = task_message_parts(GENERATE_TASK, [request_to_builtins(payload)], task_id=wire_id,
                                  argsrepr=f"request {self.request_id}: resumed after worker {lost} was lost, "
                                           f"{carried} tokens carried")
        self.attempt = attempt = Attempt(wire_id, rt.hub.open(wire_id, None, first_seq=carried))
        self.observer.enqueued()
        over = dataclasses.replace(spec.overrides, worker_id=None)
        try:
            plan = await plan_route(PlanRequest(
                RouteRequest(wire_id, spec.model, token_ids, spec.lora, overrides=over, task=task),
                serving=pinned or workers), self._choose)
            for queue, parts in plan.to_push:
                await rt.enqueuer.push(queue, parts.for_queue(queue))
        except SluiceError:
            raise
        except Exception as exc:  # noqa: BLE001 - Redis failed under us: the client gets a clear error
            self._done = True
            raise UpstreamError(f"worker {lost} stopped responding and the request could not be moved: {exc}",
                                code="worker_lost") from exc
        attempt.follow(plan)
        self._wait_on(attempt.serving)
        rt.metrics.migrations.labels(spec.model).inc()
        log.warning("request %s: worker %s lost after %d tokens; continuing on %s",
                    self.request_id, lost, carried, attempt.serving)

    def _wait_on(self, worker_id: str | None) -> None:
        """Count the request against ``worker_id`` in admission control (None: against none)."""
        if self._waiting_on is not None:
            self.rt.admission.remove(self._waiting_on)
        self._waiting_on = worker_id
        if worker_id is not None:
            self.rt.admission.add(worker_id)

    @property
    def served_by(self) -> str | None:
        """The worker that generates the answer (the ``x-sluice-worker`` header)."""
        return self.attempt.server if self.attempt else None

    def _fail(self, kind: str) -> None:
        self.error_type = kind
        self._cancel_on_worker()

    def _cancel_on_worker(self) -> None:
        """Tell the worker to stop this request (fire and forget; the worker frees its KV)."""
        if self._done:
            return
        self._done = True
        if self.attempt is not None:
            self.attempt.cancel(self.rt)

    async def close(self) -> None:
        attempt = self.attempt
        if attempt is None or self._closed:
            return
        self._closed = True
        if not self._done:
            if self.error_type is None and self.finish_reason is None:
                self.error_type = "cancelled"
            self._cancel_on_worker()
        self._wait_on(None)
        self.rt.hub.discard(attempt.wire_id)
        self._policy.release(attempt.wire_id)
        self._policy.release(self._prefill_key)
        self.observer.finish(Outcome(
            request_id=self.request_id, model=self.spec.model, pool=self.pool,
            worker_ids=list(dict.fromkeys(w for w in (self.prefill_worker_id, *self._lost, attempt.server) if w)),
            prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
            transferred_tokens=self.transferred_tokens, completion_tokens=self.completion_tokens,
            finish_reason=self.finish_reason, error_type=self.error_type, charge_prompt=self.spec.charge_prompt,
            user=self.spec.user, disagg_reason=self.plan.reason if self.plan else None))


def sampling_from(body: SamplingFields, defaults: dict[str, float], max_tokens: int, vocab_size: int,
                  logprobs: int | None = None, structured: StructuredOutput | None = None,
                  prompt_logprobs: int | None = None) -> SamplingParams:
    """The engine's sampling for a request: each field as asked, else the deployment's or model's
    default (``defaults``), else OpenAI's or vLLM's neutral value."""
    if body.min_tokens > max_tokens:
        raise InvalidRequest("min_tokens must not exceed max_tokens", param="min_tokens")
    bias = body.logit_bias or {}
    if any(token >= vocab_size for token in bias):
        raise InvalidRequest(f"logit_bias names token ids beyond the vocabulary ({vocab_size} tokens)", param="logit_bias")

    def pick(name: str, neutral: float) -> float:
        asked = getattr(body, name)
        return float(asked if asked is not None else defaults.get(name, neutral))

    return SamplingParams(
        max_tokens=max_tokens, temperature=pick("temperature", 1.0), top_p=pick("top_p", 1.0), seed=body.seed,
        stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos, min_tokens=body.min_tokens,
        top_k=max(0, int(pick("top_k", 0))), min_p=pick("min_p", 0.0),
        presence_penalty=pick("presence_penalty", 0.0), frequency_penalty=pick("frequency_penalty", 0.0),
        repetition_penalty=pick("repetition_penalty", 1.0),
        logit_bias=tuple(sorted((int(t), float(b)) for t, b in bias.items())), logprobs=logprobs,
        structured=structured, prompt_logprobs=prompt_logprobs)
