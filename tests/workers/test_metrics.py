"""The worker's metrics (workers.metrics): what each observation records, the token rate of the
heartbeat, and the ``/metrics`` endpoint a worker registers."""

from __future__ import annotations

import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, Usage
from core.settings import WorkerSettings
from router.registry import WorkerLoad
from workers.engines.base import StepStats
from workers.metrics import MetricsEndpoint, TokenRate, WorkerMetrics


def samples(metrics: WorkerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in metrics.registry.collect() for s in family.samples}


def test_observations_land_in_their_series() -> None:
    m = WorkerMetrics()
    m.observe_load(WorkerLoad(running=3, waiting=2, active_blocks=40, total_blocks=100))
    m.observe_step(StepStats(0.2, prefill_tokens=512, decode_tokens=3, preemptions=1))
    m.observe_step(StepStats(0.01, decode_tokens=4))
    m.observe_step(StepStats(None, preemptions=2))
    m.observe_usage(Usage(prompt_tokens=100, completion_tokens=7, cached_tokens=64))
    m.observe_kv_events([BlockStored([1, 2], None), BlockStored([3], 2), BlockRemoved([1]), AllBlocksCleared()])
    m.generated_tokens.inc(7)
    got = samples(m)
    assert got[("sluice_worker_requests_running", ())] == 3
    assert got[("sluice_worker_requests_waiting", ())] == 2
    assert got[("sluice_worker_kv_blocks_used", ())] == 40
    assert got[("sluice_worker_kv_blocks_capacity", ())] == 100
    assert got[("sluice_worker_step_duration_seconds_count", (("phase", "prefill"),))] == 1
    assert got[("sluice_worker_step_duration_seconds_count", (("phase", "decode"),))] == 1
    assert got[("sluice_worker_step_duration_seconds_sum", (("phase", "prefill"),))] == pytest.approx(0.2)
    assert got[("sluice_worker_preemptions_total", ())] == 3
    assert got[("sluice_worker_prompt_tokens_total", ())] == 100
    assert got[("sluice_worker_prefix_cache_hit_tokens_total", ())] == 64
    assert got[("sluice_worker_kv_events_published_total", (("kind", "stored"),))] == 2
    assert got[("sluice_worker_kv_events_published_total", (("kind", "removed"),))] == 1
    assert got[("sluice_worker_kv_events_published_total", (("kind", "cleared"),))] == 1
    assert m.generated_tokens_total() == 7


def test_every_labelled_series_exists_from_the_start() -> None:
    got = samples(WorkerMetrics())
    for phase in ("prefill", "decode"):
        assert got[("sluice_worker_step_duration_seconds_count", (("phase", phase),))] == 0
    for kind in ("stored", "removed", "cleared"):
        assert got[("sluice_worker_kv_events_published_total", (("kind", kind),))] == 0


def test_token_rate_between_samples() -> None:
    rate = TokenRate()
    assert rate.sample(100, 10.0) == 0.0
    assert rate.sample(150, 12.0) == 25.0
    assert rate.sample(150, 12.0) == 0.0  # no time passed
    assert rate.sample(170, 13.0) == 20.0


def test_the_endpoint_serves_the_registry_on_a_free_port() -> None:
    m = WorkerMetrics()
    m.generated_tokens.inc(5)
    endpoint = MetricsEndpoint.start(m.registry, WorkerSettings())
    assert endpoint is not None
    try:
        assert endpoint.url.startswith("http://127.0.0.1:") and endpoint.url.endswith("/metrics")
        families = {f.name for f in text_string_to_metric_families(httpx.get(endpoint.url, timeout=5).text)}
        assert {"sluice_worker_generated_tokens", "sluice_kv_index_resyncs"} <= families
        assert "python_gc_objects_collected" not in families  # this registry only, not the process's default one
    finally:
        endpoint.close()


def test_the_endpoint_advertises_the_configured_host_and_can_be_off() -> None:
    endpoint = MetricsEndpoint.start(WorkerMetrics().registry,
                                     WorkerSettings(metrics_host="0.0.0.0", metrics_advertise_host="w1.pods.local"))
    assert endpoint is not None
    try:
        assert endpoint.url.startswith("http://w1.pods.local:")
    finally:
        endpoint.close()
    assert MetricsEndpoint.start(WorkerMetrics().registry, WorkerSettings(metrics_port=-1)) is None


def test_a_taken_port_is_an_os_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            MetricsEndpoint.start(WorkerMetrics().registry, WorkerSettings(metrics_port=taken.getsockname()[1]))
