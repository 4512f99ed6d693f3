"""The engine host: one engine per worker process, on its own event loop thread.

Celery task threads hand requests over with :meth:`EngineHost.serve` and block until the
request has finished, so Celery's view (active tasks, prefetch, Flower) matches the engine's.
The loop thread owns everything asynchronous: the engine, the Redis client, the delta
publisher, the heartbeat (lease + load), the control-channel listener (cancel, clear KV) and the
KV relay that keeps the Redis prefix index equal to the engine's prefix cache (workers.kv_relay).
The host also owns the worker's Prometheus metrics and their ``/metrics`` endpoint (workers.metrics),
whose URL it registers.

An engine whose ``publishes_kv_events`` is False (``workers.engines.base.Engine``) registers with
``kv_events=False``: routers then guess its cache from their own decisions (approximate mode), and
the host only purges those guesses (on ``clear_kv`` and at shutdown).

Invariant: every request handed to :meth:`serve` ends with exactly one last delta on its reply
channel (``finish_reason`` or ``error``), whatever happens to the engine.

Disaggregation (docs/disaggregation.md): a request with ``decode`` set is a prefill for that
decode worker. The engine computes the prompt and one token and holds the prompt's blocks; the
host publishes that token (``seq`` 0) and, in the same pipelined call, pushes the ``generate``
task onto the decode worker's queue with the engine's transfer handle, the prompt plus that token
(``carried_tokens`` 1) and the original sampling. The decode worker's deltas start at ``seq`` 1;
once its engine has read the KV (its first output) or the request has ended, it tells the prefill
worker (``kv_release``), which frees the held blocks. A prefill that ends the request (a stop token,
``max_tokens`` 1, an abort, an error) publishes the last delta itself and frees its blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import msgspec

from core.errors import SluiceError
from core.keys import Keys
from core.logs import request_id_var
from core.loops import BackgroundLoop, Backoff
from core.messages import (
    ControlCommand,
    ErrorInfo,
    GenerateRequest,
    LoraAck,
    TokenDelta,
    TokenLogprob,
    decode_control,
    encode_control,
    encode_delta,
    request_from_builtins,
    request_to_builtins,
)
from core.redis_topology import RedisPlanes, RedisTopology
from core.settings import Settings
from core.wire import GENERATE_TASK, task_message
from router.registry import Registry, WorkerIdentity, WorkerLoad, WorkerRecord
from workers.engines.base import Engine, EngineKvEvent, EngineRequest, StepStats
from workers.kv_relay import KvRelay
from workers.metrics import MetricsEndpoint, TokenRate, WorkerMetrics
from workers.publisher import DeltaPublisher
from workers.timing_model import TimingFit

log = logging.getLogger(__name__)

#: How many cancels for requests not (yet) running a worker remembers.
_EARLY_CANCELS_MAX = 4096


@dataclass
class EngineHost:
    settings: Settings
    engine: Engine
    identity: WorkerIdentity
    keys: Keys = field(init=False)
    record: WorkerRecord | None = field(default=None, init=False)
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics, init=False)

    def __post_init__(self) -> None:
        self.keys = RedisTopology.from_settings(self.settings.redis).keys
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-loop", daemon=True)
        self._running: dict[str, asyncio.Task[None]] = {}
        #: The frontend of each running request (those that name one), and since when (monotonic)
        #: each frontend's lease has been seen missing.
        self._frontend_of: dict[str, str] = {}
        self._frontend_missing: dict[str, float] = {}
        #: Requests aborted at the drain deadline: they end with ``worker_draining`` (the frontend
        #: moves them), not as finished.
        self._evicted: set[str] = set()
        self._early_cancels: OrderedDict[str, None] = OrderedDict()
        self._background: list[asyncio.Task[None]] = []
        self._stopping = False
        self._draining = False
        self._control: BackgroundLoop | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._token_rate = TokenRate()
        #: The worker's own step-time model, fitted from its steps and published with its load.
        self.timing = TimingFit()

    # ---- lifecycle (called from the Celery main thread) -------------------------------------
    def serve_metrics(self) -> str:
        """Start the worker's ``/metrics`` endpoint (unless the settings turn it off); returns its URL,
        registered at go-live ("" without one). Raises OSError when its address cannot be bound."""
        self._metrics_endpoint = MetricsEndpoint.start(self.metrics.registry, self.settings.worker)
        return self.metrics_url

    @property
    def metrics_url(self) -> str:
        return self._metrics_endpoint.url if self._metrics_endpoint is not None else ""

    def start(self) -> None:
        """Start the loop thread and the engine; raises EngineStartError if the engine cannot start."""
        self._thread.start()
        self._call(self._start())

    def go_live(self) -> None:
        """Register under a lease and start heartbeating: from now on routers may pick this worker."""
        self._call(self._go_live())

    def drain(self) -> None:
        """Stop taking requests (called in Celery's signal handler: schedules, does not wait)."""
        asyncio.run_coroutine_threadsafe(self._drain(), self._loop)

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(Exception):
            self._call(self._stop(), timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()

    def serve(self, payload: dict) -> None:
        """Run one request to its end (called from a Celery task thread; blocks)."""
        request = request_from_builtins(payload)
        self._call(self._serve(request), timeout=None)

    def _call(self, coro, timeout: float | None = 600):  # type: ignore[no-untyped-def]
        fut: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    # ---- on the loop ------------------------------------------------------------------------
    async def _start(self) -> None:
        # The broker's Redis carries token deltas, control commands and frontend leases; the registry and
        # the prefix index go to the routing state's Redis (the same one unless they are apart).
        self.planes = RedisPlanes.open(RedisTopology.from_settings(self.settings.redis), "background")
        self.redis = self.planes.broker
        self.publisher = DeltaPublisher(self.redis, self.keys)
        self.publisher.start()
        self.registry = Registry(self.planes.index, self.keys)
        self.kv = KvRelay(self.planes.index, self.keys, self.identity.worker_id, self.identity.model, self.metrics)
        self.engine.on_step = self._on_step
        await self.engine.start(self._on_kv_events)

    def _on_step(self, step: StepStats) -> None:
        self.metrics.observe_step(step)
        self.timing.observe(step)

    def _on_kv_events(self, events: Sequence[EngineKvEvent]) -> None:
        if self.kv_events:
            self.kv.push(events)

    @property
    def kv_events(self) -> bool:
        """Whether the engine reports its cache (False: the routers' approximate mode)."""
        return self.engine.publishes_kv_events

    async def _publish_kv_state(self, slot: int) -> None:
        """Make the index hold the engine's whole cache at ``slot`` (go-live, re-registration)."""
        if self.kv_events:
            await self.kv.start(slot, self.engine.cached_block_hashes)

    def _make_record(self) -> WorkerRecord:
        info = self.engine.info
        return WorkerRecord(
            **asdict(self.identity), engine=info.engine, block_size=info.block_size, kv_blocks=info.kv_blocks,
            max_num_seqs=info.max_num_seqs, context_length=info.context_length, started_at=time.time(),
            max_batched_tokens=info.max_batched_tokens,
            kv_events=self.kv_events, metrics_url=self.metrics_url,
            features=",".join(sorted(info.features)),
        )

    def _load(self) -> WorkerLoad:
        """The load record a heartbeat publishes (the worker's gauges are set from it too)."""
        load = replace(self.engine.load(), updated_at=time.time(), draining=self._draining,
                       kv_resyncs=self.metrics.kv_index_resyncs_total(),
                       tokens_per_s=self._token_rate.sample(self.metrics.generated_tokens_total(), time.monotonic()),
                       loras=",".join(self.engine.loras()), cached_blocks=self.engine.cached_block_count())
        self.timing.set_usage(load.kv_usage)
        model = self.timing.model()
        if model is not None:
            load = replace(load, timing=model.encode())
        self.metrics.observe_load(load)
        return load

    async def _drain(self) -> None:
        """Say ``draining`` in the load record now, not at the next heartbeat; at the drain deadline,
        hand what still runs back to the frontends."""
        if self._draining:
            return
        self._draining = True
        timeout = self.settings.worker.drain_timeout_s
        log.info("worker %s draining: %d running request(s) have %.0f s to finish; taking no new one",
                 self.identity.worker_id, len(self._running), timeout)
        asyncio.get_running_loop().call_later(timeout, lambda: asyncio.ensure_future(self._evict_running()))
        if self.record is not None:
            with contextlib.suppress(Exception):
                await self.registry.heartbeat(self.record, self._load(), self.settings.worker.lease_ttl_s)

    async def _evict_running(self) -> None:
        """The drain deadline: every request still running ends with ``worker_draining`` (after the
        tokens it has), and its frontend continues it on another worker."""
        if self._running:
            log.warning("worker %s drain deadline: moving %d running request(s) to other workers",
                        self.identity.worker_id, len(self._running))
        for request_id in list(self._running):
            self._evicted.add(request_id)
            await self.engine.abort(request_id)

    async def _go_live(self) -> None:
        self.record = await self.registry.register(self._make_record(), self._load(), self.settings.worker.lease_ttl_s)
        await self._publish_kv_state(self.record.slot)
        self._control = BackgroundLoop("control-channel", self._control_session, backoff=Backoff(first_s=0.2, max_s=1.0))
        self._control.start()
        self._control.wake()
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self._heartbeat(), name="heartbeat")]
        log.info("worker %s live on queues %s, %s (slot %d)", self.identity.worker_id,
                 self.identity.queue, self.identity.pool_queue, self.record.slot)

    async def _heartbeat(self) -> None:
        interval = self.settings.worker.heartbeat_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                assert self.record is not None
                fresh = await self.registry.heartbeat(self.record, self._load(), self.settings.worker.lease_ttl_s)
                if fresh is not None:  # re-registered (Redis lost our lease): the index must be rebuilt
                    self.record = fresh
                    await self._drop_running("this worker's lease lapsed: its frontends moved or ended its requests")
                    await self._publish_kv_state(fresh.slot)
                await self._drop_orphans()
            except Exception:  # noqa: BLE001 - keep heartbeating through Redis hiccups
                log.exception("heartbeat failed")

    async def _drop_running(self, why: str) -> None:
        """Abort every running request: nobody waits for them any more (a frontend takes a worker
        whose lease lapsed for lost, and moves or ends its requests)."""
        if self._running:
            log.warning("worker %s dropping %d running request(s): %s", self.identity.worker_id,
                        len(self._running), why)
        for request_id in list(self._running):
            await self.engine.abort(request_id)

    async def _drop_orphans(self) -> None:
        """Abort the requests of frontends whose lease has been missing for ``frontend_grace_s``
        (the frontend died: nobody reads their tokens). One pipelined call for all of them."""
        frontends = sorted(set(self._frontend_of.values()))
        if not frontends:
            self._frontend_missing.clear()
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for frontend_id in frontends:
                pipe.exists(self.keys.frontend_lease(frontend_id))
            present = await pipe.execute()
        now, grace = time.monotonic(), self.settings.worker.frontend_grace_s
        missing = {f: self._frontend_missing.get(f, now) for f, there in zip(frontends, present, strict=True)
                   if not there}
        self._frontend_missing = missing
        gone = {f for f, since in missing.items() if now - since >= grace}
        if not gone:
            return
        orphans = [r for r, f in self._frontend_of.items() if f in gone]
        log.warning("worker %s dropping %d request(s) of gone frontend(s) %s", self.identity.worker_id,
                    len(orphans), ", ".join(sorted(gone)))
        for request_id in orphans:
            await self.engine.abort(request_id)

    async def _control_session(self) -> None:
        """One connection's life on the control channels: subscribe, then act on commands until the
        connection fails. The BackgroundLoop running it pauses (growing while Redis stays away)
        before the next session, so a dead connection cannot spin the engine's event loop."""
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.keys.control_channel(self.identity.worker_id), self.keys.control_broadcast)
            self._control.reset_backoff()
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None and message["type"] == "message":
                    await self._on_control(decode_control(message["data"]))
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def _on_control(self, cmd: ControlCommand) -> None:
        if cmd.op == "cancel" and cmd.request_id:
            if cmd.request_id in self._running:
                await self.engine.abort(cmd.request_id)
            else:
                self._early_cancels[cmd.request_id] = None
                while len(self._early_cancels) > _EARLY_CANCELS_MAX:
                    self._early_cancels.popitem(last=False)
        elif cmd.op == "drain":
            await self._drain()
        elif cmd.op == "kv_release" and cmd.request_id:
            await self.engine.release_transfer(cmd.request_id)
        elif cmd.op == "clear_kv":
            try:
                await self.engine.clear_kv_cache()  # reports AllBlocksCleared: the relay clears the index
            except SluiceError as exc:  # the engine failed; the control channel stays up
                log.error("clearing the KV cache failed: %s", exc.message)
            if not self.kv_events:
                await self.kv.index.purge(self.identity.worker_id, self.identity.model)  # the routers' guesses
        elif cmd.op in ("load_lora", "unload_lora") and cmd.lora_name:
            await self._lora(cmd)

    async def _lora(self, cmd: ControlCommand) -> None:
        """Load or drop an adapter, publish the new list in the load record at once (routers then
        send the adapter's requests here), and answer on the command's reply list."""
        name = cmd.lora_name or ""
        try:
            if cmd.op == "load_lora":
                await self.engine.load_lora(name, cmd.lora_path or "")
            else:
                await self.engine.unload_lora(name)
            ack = LoraAck(self.identity.worker_id, ok=True)
            log.info("LoRA adapter %s %s", name, "loaded" if cmd.op == "load_lora" else "unloaded")
        except SluiceError as exc:
            ack = LoraAck(self.identity.worker_id, ok=False, error=exc.message, code=exc.code or "")
        except Exception as exc:  # noqa: BLE001 - the engine's fault, reported to the caller
            log.exception("LoRA adapter %s: %s failed", name, cmd.op)
            ack = LoraAck(self.identity.worker_id, ok=False, error=f"{type(exc).__name__}: {exc}")
        if ack.ok and self.record is not None:
            with contextlib.suppress(Exception):
                await self.registry.heartbeat(self.record, self._load(), self.settings.worker.lease_ttl_s)
        if cmd.reply_key:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.rpush(cmd.reply_key, msgspec.json.encode(ack))
                pipe.expire(cmd.reply_key, 300)
                await pipe.execute()

    async def _serve(self, req: GenerateRequest) -> None:
        """Run one request; its log lines carry its id (on the wire: the frontend's request id, with
        ``-r<n>`` after a migration or ``:prefill`` for a remote prefill)."""
        request_id_var.set(req.request_id)  # this task's own context
        t0 = time.monotonic()
        log.info("request %s taken: %d prompt tokens, max_tokens %d", req.request_id,
                 len(req.token_ids) - req.carried_tokens, req.sampling.max_tokens)
        try:
            await self._run(req)
        finally:
            log.info("request %s ended after %.3f s", req.request_id, time.monotonic() - t0)

    async def _run(self, req: GenerateRequest) -> None:
        started_at = time.time()
        seq = req.carried_tokens  # a decode after a remote prefill continues the prefill's seq 0
        wid = self.identity.worker_id
        if req.request_id in self._early_cancels:
            self._early_cancels.pop(req.request_id, None)
            self._release_remote(req)
            self._send(req, TokenDelta(req.request_id, seq, finish_reason="abort", worker_id=wid))
            return
        if self._draining:  # the frontend moves it to another worker
            self._release_remote(req)
            self._send(req, TokenDelta(req.request_id, seq, worker_id=wid, error=ErrorInfo(
                "worker_draining", f"worker {wid} is shutting down and takes no new request")))
            return
        if started_at > req.deadline:
            self._release_remote(req)
            self._send(req, TokenDelta(req.request_id, seq, worker_id=wid,
                                       error=ErrorInfo("timeout", "request deadline passed before a worker took it")))
            return
        self._running[req.request_id] = asyncio.current_task()  # type: ignore[assignment]
        if req.frontend_id:
            self._frontend_of[req.request_id] = req.frontend_id
        # Taken: the frontend learns which worker runs it (pool mode) and that its queue wait is over.
        self._send(req, TokenDelta(req.request_id, seq, worker_id=wid, started_at=started_at))
        deadline_timer = asyncio.get_running_loop().call_later(
            max(0.0, req.deadline - started_at), lambda: asyncio.ensure_future(self.engine.abort(req.request_id)))
        prefill = req.decode is not None
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
                if first and req.kv_handle is not None:
                    self._release_remote(req)  # the engine has read the KV: the prefill worker may free it
                if prefill and out.finish_reason == "length" and req.sampling.max_tokens > 1:
                    self._hand_off(req, out.token_ids, out.kv_handle, started_at, out.logprobs, out.prompt_logprobs)
                    return
                if out.finish_reason == "abort" and req.request_id in self._evicted:
                    if out.token_ids:
                        self._send(req, TokenDelta(req.request_id, seq, out.token_ids, worker_id=wid if first else None))
                        seq += 1
                    if prefill and out.kv_handle is not None:
                        await self.engine.release_transfer(req.request_id)
                    self._send(req, TokenDelta(req.request_id, seq, worker_id=wid, error=ErrorInfo(
                        "worker_draining", f"worker {wid} is shutting down; the request continues elsewhere")))
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
            self._running.pop(req.request_id, None)
            self._frontend_of.pop(req.request_id, None)
            self._evicted.discard(req.request_id)
            if first:
                self._release_remote(req)

    def _engine_request(self, req: GenerateRequest) -> EngineRequest:
        if req.decode is not None:  # the prompt and one token, the blocks held for the decode worker
            one = msgspec.structs.replace(req.sampling, max_tokens=1, min_tokens=min(req.sampling.min_tokens, 1))
            return EngineRequest(req.request_id, req.token_ids, one, req.lora, kv_export=True)
        return EngineRequest(req.request_id, req.token_ids, req.sampling, req.lora, kv_handle=req.kv_handle,
                             carried_tokens=req.carried_tokens)

    def _hand_off(self, req: GenerateRequest, first: list[int], handle: dict[str, Any] | None,
                  started_at: float, logprobs: list[TokenLogprob] | None = None,
                  prompt_logprobs: list[TokenLogprob | None] | None = None) -> None:
        """Publish the first token and push the decode task, in one pipelined call."""
        assert req.decode is not None
        # The prompt's logprobs are published here: the decode worker reads the prompt's KV, it does not compute it.
        decode = GenerateRequest(
            request_id=req.request_id, model=req.model, token_ids=[*req.token_ids, *first],
            sampling=msgspec.structs.replace(req.sampling, prompt_logprobs=None),
            reply_channel=req.reply_channel, deadline=req.deadline, lora=req.lora, kv_handle=handle or {},
            prefill_worker_id=self.identity.worker_id, carried_tokens=len(first), frontend_id=req.frontend_id)
        self._send(req, TokenDelta(req.request_id, 0, first, worker_id=self.identity.worker_id, started_at=started_at,
                                   logprobs=logprobs, prompt_logprobs=prompt_logprobs))
        self.publisher.push(req.decode.queue, task_message(
            GENERATE_TASK, [request_to_builtins(decode)], req.decode.queue, task_id=req.request_id,
            argsrepr=f"request {req.request_id}: decode after prefill on {self.identity.worker_id}"))

    def _release_remote(self, req: GenerateRequest) -> None:
        """Tell the prefill worker its held blocks for ``req`` may go (a no-op without one). Each way
        out of :meth:`_serve` calls it once: before any output, or at the first one."""
        if req.prefill_worker_id is None or req.kv_handle is None:
            return
        self.publisher.publish(self.keys.control_channel(req.prefill_worker_id),
                               encode_control(ControlCommand("kv_release", req.request_id)))

    def _send(self, req: GenerateRequest, delta: TokenDelta) -> None:
        self.publisher.publish(req.reply_channel, encode_delta(delta))

    async def _stop(self) -> None:
        for task in self._background:
            task.cancel()
        if self._control is not None:
            await self._control.stop()
        for request_id in list(self._running):
            with contextlib.suppress(Exception):
                await self.engine.abort(request_id)
        with contextlib.suppress(Exception):
            await self.engine.shutdown()
        with contextlib.suppress(Exception):
            await self.kv.close()
        with contextlib.suppress(Exception):
            await self.registry.deregister(self.identity.worker_id)
        await self.publisher.close()
        with contextlib.suppress(Exception):
            await self.planes.aclose()
