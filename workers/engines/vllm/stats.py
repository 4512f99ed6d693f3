"""vLLM's own scheduler counters, kept for the worker (its load record, its usage accounting, its
metrics).

vLLM hands every engine step's statistics to the stat loggers of its ``AsyncLLM`` (on the loop that
drives it): :func:`recorder_factory` makes one that copies what Sluice needs into an
:class:`EngineCounters` and reports each step (its duration, prompt and decode tokens, preemptions:
``workers.engines.base.StepStats``) to the engine's step observer. The step's duration is vLLM's
"iteration details" (``enable_logging_iteration_details``: the time the engine core waited for the
model's output). The KV cache usage is vLLM's count of the blocks requests hold, including
a prefill's blocks held for a decode worker's read, which Sluice's own per-request estimate cannot
see; the prompt-token sources say how much of the prompts the engine computed, found in its prefix
cache, or read from another worker (disaggregation). vLLM calls these interfaces unstable: the
vLLM tests of the engine exercise them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase, StatLoggerFactory
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from workers.engines.base import StepStats


@dataclass(slots=True)
class EngineCounters:
    #: Share of the KV blocks requests hold (None until the first engine step).
    kv_cache_usage: float | None = None
    #: Prompt tokens since start, by where their KV came from.
    prompt_computed: int = 0
    prompt_local_cache_hit: int = 0
    prompt_transferred: int = 0
    #: KV reads of this engine's connector since start (the decode side of a transfer), as NIXL's
    #: telemetry measures them: how many, bytes, seconds from post to completion, and failures
    #: (transfers and handshakes).
    kv_reads: int = 0
    kv_read_bytes: int = 0
    kv_read_seconds: float = 0.0
    kv_read_descriptors: int = 0
    kv_read_failures: int = 0

    def record(self, scheduler: SchedulerStats | None, iteration: IterationStats | None) -> StepStats | None:
        """Keep the counters; returns the step these statistics describe (None: none, nor any preemption)."""
        if scheduler is not None:
            self.kv_cache_usage = scheduler.kv_cache_usage
            if scheduler.kv_connector_stats:
                self._record_transfers(scheduler.kv_connector_stats)
        if iteration is not None:
            tokens = iteration.prompt_token_stats
            self.prompt_computed += tokens.computed
            self.prompt_local_cache_hit += tokens.local_cache_hit
            self.prompt_transferred += tokens.external_kv_transfer
        return step_of(scheduler, iteration)

    def _record_transfers(self, stats: dict) -> None:
        """``NixlKVConnectorStats.data``: per-transfer lists since the last step's report."""
        sizes = stats.get("bytes_transferred") or ()
        self.kv_reads += len(sizes)
        self.kv_read_bytes += int(sum(sizes))
        self.kv_read_seconds += float(sum(stats.get("transfer_duration") or ()))
        self.kv_read_descriptors += int(sum(stats.get("num_descriptors") or ()))
        self.kv_read_failures += len(stats.get("num_failed_transfers") or ()) + \
            len(stats.get("num_failed_handshakes") or ())


def step_of(scheduler: SchedulerStats | None, iteration: IterationStats | None) -> StepStats | None:
    """The step a statistics report describes: its iteration details (None without them, or for a
    data-parallel dummy step) and the preemptions the report counts."""
    details = scheduler.iteration_details if scheduler is not None else None
    preempted = iteration.num_preempted_reqs if iteration is not None else 0
    if details is None or details.is_dummy:
        return StepStats(None, preemptions=preempted) if preempted else None
    return StepStats(details.elapsed_ms / 1000.0, prefill_tokens=details.num_ctx_tokens,
                     decode_tokens=details.num_generation_tokens, preemptions=preempted,
                     kv_usage=scheduler.kv_cache_usage if scheduler is not None else None)


def recorder_factory(counters: EngineCounters, on_step: Callable[[StepStats], None]) -> StatLoggerFactory:
    """A stat-logger class (vLLM instantiates it per engine) that records into ``counters`` and hands
    each step to ``on_step``."""

    class _Recorder(StatLoggerBase):
        def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
            self.counters = counters

        def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
                   mm_cache_stats: object = None, engine_idx: int = 0) -> None:
            step = self.counters.record(scheduler_stats, iteration_stats)
            if step is not None:
                on_step(step)

        def log_engine_initialized(self) -> None:
            pass

    return _Recorder
