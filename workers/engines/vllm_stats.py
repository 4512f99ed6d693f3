"""vLLM's own scheduler counters, kept for the worker (its load record, its usage accounting).

vLLM hands every engine step's statistics to the stat loggers of its ``AsyncLLM`` (on the loop that
drives it): :func:`recorder_factory` makes one that copies what Sluice needs into an
:class:`EngineCounters`. The KV cache usage is vLLM's count of the blocks requests hold, including
a prefill's blocks held for a decode worker's read, which Sluice's own per-request estimate cannot
see; the prompt-token sources say how much of the prompts the engine computed, found in its prefix
cache, or read from another worker (disaggregation). vLLM calls these interfaces unstable: the
vLLM tests of the engine exercise them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase, StatLoggerFactory
from vllm.v1.metrics.stats import IterationStats, SchedulerStats


@dataclass(slots=True)
class EngineCounters:
    #: Share of the KV blocks requests hold (None until the first engine step).
    kv_cache_usage: float | None = None
    #: Prompt tokens since start, by where their KV came from.
    prompt_computed: int = 0
    prompt_local_cache_hit: int = 0
    prompt_transferred: int = 0

    def record(self, scheduler: SchedulerStats | None, iteration: IterationStats | None) -> None:
        if scheduler is not None:
            self.kv_cache_usage = scheduler.kv_cache_usage
        if iteration is not None:
            tokens = iteration.prompt_token_stats
            self.prompt_computed += tokens.computed
            self.prompt_local_cache_hit += tokens.local_cache_hit
            self.prompt_transferred += tokens.external_kv_transfer


def recorder_factory(counters: EngineCounters) -> StatLoggerFactory:
    """A stat-logger class (vLLM instantiates it per engine) that records into ``counters``."""

    class _Recorder(StatLoggerBase):
        def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
            self.counters = counters

        def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
                   mm_cache_stats: object = None, engine_idx: int = 0) -> None:
            self.counters.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _Recorder
