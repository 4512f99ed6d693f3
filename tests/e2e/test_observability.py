"""A real Prometheus (Debian's package, as ``make observe`` runs it) scraping a real mocker stack through
the frontend's service discovery: every process is found and up, and every PromQL expression of the
Grafana dashboard returns data once traffic has flowed. ``promtool`` checks the configuration and
the rules. Skipped where no prometheus binary is installed (.ci/run installs it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.devstack import Stack, free_port, wait_until
from sluice.dashboard import DASHBOARD_PATH, expressions, render
from sluice.observe import RULES_PATH, ObserveConfig, check_config, write_config

MODEL = "smollm2"
needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                      reason="no prometheus/promtool binary (Debian's prometheus package)")


def test_the_kept_dashboard_is_the_generated_one() -> None:
    assert DASHBOARD_PATH.read_text() == render(), "run `sluice dashboard --write`"


@needs_prometheus
def test_promtool_accepts_the_rules_and_the_config(tmp_path: Path) -> None:
    rules = subprocess.run(["promtool", "check", "rules", str(RULES_PATH)], capture_output=True, text=True, timeout=60)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    checked = check_config(write_config(ObserveConfig(flower_url="http://127.0.0.1:5555"), tmp_path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture(scope="module")
def observed(redis_server, tokenizer_dir, tmp_path_factory) -> Iterator[tuple[Stack, str]]:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"obs{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "20", "SLUICE_ROUTER_MODE": "kv",
                         # a host KV tier: the tier metrics are exported only by a worker with tiers
                         "SLUICE_KVBM__HOST_BYTES": str(64 << 20)})
    listen = f"127.0.0.1:{free_port()}"
    try:
        s.start_worker("w1")
        s.start_worker("w2")
        s.start_frontend()
        s.wait_ready(MODEL, workers=2)
        # The planner (virtual connector: it decides, nothing is started) publishes its metrics URL with its
        # lease; the discovery lists it beside the frontend and the workers.
        s.processes.spawn("planner", [sys.executable, "-m", "sluice", "planner", "--connector", "virtual",
                                      "--interval", "1", "--log-level", "warning"],
                          s.env(SLUICE_PLANNER__METRICS_PORT="0", SLUICE_PLANNER__FAST_INTERVAL_S="0.5"))
        s.processes.spawn("prometheus", [sys.executable, "-m", "sluice", "observe", "--frontend", s.base_url,
                                         "--flower", "", "--listen", listen, "--scrape-interval", "1",
                                         "--data-dir", str(tmp_path_factory.mktemp("prometheus"))], s.env())
        yield s, f"http://{listen}"
    finally:
        s.stop()


def _query(prometheus: str, expr: str) -> list[dict]:
    r = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]["result"]


def _up_targets(prometheus: str) -> dict[str, str]:
    try:
        r = httpx.get(f"{prometheus}/api/v1/targets", timeout=5)
    except httpx.HTTPError:
        return {}
    if r.status_code != 200:  # Prometheus answers 503 until it has started
        return {}
    return {t["labels"].get("worker") or t["labels"].get("component", "?"): t["health"]
            for t in r.json()["data"]["activeTargets"]}


@needs_prometheus
def test_every_dashboard_expression_returns_data(observed: tuple[Stack, str]) -> None:
    s, prometheus = observed
    wait_until(lambda: _up_targets(prometheus) == {"w1": "up", "w2": "up", "frontend": "up", "planner": "up"}, 60,
               "Prometheus to find and scrape the frontend, both workers and the planner")
    system = "You are a terse assistant who answers in one sentence. " * 20  # a shared prefix: cache hits
    deadline = time.monotonic() + 8
    with httpx.Client(base_url=s.base_url, timeout=30) as client:
        i = 0
        while time.monotonic() < deadline:
            body = {"model": MODEL, "max_tokens": 24, "stream": i % 2 == 0,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Q{i}"}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            i += 1
    missing: list[str] = []

    def all_answer() -> bool:
        missing[:] = [e for e in expressions() if not _query(prometheus, e.replace("$__rate_interval", "1m"))]
        return not missing

    try:
        wait_until(all_answer, 30, "every dashboard expression to return data")
    except Exception as exc:  # noqa: BLE001 - name the expressions that stayed empty
        raise AssertionError(f"no data for: {missing}") from exc


@needs_prometheus
def test_the_planner_reads_the_traffic_from_prometheus(observed: tuple[Stack, str]) -> None:
    """The planner's optional source: the frontends' counters as Prometheus scraped them."""
    import asyncio

    from planner.prometheus import PrometheusTraffic

    s, prometheus = observed
    wait_until(lambda: _up_targets(prometheus).get("frontend") == "up", 60, "Prometheus to scrape the frontend")
    with httpx.Client(base_url=s.base_url, timeout=30) as client:
        for i in range(6):
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": [100 + i] * 200, "max_tokens": 8,
                                                     "ignore_eos": True, "stream": True})
            assert r.status_code == 200

    async def read() -> dict:
        source = PrometheusTraffic(prometheus)
        try:
            return await source.read(120)
        finally:
            await source.aclose()

    def counted() -> bool:
        sample = asyncio.run(read()).get(MODEL)
        return sample is not None and sample.finished >= 6
    wait_until(counted, 30, "Prometheus to count the requests")
    sample = asyncio.run(read())[MODEL]
    # Over a window, requests that arrived before it may finish in it (and PromQL's increase() extrapolates
    # each series at the window's edges on its own), so neither count bounds the other.
    assert sample.arrived >= 6 and sample.finished >= 6
    assert sample.isl is not None and sample.isl > 0 and sample.osl is not None and sample.osl > 0
    assert sample.ttft_s is not None and sample.ttft_s > 0 and sample.itl_s is not None and sample.itl_s > 0
