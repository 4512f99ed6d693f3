"""Several frontend processes behind one port (``SLUICE_FRONTEND__PROCESSES``), as a user runs
``sluice serve --processes 2``: each process is a whole frontend (its own lease, token subscription and
``/metrics`` port, all found through Prometheus discovery), together they serve every request, and they
end with their supervisor, whether it gets SIGTERM or SIGKILL."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.devstack import Stack, wait_until
from tests.chaos.support import own_stack
from tests.e2e.conftest import MODEL

PROCESSES = 2
REQUESTS = 24


@pytest.fixture(scope="module")
def stack(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, workers=("w1",), SLUICE_WORKER__MOCKER__SPEEDUP="10",
                   SLUICE_FRONTEND__PROCESSES=str(PROCESSES)) as s:
        yield s


def frontend_targets(stack: Stack) -> list[str]:
    """The metrics addresses of the live frontend processes, from Prometheus discovery."""
    groups = httpx.get(f"{stack.base_url}/prometheus/targets", timeout=10).json()
    return sorted(f"http://{t}{g['labels'].get('__metrics_path__', '/metrics')}"
                  for g in groups if g["labels"]["component"] == "frontend" for t in g["targets"])


def frontend_processes(stack: Stack) -> list[psutil.Process]:
    """The supervisor's frontend processes (not multiprocessing's resource tracker beside them)."""
    return [p for p in psutil.Process(stack.procs["frontend"].popen.pid).children()
            if any("spawn_main" in arg for arg in p.cmdline())]


def wait_registered(stack: Stack) -> list[str]:
    wait_until(lambda: len(frontend_targets(stack)) == PROCESSES, 60, f"{PROCESSES} frontend processes registered")
    return frontend_targets(stack)


def finished(url: str) -> float:
    text = httpx.get(url, timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "sluice_requests_total" and s.labels.get("outcome") == "length")


def stream_one(stack: Stack, i: int) -> int:
    """One streamed chat completion on a connection of its own; the tokens it got."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"count to {i}"}], "max_tokens": 8,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    tokens = 0
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{stack.base_url}/v1/chat/completions",
                                                           json=body) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: {") and '"usage":{' in line.replace(" ", ""):
                tokens = httpx.Response(200, content=line[6:]).json()["usage"]["completion_tokens"]
    return tokens


def test_every_process_registers_its_own_metrics_and_together_they_serve_every_request(stack: Stack) -> None:
    assert len(frontend_processes(stack)) == PROCESSES
    urls = wait_registered(stack)
    assert all(not u.startswith(stack.base_url) for u in urls)  # each on a port of its own
    before = sum(finished(u) for u in urls)
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: stream_one(stack, i), range(REQUESTS))) == [8] * REQUESTS
    # Every request was counted once, by the process that served it.
    assert sum(finished(u) for u in urls) - before == REQUESTS
    # A scrape of the shared port answers for one of them.
    assert httpx.get(f"{stack.base_url}/metrics", timeout=10).status_code == 200
    assert httpx.get(urls[0].replace("/metrics", "/other"), timeout=10).status_code == 404


def test_sigterm_to_the_supervisor_ends_every_process(stack: Stack) -> None:
    children = frontend_processes(stack)
    stack.kill("frontend", signal.SIGTERM, alone=True)  # asserts that nothing of its group outlives it
    assert stack.procs["frontend"].popen.returncode == 0
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in children)
    # Their leases go with them: discovery lists no frontend once a new one is the only one.
    stack.start_frontend()
    stack.wait_ready(MODEL, workers=1)
    wait_registered(stack)


def test_a_supervisor_killed_with_sigkill_takes_its_processes_along(stack: Stack) -> None:
    children = frontend_processes(stack)
    assert len(children) == PROCESSES
    stack.kill("frontend", signal.SIGKILL, alone=True)  # the children must end by themselves
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in children)
