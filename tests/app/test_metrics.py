"""The frontend's metrics (app/metrics.py): routing decisions, what a scrape reads from Redis, error types."""

from __future__ import annotations

import dataclasses

import pytest
import redis.exceptions

from app.metrics import ANY_WORKER, FrontendMetrics, error_type
from core.errors import NoWorkerAvailable, Overloaded, UpstreamError
from router.cluster import ClusterSnapshot
from tests.router.factories import make_worker


def value(m: FrontendMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def snapshot(*worker_ids: str) -> ClusterSnapshot:
    workers = [make_worker(wid, i) for i, wid in enumerate(worker_ids)]
    prefill = make_worker("p1", 9)
    workers.append(dataclasses.replace(prefill, record=dataclasses.replace(prefill.record, pool="prefill",
                                                                           pool_queue="q.m.prefill")))
    return ClusterSnapshot(namespace="ns", taken_at=0.0, workers=workers, frontends=[],
                           queue_messages={"q.m.agg": 4, "q.m.prefill": 1, "q.w1": 2},
                           index_blocks={"w1": 10, "w2": 5, "p1": 1})


def test_a_decision_is_timed_and_counted_by_worker_and_mode() -> None:
    m = FrontendMetrics()
    m.observe_decision("m", "kv", "w1", 0.002, 0.75)
    m.observe_decision("m", "kv", "w1", 0.001, 0.0)
    m.observe_decision("m", "pool", None, 0.0, None)
    assert value(m, "sluice_router_picks_total", model="m", worker="w1", mode="kv") == 2
    assert value(m, "sluice_router_picks_total", model="m", worker=ANY_WORKER, mode="pool") == 1
    assert value(m, "sluice_router_decision_seconds_count", mode="kv") == 2
    assert value(m, "sluice_router_decision_seconds_sum", mode="kv") == pytest.approx(0.003)
    assert value(m, "sluice_router_overlap_ratio_count", model="m") == 2
    assert value(m, "sluice_router_overlap_ratio_bucket", model="m", le="0.7") == 1


def test_a_scrape_sets_queue_depths_and_index_size_and_forgets_gone_workers() -> None:
    m = FrontendMetrics()
    m.observe_decision("m", "kv", "w1", 0.001, 0.5)
    m.observe_decision("m", "kv", "gone", 0.001, 0.5)
    m.observe_decision("m", "pool", None, 0.001, None)
    m.observe_cluster(snapshot("w1", "w2"))
    assert value(m, "sluice_pool_queue_messages", model="m", pool="agg") == 4
    assert value(m, "sluice_pool_queue_messages", model="m", pool="prefill") == 1
    assert value(m, "sluice_worker_queue_messages", worker="w1") == 2
    assert value(m, "sluice_worker_queue_messages", worker="w2") == 0
    assert value(m, "sluice_router_index_blocks", model="m") == 16
    assert value(m, "sluice_router_picks_total", model="m", worker="gone", mode="kv") is None
    assert value(m, "sluice_router_picks_total", model="m", worker="w1", mode="kv") == 1
    assert value(m, "sluice_router_picks_total", model="m", worker=ANY_WORKER, mode="pool") == 1
    m.observe_cluster(snapshot("w2"))  # w1 left
    assert value(m, "sluice_worker_queue_messages", worker="w1") is None
    m.observe_cluster(None)  # Redis did not answer: no stale values
    assert value(m, "sluice_pool_queue_messages", model="m", pool="agg") is None
    assert value(m, "sluice_router_index_blocks", model="m") is None


def test_finished_and_refused_requests() -> None:
    m = FrontendMetrics()
    m.observe_finished("m", "stop", None, 0.1, 0.5, completion_tokens=7, prompt_tokens=30, cached_tokens=16,
                       transferred_tokens=14)
    m.observe_refused("m", "overloaded")
    assert value(m, "sluice_input_tokens_total", model="m") == 30
    assert value(m, "sluice_cached_tokens_total", model="m") == 16
    assert value(m, "sluice_transferred_tokens_total", model="m") == 14
    assert value(m, "sluice_requests_total", model="m", outcome="stop") == 1
    assert value(m, "sluice_requests_total", model="m", outcome="error") == 1
    assert value(m, "sluice_request_errors_total", model="m", type="overloaded") == 1


def test_error_types_are_a_small_fixed_set() -> None:
    assert error_type(Overloaded("busy", retry_after_s=1)) == "overloaded"
    assert error_type(NoWorkerAvailable("none")) == "no_worker_available"
    assert error_type(UpstreamError("x", code="worker_lost")) == "worker_lost"
    assert error_type(redis.exceptions.ConnectionError("gone")) == "redis_unavailable"
    assert error_type(RuntimeError("bug")) == "internal_error"
