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
    #: KV reads of this engine's connector since start (the decode side of a transfer), as NIXL's
    #: telemetry measures them: how many, bytes, seconds from post to completion, and failures
    #: (transfers and handshakes).
    kv_reads: int = 0
    kv_read_bytes: int = 0
    kv_read_seconds: float = 0.0
    kv_read_descriptors: int = 0
    kv_read_failures: int = 0

    def record(self, scheduler: SchedulerStats | None, iteration: IterationStats | None) -> None:
        if scheduler is not None:
            self.kv_cache_usage = scheduler.kv_cache_usage
            if scheduler.kv_connector_stats:
                self._record_transfers(scheduler.kv_connector_stats)
        if iteration is not None:
            tokens = iteration.prompt_token_stats
            self.prompt_computed += tokens.computed
            self.prompt_local_cache_hit += tokens.local_cache_hit
            self.prompt_transferred += tokens.external_kv_transfer

    def _record_transfers(self, stats: dict) -> None:
        """``NixlKVConnectorStats.data``: per-transfer lists since the last step's report."""
        sizes = stats.get("bytes_transferred") or ()
        self.kv_reads += len(sizes)
        self.kv_read_bytes += int(sum(sizes))
        self.kv_read_seconds += float(sum(stats.get("transfer_duration") or ()))
        self.kv_read_descriptors += int(sum(stats.get("num_descriptors") or ()))
        self.kv_read_failures += len(stats.get("num_failed_transfers") or ()) + \
            len(stats.get("num_failed_handshakes") or ())


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
