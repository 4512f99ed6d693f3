"""A worker's request runner: serves one task request on the engine, start to end, on the engine
loop's thread (workers.host hands requests over from Celery's task threads).

Invariant: every request handed to :meth:`RequestRunner.serve` ends with exactly one last delta on its
reply channel (``finish_reason`` or ``error``), whatever happens to the engine; a task message the
worker cannot read is answered with an ``unsupported_message`` error event where it names its reply
channel (:meth:`RequestRunner.refuse`).

Disaggregation (docs/disaggregation.md): a :class:`~core.task_requests.PrefillRequest` is a prefill
for its ``decode`` worker. The engine computes the prompt and one token and holds the prompt's blocks;
the runner publishes that token (``seq`` 0) and, in the same pipelined call, pushes a ``generate`` task
carrying a :class:`~core.task_requests.DecodeRequest` onto the decode worker's queue: the engine's
transfer handle, the prompt plus that token (``carried_tokens`` 1) and the original sampling. The
decode worker's deltas start at ``seq`` 1; once its engine has read the KV (its first output) or the
request has ended, it tells the prefill worker (``kv_release``), which frees the held blocks. A
prefill that ends the request (a stop token, ``max_tokens`` 1, an abort, an error) publishes the last
delta itself and frees its blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from core.errors import SluiceError
from core.keys import Keys
from core.logs import request_id_var
from core.messages import ControlCommand, ErrorInfo, TokenDelta, TokenLogprob, encode_control, encode_delta
from core.task_requests import (
    DecodeRequest,
    PrefillRequest,
    TaskRequest,
    UnreadableRequest,
    request_to_builtins,
)
from core.wire import GENERATE_TASK, task_message
from router.registry import WorkerIdentity
from workers.engines.base import Engine, EngineRequest
from workers.metrics import WorkerMetrics
from workers.publisher import DeltaPublisher
from workers.running import RunningRequests

log = logging.getLogger(__name__)


@dataclass
class RequestRunner:
    engine: Engine
    identity: WorkerIdentity
    keys: Keys
    publisher: DeltaPublisher
    metrics: WorkerMetrics
    running: RunningRequests

    async def refuse(self, exc: UnreadableRequest) -> None:
        """Answer a task message this worker cannot read with an error event, where it names where to."""
        log.warning("task for request %s refused: %s", exc.request_id or "(unnamed)", exc.reason)
        if exc.prefill_worker_id is not None and exc.request_id is not None:  # its KV need not wait for a timeout
            self._release_on(exc.prefill_worker_id, exc.request_id)
        if exc.request_id is None or exc.reply_channel is None:
            return
        self.publisher.publish(exc.reply_channel, encode_delta(TokenDelta(
            exc.request_id, exc.first_seq, worker_id=self.identity.worker_id,
            error=ErrorInfo("unsupported_message", f"worker {self.identity.worker_id} cannot serve this request: "
                                                   f"{exc.reason}", "unsupported_message"))))

    async def serve(self, req: TaskRequest) -> None:
        """Run one request; its log lines carry its id (on the wire: the frontend's request id, with
        ``-r<n>`` after a migration or ``:prefill`` for a remote prefill)."""
        request_id_var.set(req.request_id)  # this task's own context
        t0 = time.monotonic()
        log.info("request %s taken: %d prompt tokens, max_tokens %d", req.request_id,
                 req.prompt_tokens, req.sampling.max_tokens)
        try:
            await self._run(req)
        finally:
            log.info("request %s ended after %.3f s", req.request_id, time.monotonic() - t0)

    async def _run(self, req: TaskRequest) -> None:
        started_at = time.time()
        seq = req.first_seq  # a decode after a remote prefill continues the prefill's seq 0
        wid = self.identity.worker_id
        if self.running.take_cancel(req.request_id):
            self._release_remote(req)
            self._send(req, TokenDelta(req.request_id, seq, finish_reason="abort", worker_id=wid))
            return
        if self.running.draining:  # the frontend moves it to another worker
            self._release_remote(req)
            self._send(req, TokenDelta(req.request_id, seq, worker_id=wid, error=ErrorInfo(
                "worker_draining", f"worker {wid} is shutting down and takes no new request")))
            return
        if started_at > req.deadline:
            self._release_remote(req)
            self._send(req, TokenDelta(req.request_id, seq, worker_id=wid,
                                       error=ErrorInfo("timeout", "request deadline passed before a worker took it")))
            return
        self.running.started(req.request_id, asyncio.current_task(), req.frontend_id)
        # Taken: the frontend learns which worker runs it (pool mode) and that its queue wait is over.
        self._send(req, TokenDelta(req.request_id, seq, worker_id=wid, started_at=started_at))
        deadline_timer = asyncio.get_running_loop().call_later(
            max(0.0, req.deadline - started_at), lambda: asyncio.ensure_future(self.engine.abort(req.request_id)))
        prefill = isinstance(req, PrefillRequest)
        first = True
        try:
            stream = self.engine.generate(self._engine_request(req))
            async for out in stream:
                if not out.token_ids and out.finish_reason is None:
                    continue
                if out.token_ids:
                    self.metrics.generated_tokens.inc(len(out.token_ids))
                if out.usage is not None:
                    self.metrics.observe_usage(out.usage)
                if first and isinstance(req, DecodeRequest):
                    self._release_remote(req)  # the engine has read the KV: the prefill worker may free it
                if isinstance(req, PrefillRequest) and out.finish_reason == "length" and req.sampling.max_tokens > 1:
                    self._hand_off(req, out.token_ids, out.kv_handle, started_at, out.logprobs, out.prompt_logprobs)
                    return
                failure = self._failure(req, out.finish_reason)
                if failure is not None:
                    if out.token_ids:
                        self._send(req, TokenDelta(req.request_id, seq, out.token_ids, worker_id=wid if first else None))
                        seq += 1
                    if prefill and out.kv_handle is not None:
                        await self.engine.release_transfer(req.request_id)
                    self._send(req, TokenDelta(req.request_id, seq, worker_id=wid, error=failure, usage=out.usage))
                    return
                if prefill and out.kv_handle is not None:  # the request ends here: nothing will read the KV
                    await self.engine.release_transfer(req.request_id)
                self._send(req, TokenDelta(
                    req.request_id, seq, out.token_ids, finish_reason=out.finish_reason, usage=out.usage,
                    worker_id=wid if first else None, started_at=started_at if first else None,
                    logprobs=out.logprobs, prompt_logprobs=out.prompt_logprobs))
                first = False
                seq += 1
                if out.finish_reason is not None:
                    return
            raise RuntimeError("engine ended the stream without a finish reason")
        except SluiceError as exc:  # the engine refused the request or failed cleanly: pass its verdict on
            log.info("request %s failed: %s", req.request_id, exc.message)
            self._send(req, TokenDelta(req.request_id, seq, worker_id=wid,
                                       error=ErrorInfo(exc.type, exc.message, exc.code)))
        except Exception as exc:  # noqa: BLE001 - the client gets the error instead of silence
            log.exception("request %s failed", req.request_id)
            self._send(req, TokenDelta(req.request_id, seq, worker_id=wid,
                                       error=ErrorInfo("engine_error", f"{type(exc).__name__}: {exc}")))
        finally:
            deadline_timer.cancel()
            self.running.ended(req.request_id)
            if first:
                self._release_remote(req)

    def _failure(self, req: TaskRequest, finish: str | None) -> ErrorInfo | None:
        """The error a request's end is, where the engine ended it for a reason other than its own
        (``stop``, ``length``) or the frontend's cancel: the worker draining or dropping it (the frontend
        moves it), its deadline, or an engine error (vLLM's ``FINISHED_ERROR``: a KV load, a grammar; the
        frontend moves it too). Never a normal finish: the client would get a short answer with 200."""
        if finish == "abort" and req.request_id in self.running.stopped:
            return self.running.stopped[req.request_id]
        if finish == "abort" and time.time() >= req.deadline:
            return ErrorInfo("timeout", "the request's deadline passed while it ran")
        if finish == "error":
            log.warning("request %s: the engine ended it with an error", req.request_id)
            return ErrorInfo("engine_error", f"worker {self.identity.worker_id}'s engine ended the request with an error")
        return None

    def _engine_request(self, req: TaskRequest) -> EngineRequest:
        if isinstance(req, PrefillRequest):  # the prompt and one token, the blocks held for the decode worker
            one = msgspec.structs.replace(req.sampling, max_tokens=1, min_tokens=min(req.sampling.min_tokens, 1))
            return EngineRequest(req.request_id, req.token_ids, one, req.lora, kv_export=True)
        return EngineRequest(req.request_id, req.token_ids, req.sampling, req.lora,
                             kv_handle=req.kv_handle if isinstance(req, DecodeRequest) else None,
                             carried_tokens=req.first_seq)

    def _hand_off(self, req: PrefillRequest, first: list[int], handle: dict[str, Any] | None,
                  started_at: float, logprobs: list[TokenLogprob] | None = None,
                  prompt_logprobs: list[TokenLogprob | None] | None = None) -> None:
        """Publish the first token and push the decode task, in one pipelined call."""
        # The prompt's logprobs are published here: the decode worker reads the prompt's KV, it does not compute it.
        decode = DecodeRequest(
            request_id=req.request_id, model=req.model, token_ids=[*req.token_ids, *first],
            sampling=msgspec.structs.replace(req.sampling, prompt_logprobs=None),
            reply_channel=req.reply_channel, deadline=req.deadline, lora=req.lora, kv_handle=handle or {},
            prefill_worker_id=self.identity.worker_id, carried_tokens=len(first), frontend_id=req.frontend_id)
        self._send(req, TokenDelta(req.request_id, 0, first, worker_id=self.identity.worker_id, started_at=started_at,
                                   logprobs=logprobs, prompt_logprobs=prompt_logprobs))
        self.publisher.push(req.decode.queue, task_message(
            GENERATE_TASK, [request_to_builtins(decode)], req.decode.queue, task_id=req.request_id,
            argsrepr=f"request {req.request_id}: decode after prefill on {self.identity.worker_id}"))

    def _release_remote(self, req: TaskRequest) -> None:
        """Tell the prefill worker its held blocks for ``req`` may go (a no-op without one). Each way
        out of :meth:`_serve` calls it once: before any output, or at the first one."""
        if isinstance(req, DecodeRequest):
            self._release_on(req.prefill_worker_id, req.request_id)

    def _release_on(self, prefill_worker_id: str, request_id: str) -> None:
        """``kv_release`` to a prefill worker: the blocks it holds for ``request_id`` may go."""
        self.publisher.publish(self.keys.control_channel(prefill_worker_id),
                               encode_control(ControlCommand("kv_release", request_id)))

    def _send(self, req: TaskRequest, delta: TokenDelta) -> None:
        self.publisher.publish(req.reply_channel, encode_delta(delta))
