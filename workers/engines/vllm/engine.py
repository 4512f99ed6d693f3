"""The vLLM engine: vLLM's ``AsyncLLM`` behind Sluice's engine interface (workers/engines/base.py).

Usage (what ``workers.engines.factory`` does for ``SLUICE_ENGINE=vllm``)::

    engine = VllmEngine("smollm2", settings.resolved_model_path(), settings.worker.vllm)
    await engine.start(kv_sink)            # on the worker's engine loop; loads the model

One engine per worker process. vLLM runs its engine core in a child process (spawned: entry
points need a ``__main__`` guard) and talks to it over ZMQ; this adapter lives on the worker's
engine loop. Prefix caching is always on and the block size is the engine's own (on CPU a
multiple of 32, 32 unless configured), registered with the router through ``info``.

How the contract is met:

* Prompts go in as token ids, outputs come back as deltas (``RequestOutputKind.DELTA``) without
  detokenization: the frontend owns the tokenizer.
* ``abort``, and closing a request's iterator early, return after vLLM's engine core has processed
  the abort: it is followed by a utility call (``is_sleeping``, which changes nothing), which the
  core handles in order after the abort, so the request's blocks are free
  (tests/third_party/test_vllm.py checks that this still holds).
* Request ids: vLLM accepts two live requests with one id (and would abort both at once), so a
  duplicate is refused here, before vLLM sees it.
* ``clear_kv_cache`` is vLLM's ``reset_prefix_cache(reset_running_requests=True)``: running
  requests are preempted (they recompute their KV, their outputs unchanged) so that the reset
  always succeeds.
* ``shutdown`` aborts every live request and waits (briefly) until vLLM holds none unfinished, so
  that one whose submission was under way is aborted too, before its engine core stops. On a CPU,
  vLLM's processes then get ``_CPU_ENGINE_EXIT_S`` to exit before vLLM kills them.
* KV events: vLLM publishes them over ZMQ to a loopback socket bound here
  (:mod:`workers.engines.vllm.kv_subscriber`); :mod:`workers.engines.vllm.kv_events` turns them
  into Sluice block hashes, handed to the sink from the engine loop. Lost or unreadable batches
  make the translator forget what it knew and the sink get a ``KvTrackLost`` (the host rebuilds
  the index).
* ``load()`` is counted here, synchronously: requests without output yet are waiting, the
  others running; active blocks are each live request's ``ceil(tokens / block_size)`` (shared
  prefix blocks counted once per request: an upper bound).
* ``start`` blocks the engine loop while vLLM loads (about a minute on CPU): vLLM's async client
  must be created on the loop that will drive it, and nothing else runs there before start. It
  then serves one request of its own (:func:`_warm_logprobs`), whose steps nobody sees.
* Engine death: when vLLM's engine core process dies, vLLM fails every live stream with
  ``EngineDeadError``; each becomes an :class:`core.errors.UpstreamError` (so the client gets an
  error event), and a watchdog calls ``on_dead`` once with the reason. The worker's ``on_dead``
  (``workers.engines.factory``) asks the worker to shut down, which deregisters it: a worker with a
  dead engine must not stay routable.
* Prompts the engine cannot take (empty, longer than the context) and LoRA adapters (it serves
  none) raise :class:`core.errors.InvalidRequest` / :class:`core.errors.ContextLengthExceeded`
  before vLLM sees them, with the limit in the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from vllm import SamplingParams as VllmSamplingParams
from vllm.config import KVEventsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import tokens_input
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from core.errors import ContextLengthExceeded, InvalidRequest, UpstreamError
from core.messages import LORA, STRUCTURED_OUTPUTS, FinishReason, SamplingParams, StructuredOutput, TokenLogprob, Usage
from core.settings import KvbmSettings, VllmSettings, get_settings
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
from workers.engines.die_with_worker import children_die_with_this_thread
from workers.engines.vllm.ipc_dir import IpcDir
from workers.engines.vllm.kv_events import KvEventFeed, KvEventTranslator
from workers.engines.vllm.kv_subscriber import KvEventSubscriber
from workers.engines.vllm.kv_transfer import (
    KvbmSetup,
    KvTransferSetup,
    configure_environment,
    connector_config,
    export_params,
    import_params,
)
from workers.engines.vllm.kvbm_connector import TierClient
from workers.engines.vllm.stats import EngineCounters, recorder_factory
from workers.kvbm.stats import TierStats
from workers.kvbm.tiers import TierReport

log = logging.getLogger(__name__)

#: How often the worker asks vLLM's worker process what its KV tiers hold and did (metrics, load record).
TIER_REPORT_INTERVAL_S = 1.0

ENGINE_NAME = "vllm"
CPU_DEFAULT_BLOCK_SIZE = 32
_GIB = 1 << 30
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
#: How often the watchdog looks at vLLM's engine-core liveness flag.
_WATCHDOG_INTERVAL_S = 0.5
#: How long ``shutdown`` waits for vLLM to finish the requests it aborted.
_SHUTDOWN_DRAIN_S = 5.0
#: On a CPU, how long vLLM's engine processes get to exit once ``shutdown`` has stopped them, after
#: which vLLM kills them (its default, kept on GPUs where a device's teardown may need it: 5 s).
#: Nothing they do by then matters: the engine core waits for its model worker, which spends seconds
#: in its interpreter's teardown (vLLM unfreezes that heap first), and an idle worker's exit waited
#: those 5 s, the whole of the patience honcho gives a process after Ctrl-C.
_CPU_ENGINE_EXIT_S = 2.0
#: The start-up request of :func:`_warm_logprobs`: two tokens (any ids of the vocabulary), shorter
#: than a KV block, so that nothing enters the prefix cache and no KV event reaches the router.
_WARMUP_PROMPT = (1, 16)
_WARMUP_REQUEST_ID = "sluice-warmup"

#: Called once, from the engine loop, when the engine has died; the argument says why.
OnDead = Callable[[str], None]

_FINISH_REASONS: dict[str | None, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "repetition": "stop",
    "error": "error",
}


def to_vllm_sampling(params: SamplingParams) -> VllmSamplingParams:
    """Sluice sampling -> vLLM sampling: one sequence, token deltas, no detokenization."""
    return VllmSamplingParams(
        n=1,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        top_k=params.top_k if params.top_k > 0 else -1,
        min_p=params.min_p,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        logit_bias=dict(params.logit_bias) or None,
        logprobs=params.logprobs,
        prompt_logprobs=params.prompt_logprobs,
        structured_outputs=structured_outputs(params.structured),
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
        skip_special_tokens=False,
    )


def _warm_structured_outputs() -> None:
    try:
        import xgrammar

        xgrammar.Grammar.from_json_schema('{"type": "object", "properties": {"a": {"type": "string"}}}')
    except Exception as exc:  # noqa: BLE001 - a constraint then fails on its own request, with its reason
        log.warning("structured outputs could not be prepared: %s", exc)


async def _warm_logprobs(llm: AsyncLLM) -> None:
    """Have vLLM compile its logprobs kernel now rather than on the first request that asks for logprobs.

    vLLM ranks a token among the vocabulary with a ``torch.compile``d function
    (``vllm.v1.sample.ops.logprobs.batched_count_greater_than``, in its engine core process) that is
    compiled on first use: the first ``logprobs`` or ``prompt_logprobs`` request waited 14 to 25 s on a
    CPU (2 s once inductor's on-disk cache holds the kernel), every later one nothing. Its own start-up
    warm-up samples without logprobs. One token with both kinds of logprobs compiles it here; a failure
    is logged (the first logprobs request then compiles it, as before), not raised."""
    sampling = VllmSamplingParams(n=1, max_tokens=1, logprobs=1, prompt_logprobs=1, detokenize=False,
                                  output_kind=RequestOutputKind.FINAL_ONLY)
    try:
        async for _ in llm.generate(tokens_input(list(_WARMUP_PROMPT)), sampling, _WARMUP_REQUEST_ID):
            pass
    except Exception as exc:  # noqa: BLE001 - the warm-up is an optimisation; serving does not depend on it
        log.warning("vLLM's logprobs kernel could not be compiled at start: %s", exc)


def structured_outputs(constraint: StructuredOutput | None) -> StructuredOutputsParams | None:
    """Sluice's constraint as vLLM's structured-output parameters (its backend: xgrammar, or
    guidance where xgrammar cannot)."""
    if constraint is None:
        return None
    return StructuredOutputsParams(json=constraint.json, json_object=constraint.json_object or None,
                                   regex=constraint.regex, grammar=constraint.grammar,
                                   choice=list(constraint.choice) if constraint.choice else None)


def token_logprobs(tokens: list[int], sample_logprobs: Any, top: int | None) -> list[TokenLogprob] | None:
    """vLLM's per-token logprob dicts (token id -> Logprob with ``rank``) of the new ``tokens`` as
    Sluice's: each token's own, and the ``top`` most likely (rank 1..top), most likely first."""
    if top is None or not sample_logprobs:
        return None
    out = []
    for token, ranked in zip(tokens, list(sample_logprobs)[-len(tokens):], strict=False):
        best = sorted(((lp.rank, tid, lp.logprob) for tid, lp in ranked.items() if lp.rank is not None and lp.rank <= top))
        out.append(TokenLogprob(ranked[token].logprob, [(tid, lp) for _, tid, lp in best]))
    return out


def prompt_token_logprobs(prompt: list[int], ranked_per_token: Any, top: int | None) -> list[TokenLogprob | None] | None:
    """vLLM's prompt logprobs (None for the first token, then a dict per token) as Sluice's."""
    if top is None or ranked_per_token is None:
        return None
    out: list[TokenLogprob | None] = []
    for token, ranked in zip(prompt, list(ranked_per_token), strict=False):
        if not ranked or token not in ranked:
            out.append(None)
            continue
        best = sorted(((lp.rank, tid, lp.logprob) for tid, lp in ranked.items() if lp.rank is not None and lp.rank <= top))
        out.append(TokenLogprob(ranked[token].logprob, [(tid, lp) for _, tid, lp in best]))
    return out


async def _core_caught_up(llm: AsyncLLM) -> None:
    """Return once vLLM's engine core has handled every message this client sent before the call.

    The core handles its input messages in order and ``is_sleeping`` (which changes nothing) is a
    utility call answered by the core: once it answers, an abort sent earlier has been applied and
    the request's blocks are free. vLLM documents no such barrier; tests/third_party/test_vllm.py
    checks that this one still holds.
    """
    await llm.is_sleeping()


def _check_model_dir(model_path: Path) -> None:
    if not (model_path / "config.json").is_file():
        raise EngineStartError(f"no model at {model_path} (no config.json); prepare it first")
    if not any(any(model_path.glob(pattern)) for pattern in _WEIGHT_PATTERNS):
        raise EngineStartError(
            f"{model_path} holds no weights (a tokenizer-only directory?); prepare the model with weights, "
            "e.g. workers.models.prepare_model(name, models_dir, weights=True)"
        )


def _configure_cpu_threads(settings: VllmSettings) -> None:
    """vLLM's CPU worker takes its OpenMP setup from the environment of the process it spawns.

    With ``omp_threads`` unset, vLLM binds one thread per physical core and keeps one core for
    its scheduler; with it set, threads are not pinned and ``OMP_NUM_THREADS`` decides.
    """
    if settings.omp_threads:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        os.environ["OMP_NUM_THREADS"] = str(settings.omp_threads)


def engine_args(model_path: Path, settings: VllmSettings, kv_endpoint: str,
                transfer: KvTransferSetup | None = None, kvbm: KvbmSetup | None = None) -> AsyncEngineArgs:
    on_cpu = current_platform.is_cpu()
    dtype = settings.dtype
    if dtype == "auto" and on_cpu:
        dtype = "float32"  # no native bf16 on most CPUs: float32 is the fast path
    return AsyncEngineArgs(
        model=str(model_path),
        dtype=dtype,
        block_size=settings.block_size or (CPU_DEFAULT_BLOCK_SIZE if on_cpu else None),
        enable_prefix_caching=True,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        enforce_eager=on_cpu if settings.enforce_eager is None else settings.enforce_eager,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        kv_cache_memory_bytes=int(settings.kv_cache_gib * _GIB) if on_cpu else None,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=kv_endpoint, topic="kv"),
        kv_transfer_config=connector_config(transfer, kvbm, on_cpu),
        # Scheduler statistics go to Sluice's recorder alone (workers.engines.vllm.stats), which turns
        # them on; vLLM's own periodic log lines stay off, and iteration details give each step's time.
        disable_log_stats=True,
        enable_logging_iteration_details=True,
        enable_log_requests=False,
        # LoRA adapters loaded at run time (load_lora); off unless asked for: it costs memory and time.
        enable_lora=settings.max_loras > 0,
        max_loras=max(settings.max_loras, 1),
        max_lora_rank=settings.max_lora_rank,
    )


@dataclass(slots=True)
class _Live:
    """A request between its first ``generate`` step and its last output."""

    prompt_tokens: int
    generated: int = 0
    #: A decode's prompt tokens held in the prefix cache when it was submitted.
    local_hit: int = 0
    started: bool = False
    aborted: bool = False


class VllmEngine(Engine):
    def __init__(self, model: str, model_path: Path, settings: VllmSettings, on_dead: OnDead | None = None,
                 transfer: KvTransferSetup | None = None, kvbm: KvbmSettings | None = None) -> None:
        self.model = model
        #: With a transfer setup the engine runs vLLM's NixlConnector: it serves the prefill and
        #: decode pools (workers/engines/vllm/kv_transfer.py).
        self.transfer = transfer
        #: With KV tiers on, Sluice's connector offloads to them and onboards from them
        #: (workers/engines/vllm/kvbm_connector.py); ``_tiers`` asks them from this process.
        self.kvbm = KvbmSetup.new(kvbm, model) if kvbm is not None and kvbm.enabled else None
        self._tiers = TierClient(self.kvbm.address, self.kvbm.key) if self.kvbm is not None else None
        self._tier_report: TierReport | None = None
        self._ipc: IpcDir | None = None
        self._tier_poll: asyncio.Task[None] | None = None
        #: vLLM's own counters (KV usage, prompt-token sources), recorded every step.
        self.counters = EngineCounters()
        #: Exported prefills whose blocks vLLM may still hold for a read: until the decode worker's
        #: ``release_transfer`` or the lease's end.
        self._held: dict[str, asyncio.TimerHandle] = {}
        self._on_dead = on_dead
        self.model_path = Path(model_path)
        self.settings = settings
        self._llm: AsyncLLM | None = None
        self._live: dict[str, _Live] = {}
        #: LoRA adapters loaded, by name, and the last id given to one.
        self._loras: dict[str, LoRARequest] = {}
        self._lora_ids = 0
        self._sink: KvEventSink = discard_kv_events
        self._subscriber: KvEventSubscriber | None = None
        self._translator: KvEventTranslator | None = None
        self._kv_task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._dead_reported = False
        self._stopping = False
        #: While the start-up warm-up runs: its steps (one of them slowed by a compilation) are not
        #: reported to ``on_step``, whose timing model would take them for serving steps.
        self._warming = False

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self, kv_sink: KvEventSink = discard_kv_events) -> None:
        _check_model_dir(self.model_path)
        _configure_cpu_threads(self.settings)
        self._sink = kv_sink
        if self.transfer is not None:
            configure_environment(self.transfer, current_platform.is_cpu())
        self._subscriber = KvEventSubscriber()
        # vLLM's sockets to its engine core go in a directory of this engine's, removed with it.
        self._ipc = IpcDir.create(get_settings().cache_dir / "vllm-ipc")
        os.environ["VLLM_RPC_BASE_PATH"] = str(self._ipc.path)
        try:
            # The engine core is a child process: it ends with this thread, killed or not.
            with children_die_with_this_thread(get_settings().cache_dir):
                self._llm = AsyncLLM.from_engine_args(
                    engine_args(self.model_path, self.settings, self._subscriber.endpoint, self.transfer,
                                self.kvbm),
                    stat_loggers=[recorder_factory(self.counters, self._report_step)],
                )
        except Exception as exc:
            self._subscriber.close()
            self._ipc.remove()
            raise EngineStartError(f"vLLM could not load {self.model_path}: {type(exc).__name__}: {exc}") from exc
        config = self._llm.vllm_config
        self.info = EngineInfo(
            model=self.model,
            engine=ENGINE_NAME,
            block_size=config.cache_config.block_size,
            kv_blocks=config.cache_config.num_gpu_blocks or 0,
            max_num_seqs=config.scheduler_config.max_num_seqs,
            max_batched_tokens=config.scheduler_config.max_num_batched_tokens,
            context_length=config.model_config.max_model_len,
            vocab_size=config.model_config.get_vocab_size(),
            features=frozenset({STRUCTURED_OUTPUTS, LORA} if self.settings.max_loras > 0 else {STRUCTURED_OUTPUTS}),
        )
        self._translator = KvEventTranslator(self.model, self.info.block_size)
        # vLLM checks a request's output constraint in this process, compiling it with xgrammar: the
        # first one loads xgrammar, seconds that would otherwise stall the worker's loop mid-serving.
        await asyncio.to_thread(_warm_structured_outputs)
        self._warming = True
        try:
            await _warm_logprobs(self._llm)
        finally:
            self._warming = False
        loop = asyncio.get_running_loop()
        self._kv_task = loop.create_task(self._pump_kv_events(), name="vllm-kv-events")
        self._watchdog = loop.create_task(self._watch_engine(), name="vllm-watchdog")
        if self._tiers is not None:
            self._tier_poll = loop.create_task(self._poll_tier_report(), name="vllm-tier-report")
        log.info("vLLM engine ready: %s", self.info)

    async def _poll_tier_report(self) -> None:
        """Keep the tiers' latest report (asked of vLLM's worker process off the loop, every second), so
        :meth:`tier_report` never waits on that process."""
        assert self._tiers is not None
        while True:
            try:
                self._tier_report = await asyncio.to_thread(self._tiers.call, "report", timeout_s=2.0)
            except Exception as exc:  # noqa: BLE001 - keep the last report; the metrics go stale, nothing fails
                log.debug("the KV tiers did not report: %s", exc)
            await asyncio.sleep(TIER_REPORT_INTERVAL_S)

    async def shutdown(self) -> None:
        self._dead_reported = True  # a deliberate stop is not a death
        self._stopping = True  # generate refuses new requests from now on
        if self._llm is not None:
            if not self._llm.errored:
                await self._abort_all(self._llm)
            self._llm.shutdown(timeout=_CPU_ENGINE_EXIT_S if current_platform.is_cpu() else None)
            self._llm = None
        for task in (self._kv_task, self._watchdog, self._tier_poll):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._subscriber is not None:
            self._subscriber.close()
            self._subscriber = None
        if self._tiers is not None:
            self._tiers.close()
        if self._ipc is not None:
            self._ipc.remove()
            self._ipc = None

    # ---- requests -------------------------------------------------------------------------------
    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        llm = self._require_llm()
        self._check_request(request)
        live = _Live(prompt_tokens=len(request.token_ids))
        if request.kv_handle is not None and self._translator is not None:
            live.local_hit = self._translator.cached_prefix_tokens(request.token_ids[:-1])
        self._live[request.request_id] = live
        cached = 0
        finished = False
        prompt = tokens_input(list(request.token_ids))
        stream = llm.generate(prompt, self._sampling(request), request.request_id,
                              lora_request=self._loras.get(request.lora) if request.lora else None)
        try:
            async with contextlib.aclosing(stream):
                async for out in stream:
                    completion = out.outputs[0]
                    tokens = list(completion.token_ids)
                    logprobs = token_logprobs(tokens, completion.logprobs, request.sampling.logprobs)
                    prompt_lps = None
                    if not live.started and request.sampling.prompt_logprobs is not None:
                        prompt_lps = prompt_token_logprobs(list(request.token_ids), out.prompt_logprobs,
                                                           request.sampling.prompt_logprobs)
                    live.started = True
                    live.generated += len(tokens)
                    if out.num_cached_tokens:
                        cached = out.num_cached_tokens
                    if not out.finished:
                        if live.aborted:  # aborted before vLLM knew the request: abort again
                            await llm.abort(request.request_id)
                        if tokens:
                            yield EngineOutput(tokens, logprobs=logprobs, prompt_logprobs=prompt_lps)
                        continue
                    finish = _FINISH_REASONS.get(completion.finish_reason, "error")
                    finished = True
                    if request.kv_export and out.kv_transfer_params and self.transfer is not None:
                        self._hold(request.request_id, self.transfer.lease_s)
                    yield EngineOutput(tokens, finish_reason=finish, usage=self._usage(request, live, cached),
                                       kv_handle=out.kv_transfer_params if request.kv_export else None,
                                       logprobs=logprobs, prompt_logprobs=prompt_lps)
                    return
        except EngineDeadError as exc:
            self._report_dead("vLLM's engine core process died")
            raise UpstreamError("the vLLM engine died while serving this request") from exc
        except ValueError as exc:
            if request.sampling.structured is None:
                raise
            # vLLM checks the constraint (xgrammar compiles it) when the request is added.
            raise InvalidRequest(f"vLLM cannot use this structured output constraint: {exc}",
                                 param="response_format", code="invalid_structured_output") from exc
        finally:
            if not finished and self._llm is llm and llm is not None and not llm.errored:
                # Closed early (aclose, cancellation): leaving ``aclosing`` had vLLM abort the
                # request; wait until its engine core has freed the blocks, as ``abort`` does.
                await _core_caught_up(llm)
            if self._live.get(request.request_id) is live:
                del self._live[request.request_id]

    def _sampling(self, request: EngineRequest) -> VllmSamplingParams:
        params = request.sampling
        if request.carried_tokens:  # the carried tokens count against max_tokens and min_tokens
            params = msgspec.structs.replace(params, max_tokens=params.max_tokens - request.carried_tokens,
                                             min_tokens=max(0, params.min_tokens - request.carried_tokens))
        sampling = to_vllm_sampling(params)
        if request.kv_export:
            sampling.extra_args = {"kv_transfer_params": export_params()}
        elif request.kv_handle is not None:
            sampling.extra_args = {"kv_transfer_params": import_params(
                request.kv_handle, len(request.token_ids), self.info.block_size)}
        return sampling

    @staticmethod
    def _usage(request: EngineRequest, live: _Live, cached: int) -> Usage:
        """A decode's ``num_cached_tokens`` (vLLM) counts every prompt token it did not compute: its
        own prefix hit plus the tokens read from the prefill worker. The prefix hit is the one the
        cache held when the request was submitted (``live.local_hit``); the rest was transferred.
        The carried tokens count as output."""
        carried = request.carried_tokens
        prompt = live.prompt_tokens - carried
        transferred = 0
        if request.kv_handle is not None:
            transferred = max(0, min(cached, prompt) - live.local_hit)
            cached = live.local_hit
        return Usage(prompt_tokens=prompt, completion_tokens=live.generated + carried,
                     cached_tokens=min(cached, prompt), transferred_tokens=transferred)

    def _hold(self, request_id: str, lease_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._held[request_id] = loop.call_later(lease_s, self._held.pop, request_id, None)

    async def release_transfer(self, request_id: str) -> None:
        """The decode worker has read the blocks: vLLM frees them on its own (the connector's
        notification), so only the bookkeeping of :meth:`load` is dropped here."""
        timer = self._held.pop(request_id, None)
        if timer is not None:
            timer.cancel()

    async def abort(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is None or self._llm is None or self._llm.errored:
            return
        live.aborted = True
        await self._llm.abort(request_id)
        await _core_caught_up(self._llm)
        if self._live.get(request_id) is live:
            del self._live[request_id]

    async def _abort_all(self, llm: AsyncLLM) -> None:
        """Abort every live request, then again while vLLM still has unfinished ones: a request
        whose submission was under way during the first pass (vLLM did not know it yet) is
        registered by then. Bounded: shutdown must not hang on a stuck engine."""
        ids = list(self._live)
        for request_id in ids:
            await self.abort(request_id)
        deadline = asyncio.get_running_loop().time() + _SHUTDOWN_DRAIN_S
        while llm.get_num_unfinished_requests() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
            await llm.abort(ids)
            await _core_caught_up(llm)

    # ---- state ----------------------------------------------------------------------------------
    def load(self) -> WorkerLoad:
        block = self.info.block_size
        running = waiting = active = 0
        for live in self._live.values():
            if live.started:
                running += 1
            else:
                waiting += 1
            active += math.ceil((live.prompt_tokens + live.generated) / block)
        if self.transfer is not None and self.counters.kv_cache_usage is not None and (self._live or self._held):
            # vLLM's own count, which sees blocks held for a transfer. It comes with engine steps:
            # with nothing live or held, the last one may predate an abort's release.
            active = math.ceil(self.counters.kv_cache_usage * self.info.kv_blocks - 1e-6)
        return WorkerLoad(running=running, waiting=waiting, active_blocks=active, total_blocks=self.info.kv_blocks)

    async def clear_kv_cache(self) -> None:
        """Reset vLLM's prefix cache, preempting running requests (they recompute their KV) so
        that the reset cannot be refused while they hold blocks."""
        llm = self._require_llm()
        try:
            cleared = await llm.reset_prefix_cache(reset_running_requests=True)
        except Exception as exc:
            raise UpstreamError(f"vLLM could not reset its prefix cache: {type(exc).__name__}: {exc}") from exc
        if not cleared:
            raise UpstreamError("vLLM could not reset its prefix cache")
        # vLLM announces the reset only with its next engine step, which may be far off when idle:
        # report it now. Its own AllBlocksCleared, when it comes, clears again: it drops any block
        # announced in between from before the reset; blocks stored since follow it.
        assert self._translator is not None
        emit_kv_events(self._sink, self._translator.clear())

    def tier_block_hashes(self) -> dict[str, list[int]]:
        """What the host and disk tiers hold, asked of vLLM's worker process ({} without tiers, or when it
        does not answer: the index then lacks them until they are offloaded again)."""
        if self._tiers is None:
            return {}
        try:
            return dict(self._tiers.call("snapshot", timeout_s=2.0))
        except Exception as exc:  # noqa: BLE001 - a resync without the tiers, not a failed one
            log.warning("the KV tiers did not say what they hold: %s", exc)
            return {}

    def tier_report(self) -> TierReport | None:
        return self._tier_report

    def tier_stats(self) -> TierStats:
        """The tiers' counters now (workers.kvbm.stats), asked of vLLM's worker process (tests)."""
        return self._tiers.call("report", timeout_s=2.0).stats if self._tiers is not None else TierStats()

    def flush_tiers(self, timeout_s: float = 10.0) -> bool:
        """Wait until every block offloaded so far is written to its tiers (tests, shutdown)."""
        return bool(self._tiers.call("flush", timeout_s, timeout_s=timeout_s + 1)) if self._tiers is not None else True

    def cached_block_hashes(self) -> list[int]:
        return self._translator.cached_hashes() if self._translator is not None else []

    def cached_block_count(self) -> int:
        return self._translator.cached_count if self._translator is not None else 0

    # ---- LoRA adapters --------------------------------------------------------------------------
    async def load_lora(self, name: str, path: str) -> None:
        """Load a PEFT adapter into vLLM (its id: a number of this worker's own; vLLM keys the KV
        cache by the adapter's name, which router.hashing salts the block hashes with)."""
        if self.settings.max_loras <= 0:
            raise InvalidRequest("this vLLM worker was started without LoRA support "
                                 "(SLUICE_WORKER__VLLM__MAX_LORAS=0)", code="lora_not_supported")
        loaded = self._loras.get(name)
        if loaded is not None:
            if loaded.lora_path == path:
                return
            raise InvalidRequest(f"a LoRA adapter named {name!r} is already loaded from {loaded.lora_path!r}",
                                 param="lora_name", code="lora_exists")
        if not (Path(path) / "adapter_config.json").is_file():
            raise InvalidRequest(f"no LoRA adapter at {path!r} (adapter_config.json not found)", param="lora_path",
                                 code="lora_not_found")
        self._lora_ids += 1
        request = LoRARequest(lora_name=name, lora_int_id=self._lora_ids, lora_path=path)
        try:
            await self._require_llm().add_lora(request)
        except (ValueError, RuntimeError, OSError) as exc:
            raise InvalidRequest(f"vLLM could not load the LoRA adapter at {path!r}: {exc}", param="lora_path",
                                 code="lora_load_failed") from exc
        self._loras[name] = request

    async def unload_lora(self, name: str) -> None:
        request = self._loras.pop(name, None)
        if request is None:
            raise InvalidRequest(f"LoRA adapter {name!r} is not loaded", param="lora_name", code="lora_not_found")
        await self._require_llm().remove_lora(request.lora_int_id)

    def loras(self) -> list[str]:
        return list(self._loras)

    # ---- internals ------------------------------------------------------------------------------
    def _require_llm(self) -> AsyncLLM:
        if self._llm is None or self._stopping:
            raise UpstreamError("the vLLM engine is not running")
        if self._llm.errored:
            raise UpstreamError("the vLLM engine is dead")
        return self._llm

    def _check_request(self, request: EngineRequest) -> None:
        """Refuse here what vLLM would refuse with a bare ValueError (or accept wrongly), with the
        reason in the message."""
        if request.lora is not None and request.lora not in self._loras:
            raise InvalidRequest(f"LoRA adapter {request.lora!r} is not loaded on this worker", param="model",
                                 code="lora_not_loaded")
        if request.request_id in self._live:
            raise InvalidRequest(f"request id {request.request_id!r} is already running")
        n = len(request.token_ids)
        if n == 0:
            raise InvalidRequest("the prompt is empty", param="prompt")
        if not 0 <= request.carried_tokens < n or request.carried_tokens >= request.sampling.max_tokens:
            raise InvalidRequest(f"carried_tokens {request.carried_tokens} does not fit the request")
        if (request.kv_export or request.kv_handle is not None) and self.transfer is None:
            raise InvalidRequest("this vLLM worker runs without a KV connector: it serves no disaggregated request")
        limit = self.info.context_length
        if n > limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens; the prompt has {n} tokens.",
                param="messages")

    async def _watch_engine(self) -> None:
        """Notice an engine core that died while no request was running (nothing else would)."""
        while self._llm is not None and not self._llm.errored:
            await asyncio.sleep(_WATCHDOG_INTERVAL_S)
        if self._llm is not None:
            self._report_dead("vLLM's engine core process died")

    def _report_step(self, step: StepStats) -> None:
        if not self._warming:
            emit_step(self.on_step, step)

    def _report_dead(self, reason: str) -> None:
        if self._dead_reported:
            return
        self._dead_reported = True
        log.error("the vLLM engine is dead: %s", reason)
        if self._on_dead is not None:
            try:
                self._on_dead(reason)
            except Exception:  # noqa: BLE001 - reporting must not mask the original failure
                log.exception("on_dead callback failed")

    async def _pump_kv_events(self) -> None:
        assert self._subscriber is not None and self._translator is not None
        feed = KvEventFeed(self._translator, self._sink)
        async for frames in self._subscriber.messages():
            feed.receive(frames)
