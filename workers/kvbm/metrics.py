"""The tiers' Prometheus metrics, read from the engine's latest :class:`~workers.kvbm.tiers.TierReport` at each
scrape (``Engine.tier_report``: never blocks). docs/metrics.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from workers.kvbm.stats import ONBOARD_BUCKETS_S, TierStats
from workers.kvbm.tiers import TierReport

RECOMPUTE_REASONS = ("corrupt", "timeout", "down")


class TierCollector(Collector):
    def __init__(self, report: Callable[[], TierReport | None]) -> None:
        self._report = report

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        tiers = self._report()
        if tiers is None:
            return
        names = tiers.names
        blocks = GaugeMetricFamily("sluice_worker_kv_tier_blocks", "KV blocks a tier of this worker holds", labels=["tier"])
        nbytes = GaugeMetricFamily("sluice_worker_kv_tier_bytes", "Bytes a tier of this worker holds (blocks x frame)",
                                   labels=["tier"])
        for tier, (n, b) in tiers.held.items():
            blocks.add_metric([tier], n)
            nbytes.add_metric([tier], b)
        yield blocks
        yield nbytes
        stats: TierStats = tiers.stats
        yield _per_tier("sluice_worker_kv_tier_hits", "Blocks onboarded from a tier instead of recomputed",
                        names, stats.hits)
        yield _per_tier("sluice_worker_kv_tier_offloaded_bytes", "Bytes written to a tier", names, stats.offloaded_bytes)
        yield _per_tier("sluice_worker_kv_tier_onboarded_bytes", "Bytes read from a tier into the engine", names,
                        stats.onboarded_bytes)
        recomputes = CounterMetricFamily("sluice_worker_kv_tier_recomputes",
                                         "Blocks a tier was expected to give that were recomputed, by reason",
                                         labels=["reason"])
        for reason in RECOMPUTE_REASONS:
            recomputes.add_metric([reason], stats.recomputes[reason])
        yield recomputes
        yield CounterMetricFamily("sluice_worker_kv_tier_offloads_dropped",
                                  "Blocks not offloaded because the offload queue was full", value=stats.offloads_dropped)
        yield CounterMetricFamily("sluice_worker_kv_tier_step_seconds",
                                  "Seconds the engine's steps spent in the KV tiers' connector (block copies, onboard "
                                  "reads, planning)", value=stats.step_seconds)
        yield CounterMetricFamily("sluice_worker_kv_tier_offload_cpu_seconds",
                                  "CPU seconds of the KV tiers' offload thread", value=stats.offload_cpu_seconds)
        histogram = HistogramMetricFamily("sluice_worker_kv_tier_onboard_seconds",
                                          "Time of one onboard's reads from a tier", labels=["tier"])
        for tier in names:
            row = stats.onboard_seconds.get(tier)
            counts = row[2:] if row else [0.0] * (len(ONBOARD_BUCKETS_S) + 1)
            cumulative, buckets = 0.0, []
            for bound, count in zip([*map(str, ONBOARD_BUCKETS_S), "+Inf"], counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            histogram.add_metric([tier], buckets, sum_value=row[1] if row else 0.0)
        yield histogram


def _per_tier(name: str, doc: str, tiers: list[str], values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["tier"])
    for tier in tiers:
        family.add_metric([tier], values.get(tier, 0))
    return family
