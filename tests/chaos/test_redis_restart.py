"""Redis restarts under a running mocker stack (its own private Redis, which keeps nothing on disk):
requests during the outage get 503 with Retry-After, never a 500; streams in flight end with an
error event; once Redis is back, the workers register again by themselves, serve, and rebuild the
prefix index; no process spins while Redis is away."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from bench.devstack import RedisServer, Stack, wait_until
from tests.chaos.support import MODEL, running
from tests.e2e.disagg_support import LONG
from tests.support.ports import free_port


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children that it waited for, from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _flower_workers(port: int) -> set[str]:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/api/workers", params={"refresh": "1"}, timeout=10)
    except httpx.HTTPError:
        return set()
    return {name.split("@")[0] for name in r.json()} if r.status_code == 200 else set()


def _flower_task_state(port: int, request_id: str) -> str | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/api/tasks", params={"limit": "1000"}, timeout=10)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    # The request's task, or (had it moved to another worker) one of its later attempts.
    states = {t.get("state") for tid, t in r.json().items() if tid.split("-r")[0] == request_id}
    return "SUCCESS" if "SUCCESS" in states else None


def _complete(base_url: str, prompt: str, worker: str | None = None) -> httpx.Response:
    headers = {"x-sluice-router": f"worker_id={worker}"} if worker else None
    return httpx.post(f"{base_url}/v1/completions", timeout=30, headers=headers,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0})


def _flower_sees_a_task_of(s: Stack, flower: int, worker: str) -> None:
    """Flower lists a task that ``worker`` ran after the restart as succeeded. A request is sent again
    if its events are not seen within 10 s (one event lost while the worker's event connection comes
    back is Celery's to lose); a worker whose events stopped for good fails after a minute."""
    deadline, sent = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        resp = _complete(s.base_url, f"for Flower {len(sent)}", worker=worker)
        if resp.status_code == 503:  # retryable by contract (Retry-After): a lease renewed late on a busy machine
            time.sleep(0.5)
            continue
        assert resp.status_code == 200, resp.text
        sent.append(resp.json()["id"].removeprefix("cmpl-"))
        try:
            wait_until(lambda: _flower_task_state(flower, sent[-1]) == "SUCCESS", 10,
                       f"Flower to see {worker}'s task", interval=0.5)
        except TimeoutError:
            continue
        print(f"Flower saw {worker}'s task after {len(sent)} request(s)")
        return
    print("flower:", s.procs["flower"].tail(40), f"{worker}:", s.procs[worker].tail(40))
    raise AssertionError(f"Flower saw none of {worker}'s {len(sent)} tasks after the restart")


@pytest.mark.parametrize("outage_s", [0.5, 5.0])
def test_the_platform_survives_a_redis_restart(own_redis: RedisServer, tokenizer_dir, outage_s: float) -> None:  # noqa: ANN001
    s = Stack(redis_url=own_redis.url, namespace=f"rr{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1"})
    try:
        s.start_worker("w1")
        s.start_worker("w2")
        s.start_frontend()
        s.wait_ready(MODEL, workers=2)
        flower = free_port()
        s._spawn("flower", ["flower", "--port", str(flower)], s.env())
        wait_until(lambda: _flower_workers(flower) == {"w1", "w2"}, 60, "Flower to list w1 and w2", interval=0.5)
        assert _complete(s.base_url, LONG).status_code == 200

        # Streams in flight when Redis goes: each ends (an error event), none hangs.
        ended: list[list[str]] = []

        def stream() -> None:
            body = {"model": MODEL, "prompt": "Tell me everything.", "max_tokens": 8000, "ignore_eos": True,
                    "stream": True}
            with httpx.stream("POST", f"{s.base_url}/v1/completions", json=body, timeout=60) as resp:
                assert resp.status_code == 200
                ended.append([line for line in resp.iter_lines() if line])
        # A request in flight that streams nothing: Redis lost under it is a 503 to retry, like one refused.
        whole: list[httpx.Response] = []

        def complete_long() -> None:
            whole.append(httpx.post(f"{s.base_url}/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": "Tell me everything twice.", "max_tokens": 8000, "ignore_eos": True}))
        streams = [threading.Thread(target=stream) for _ in range(4)] + [threading.Thread(target=complete_long)]
        for t in streams:
            t.start()
        wait_until(lambda: s.ready_workers().get(MODEL) == 2, 5, "streams to start")
        time.sleep(0.5)  # let the streams produce tokens
        own_redis._halt()
        down = time.monotonic()

        # During the outage: 503 with Retry-After, never a 500; streams in flight end with an error
        # event and [DONE].
        outage = _complete(s.base_url, "hello")
        refused_in = time.monotonic() - down
        assert outage.status_code == 503, outage.text
        assert outage.headers.get("retry-after") and outage.json()["error"]["code"] == "redis_unavailable"
        for t in streams:
            t.join(30)
        assert len(ended) == 4
        for lines in ended:  # tokens, then an error event and [DONE]
            assert len(lines) > 3 and lines[-1] == "data: [DONE]" and '"error"' in lines[-2], lines[-3:]
            assert '"code":"redis_unavailable"' in lines[-2].replace(" ", ""), lines[-2]
        (cut,) = whole
        assert cut.status_code == 503 and cut.headers.get("retry-after"), cut.text
        assert cut.json()["error"]["code"] == "redis_unavailable"
        if outage_s >= 2:
            wait_until(lambda: httpx.get(f"{s.base_url}/ready", timeout=5).status_code == 503, 5,
                       "/ready to say not ready")
            pids = [s.procs[w].popen.pid for w in ("w1", "w2", "frontend")]
            before = [_cpu_seconds(p) for p in pids]
            time.sleep(2.0)
            used = [_cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
            # Idle, not spinning (a spinning process uses about 2 CPU-seconds in 2 s).
            assert all(u < 0.5 for u in used), f"processes busy while Redis is away: {used} CPU s in 2 s"
        time.sleep(max(0.0, outage_s - (time.monotonic() - down)))

        own_redis.start()  # the same port, no keys
        back = time.monotonic()
        wait_until(lambda: s.ready_workers().get(MODEL) == 2, 30, "both workers registered again")
        print(f"ready after {time.monotonic() - back:.2f}")
        wait_until(lambda: _complete(s.base_url, "hello again").status_code == 200, 30, "a request served again")
        recovered_s = time.monotonic() - back

        # The prefix index was rebuilt: a repeated long prompt finds its cached blocks again.
        def cached() -> bool:
            resp = _complete(s.base_url, LONG + " again")
            if resp.status_code == 503:  # retryable by contract (Retry-After): the directory settling
                return False
            assert resp.status_code == 200, resp.text
            usage = resp.json()["usage"]
            return usage["prompt_tokens_details"]["cached_tokens"] > 1000
        wait_until(cached, 30, "the repeated prompt to be routed to its cached blocks")
        # The streams the outage cut (8,000 tokens each) run on nowhere.
        wait_until(lambda: sum(running(s).values()) == 0, 10, "the cut streams to stop on the workers")
        # Flower, running through the outage, sees both workers and their new tasks again.
        wait_until(lambda: _flower_workers(flower) == {"w1", "w2"}, 30, "Flower to list the workers again",
                   interval=0.5)
        for worker in ("w1", "w2"):
            _flower_sees_a_task_of(s, flower, worker)
        print(f"outage {outage_s} s: first 503 after {refused_in * 1000:.0f} ms; "
              f"served again {recovered_s:.2f} s after Redis came back")
    finally:
        s.stop()
