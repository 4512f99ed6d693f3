"""Prometheus metrics of a worker process, owned by its engine host (workers.host), and the worker's
``/metrics`` endpoint.

The endpoint is prometheus_client's own HTTP server on a daemon thread, serving this registry only,
on ``SLUICE_WORKER__METRICS_HOST``:``SLUICE_WORKER__METRICS_PORT`` (port 0: a free one; -1: none).
It starts once the engine has (workers.signals): vLLM on CPU forks its engine core from the worker
process, and a fork that copied the endpoint's socket and thread left the prefill worker's engine
loop stalling for seconds (its lease lapsed mid-prefill in tests/e2e/test_vllm_disagg.py).
Its URL is part of the worker's registration (``WorkerRecord.metrics_url``), which is how
``sluice status`` and the Prometheus discovery (router.discovery) find it. docs/metrics.md lists
every metric.

Where the values come from: the gauges are set from the load record every heartbeat publishes
(``router.registry.WorkerLoad``), so they are at most a heartbeat old; token counts from each
request's outputs and final usage; step times and preemptions from the engine's step reports
(``workers.engines.base.StepStats``); KV events and resyncs from the KV relay (workers.kv_relay).
Everything is recorded on the engine loop thread; the HTTP thread only reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from core.addresses import advertised_host, http_url
from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, Usage
from core.settings import WorkerSettings
from router.registry import WorkerLoad
from workers.engines.base import StepStats
from workers.kvbm.metrics import TierCollector
from workers.kvbm.tiers import TierReport

log = logging.getLogger(__name__)

#: Engine step times: a decode step of a small model on a GPU takes milliseconds, a long prefill on a
#: CPU seconds.
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

#: The KV event kinds, as the ``kind`` label names them (their tags on the wire).
_EVENT_KINDS: dict[type, str] = {BlockStored: "stored", BlockRemoved: "removed", AllBlocksCleared: "cleared"}


def _sum_of(counter: Counter) -> float:
    """A counter's value summed over its labels."""
    return sum(sample.value for metric in counter.collect() for sample in metric.samples
               if sample.name.endswith("_total"))


@dataclass
class WorkerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.kv_index_resyncs = Counter(
            "sluice_kv_index_resyncs_total",
            "Rebuilds of the worker's prefix-index entries from its engine's cache after they lost track of "
            "it, by reason (workers.kv_relay.ResyncReason)", ["reason"], registry=r)
        self.running = Gauge("sluice_worker_requests_running", "Requests the engine is computing", registry=r)
        self.waiting = Gauge("sluice_worker_requests_waiting", "Requests the engine holds waiting for a batch slot",
                             registry=r)
        self.kv_blocks_used = Gauge("sluice_worker_kv_blocks_used", "KV cache blocks held by requests", registry=r)
        self.kv_blocks_capacity = Gauge("sluice_worker_kv_blocks_capacity", "KV cache blocks the engine has",
                                        registry=r)
        self.prompt_tokens = Counter("sluice_worker_prompt_tokens_total", "Prompt tokens of finished requests",
                                     registry=r)
        self.cache_hit_tokens = Counter("sluice_worker_prefix_cache_hit_tokens_total",
                                        "Prompt tokens of finished requests found in the prefix cache (not computed)",
                                        registry=r)
        self.generated_tokens = Counter("sluice_worker_generated_tokens_total", "Tokens the engine generated",
                                        registry=r)
        self.step_duration = Histogram("sluice_worker_step_duration_seconds",
                                       "Engine step (forward pass) time, by phase: prefill (computed prompt "
                                       "tokens) or decode", ["phase"], buckets=STEP_BUCKETS_S, registry=r)
        self.preemptions = Counter("sluice_worker_preemptions_total",
                                   "Running requests the engine sent back to wait, freeing their KV blocks", registry=r)
        self.kv_events = Counter("sluice_worker_kv_events_published_total",
                                 "KV cache events written to the prefix index, by kind", ["kind"], registry=r)
        for phase in ("prefill", "decode"):
            self.step_duration.labels(phase)
        for kind in _EVENT_KINDS.values():
            self.kv_events.labels(kind)

    def watch_tiers(self, report: Callable[[], TierReport | None]) -> None:
        """Export the engine's KV tiers' metrics (read at each scrape; nothing when it has none)."""
        self.registry.register(TierCollector(report))

    # ---- recording (engine loop thread) -----------------------------------------------------------
    def observe_load(self, load: WorkerLoad) -> None:
        self.running.set(load.running)
        self.waiting.set(load.waiting)
        self.kv_blocks_used.set(load.active_blocks)
        self.kv_blocks_capacity.set(load.total_blocks)

    def observe_step(self, step: StepStats) -> None:
        if step.duration_s is not None:
            self.step_duration.labels(step.phase).observe(step.duration_s)
        if step.preemptions:
            self.preemptions.inc(step.preemptions)

    def observe_usage(self, usage: Usage) -> None:
        """A request finished on this worker with ``usage``."""
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.cache_hit_tokens.inc(usage.cached_tokens)

    def observe_kv_events(self, events: list[KvEvent]) -> None:
        """``events`` reached the prefix index."""
        counts: dict[str, int] = {}
        for event in events:
            kind = _EVENT_KINDS.get(type(event))
            if kind is not None:
                counts[kind] = counts.get(kind, 0) + 1
        for kind, n in counts.items():
            self.kv_events.labels(kind).inc(n)

    # ---- reading ----------------------------------------------------------------------------------
    def kv_index_resyncs_total(self) -> int:
        """Every reason's count, summed (what the heartbeat publishes as ``kv_resyncs``)."""
        return int(_sum_of(self.kv_index_resyncs))

    def generated_tokens_total(self) -> float:
        return _sum_of(self.generated_tokens)


class TokenRate:
    """Tokens per second between two readings of a growing count (the heartbeat's ``tokens_per_s``)."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def sample(self, total: float, now: float) -> float:
        """The rate since the previous sample (0 for the first, or when no time passed)."""
        last, self._last = self._last, (total, now)
        if last is None or now <= last[1]:
            return 0.0
        return max(0.0, total - last[0]) / (now - last[1])


class MetricsEndpoint:
    """A worker's ``/metrics``: prometheus_client's HTTP server on a daemon thread. :meth:`start`
    returns None when the settings turn it off; it raises OSError when the address cannot be bound."""

    def __init__(self, server, url: str) -> None:
        self._server = server
        #: What the worker registers: where other processes reach the endpoint.
        self.url = url

    @classmethod
    def start(cls, registry: CollectorRegistry, settings: WorkerSettings) -> MetricsEndpoint | None:
        if settings.metrics_port < 0:
            return None
        server, _thread = start_http_server(settings.metrics_port, settings.metrics_host, registry)
        port = server.server_address[1]
        url = http_url(advertised_host(settings.metrics_host, settings.metrics_advertise_host), port, "/metrics")
        log.info("worker metrics on %s (listening on %s:%d)", url, settings.metrics_host, port)
        return cls(server, url)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
