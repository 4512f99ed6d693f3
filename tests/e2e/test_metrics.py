"""Metrics end to end: the session's stack (``sluice serve`` + two mocker ``sluice worker``) serves a few
requests; each worker's ``/metrics``, found through the frontend's Prometheus discovery, and the
frontend's own show the traffic; ``sluice prometheus-targets`` and ``sluice status --json``, run as a user
runs them, list the same processes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.devstack import REPO, Stack, wait_until
from tests.e2e.conftest import MODEL

WORKERS = ("w1", "w2")
#: Long enough for several full blocks of 16 tokens: a repeat finds them in the prefix cache.
PROMPT = "Describe, step by step and with care, how a canal lock raises a boat from one level to the next. " * 3

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; KeyError when the series is missing."""
    return samples[(name, frozenset(labels.items()))]


def cli(stack: Stack, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "sluice", *args], cwd=REPO, env=stack.env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def traffic(stack: Stack, client: openai.OpenAI) -> Iterator[None]:
    """Streamed requests pinned to each worker, the same prompt twice on w1 (a prefix-cache hit), and
    one routed in kv mode."""
    for worker, times in (("w1", 2), ("w2", 1)):
        for _ in range(times):
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, stream=True,
                temperature=0, extra_body={"ignore_eos": True},
                extra_headers={"x-sluice-router": f"worker_id={worker}"}))
            assert chunks
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=4,
                                   extra_headers={"x-sluice-router": "mode=kv"})
    yield


def worker_urls(stack: Stack) -> dict[str, str]:
    groups = httpx.get(f"{stack.base_url}/prometheus/targets", timeout=10).json()
    return {g["labels"]["worker"]: f"http://{g['targets'][0]}{g['labels']['__metrics_path__']}"
            for g in groups if g["labels"]["component"] == "worker"}


def test_the_discovery_lists_the_frontend_and_every_worker(stack: Stack, traffic: None) -> None:
    groups = httpx.get(f"{stack.base_url}/prometheus/targets", timeout=10).json()
    frontends = [g for g in groups if g["labels"]["component"] == "frontend"]
    assert [g["targets"] for g in frontends] == [[stack.base_url.removeprefix("http://")]]
    assert frontends[0]["labels"]["sluice_namespace"] == stack.namespace
    workers = {g["labels"]["worker"]: g for g in groups if g["labels"]["component"] == "worker"}
    assert set(WORKERS) <= set(workers)
    for name in WORKERS:
        assert workers[name]["labels"] == {
            "__metrics_path__": "/metrics", "sluice_namespace": stack.namespace, "component": "worker",
            "worker": name, "model": MODEL, "pool": "agg", "engine": "mocker"}


def test_each_worker_serves_its_own_metrics(stack: Stack, traffic: None) -> None:
    urls = worker_urls(stack)
    # The gauges follow the heartbeat: wait for one after the traffic.
    wait_until(lambda: all(value(scrape(urls[w]), "sluice_worker_kv_blocks_capacity") > 0 for w in WORKERS), 10,
               "a heartbeat to set the workers' gauges")
    for name in WORKERS:
        m = scrape(urls[name])
        assert value(m, "sluice_worker_requests_running") >= 0 and value(m, "sluice_worker_requests_waiting") >= 0
        assert value(m, "sluice_worker_kv_blocks_used") >= 0
        assert value(m, "sluice_worker_generated_tokens_total") >= 12
        assert value(m, "sluice_worker_prompt_tokens_total") > 0
        assert value(m, "sluice_worker_step_duration_seconds_count", phase="prefill") >= 1
        assert value(m, "sluice_worker_step_duration_seconds_count", phase="decode") >= 11
        assert value(m, "sluice_worker_kv_events_published_total", kind="stored") > 0
        assert value(m, "sluice_worker_preemptions_total") == 0
        assert value(m, "sluice_kv_index_resyncs_total", reason="gap") == 0
    assert value(scrape(urls["w1"]), "sluice_worker_prefix_cache_hit_tokens_total") >= 16  # the repeat


def test_the_frontend_reports_latency_tokens_routing_and_queues(stack: Stack, traffic: None) -> None:
    m = scrape(f"{stack.base_url}/metrics")
    # At least one gap per stream of the traffic: tokens that arrive together share one observation
    # (a loaded machine makes that more frequent), and the module's other tests add their own.
    assert value(m, "sluice_inter_token_latency_seconds_count", model=MODEL) >= 3
    assert value(m, "sluice_request_queue_time_seconds_count", model=MODEL) >= 4
    assert value(m, "sluice_input_tokens_total", model=MODEL) > 0
    assert value(m, "sluice_decode_context_tokens_total", model=MODEL) > value(m, "sluice_output_tokens_total", model=MODEL)
    assert value(m, "sluice_cached_tokens_total", model=MODEL) >= 16
    assert value(m, "sluice_router_decision_seconds_count", mode="round_robin") >= 3
    assert value(m, "sluice_router_decision_seconds_count", mode="kv") >= 1
    assert value(m, "sluice_router_overlap_ratio_count", model=MODEL) >= 1
    for name in WORKERS:
        assert value(m, "sluice_router_picks_total", model=MODEL, worker=name, mode="round_robin") >= 1
        assert value(m, "sluice_worker_queue_messages", worker=name) >= 0
    assert value(m, "sluice_pool_queue_messages", model=MODEL, pool="agg") >= 0
    assert value(m, "sluice_router_index_blocks", model=MODEL) > 0


def test_prometheus_targets_prints_what_the_frontend_serves(stack: Stack, traffic: None) -> None:
    from_cli = json.loads(cli(stack, "prometheus-targets"))
    assert from_cli == httpx.get(f"{stack.base_url}/prometheus/targets", timeout=10).json()


def test_status_json_lists_models_workers_and_frontends(stack: Stack, traffic: None) -> None:
    status = json.loads(cli(stack, "status", "--json"))
    assert status["namespace"] == stack.namespace and status["router_modes"] == ["round_robin"]
    [model] = [m for m in status["models"] if m["model"] == MODEL]
    assert model["pools"]["agg"]["workers"] >= 2 and model["index_blocks"] > 0
    workers = {w["worker_id"]: w for w in status["workers"]}
    urls = worker_urls(stack)
    for name in WORKERS:
        w = workers[name]
        assert (w["pool"], w["state"], w["engine"], w["metrics_url"]) == ("agg", "live", "mocker", urls[name])
        assert w["kv_blocks_total"] > 0 and w["heartbeat_age_s"] < 5 and w["lease_expires_in_s"] > 0
    assert workers["w1"]["index_blocks"] > 0
    [frontend] = status["frontends"]
    assert frontend["url"] == stack.base_url and frontend["metrics_url"] == f"{stack.base_url}/metrics"
    assert frontend["router_mode"] == "round_robin"
    screen = cli(stack, "status")
    assert "w1" in screen and "w2" in screen and stack.base_url in screen
