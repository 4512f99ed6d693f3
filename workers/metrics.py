"""Prometheus metrics of a worker process, owned by its engine host (workers.host).

Workers serve no ``/metrics`` yet: each count that routers or operators need also travels in the
heartbeat's load record (``router.registry.WorkerLoad``), refreshed every heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter


@dataclass
class WorkerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.kv_index_resyncs = Counter(
            "sluice_kv_index_resyncs_total",
            "Rebuilds of the worker's prefix-index entries from its engine's cache after they lost track of "
            "it, by reason (workers.kv_relay.ResyncReason)", ["reason"], registry=self.registry)

    def kv_index_resyncs_total(self) -> int:
        """Every reason's count, summed (what the heartbeat publishes as ``kv_resyncs``)."""
        return int(sum(sample.value for metric in self.kv_index_resyncs.collect() for sample in metric.samples
                       if sample.name.endswith("_total")))
