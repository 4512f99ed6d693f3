"""Two deployments on ONE Redis, told apart by their namespace alone, share nothing.

Each namespace runs a frontend, one mocker worker, the standalone router and Flower (``sluice serve``,
``sluice worker``, ``sluice router``, ``sluice flower``), side by side on a Redis of this module's own, so
that everything on it belongs to one of the two. While both run and serve a request each:

* every key (SCAN) is under exactly one namespace's prefix ``sluice:{ns}:`` (the Celery broker's own
  keys too, under ``sluice:{ns}:celery:``); :data:`SHARED_KEYS` lists the exceptions, and there are none;
* every pub/sub channel, whether subscribed (``PUBSUB CHANNELS``), subscribed by pattern (kombu's
  event and broadcast channels, seen through MONITOR: Redis lists no patterns) or published to, is
  under one namespace's prefix;
* each namespace's ``GET /workers``, ``celery inspect ping`` and Flower (its workers from remote
  control and from task events, its task list) see their own worker only;
* killing the worker of one namespace and letting its reapers forget it leaves every lasting key of
  the other namespace in place, and the other keeps serving.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import redis

from bench.devstack import RedisServer, Stack, wait_until
from core.keys import Keys
from tests.e2e.conftest import MODEL
from tests.support.ports import free_port

#: Keys that may stand outside every namespace's prefix, each with its reason. None: a key here is a
#: key two deployments would share.
SHARED_KEYS: dict[str, str] = {}
#: Keys of a namespace that come and go while it runs: the reply queues (and their bindings and
#: deadlines) of remote control (Flower's and ``celery inspect``'s), which expire, and kombu's ack
#: emulation of those clients (``unacked*``), emptied as they go; and the routers' candidate tables,
#: each replaced by the next when the workers' loads change.
TRANSIENT = re.compile(r"reply\.celery\.pidbox|_kombu\.binding_deadlines|:celery:unacked|:table:")
#: Pub/sub commands whose arguments are channels or patterns: how many (None: all).
PUBSUB_COMMANDS = {"PUBLISH": 1, "SPUBLISH": 1, "SUBSCRIBE": None, "PSUBSCRIBE": None, "SSUBSCRIBE": None}
#: One quoted argument in a MONITOR line.
MONITOR_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass
class Deployment:
    label: str
    stack: Stack
    worker: str
    router_port: int = field(default_factory=free_port)
    flower_port: int = field(default_factory=free_port)

    @property
    def keys(self) -> Keys:
        return Keys(self.stack.namespace)


class PubSubWatch:
    """Every channel and pattern that any client of the server publishes to or subscribes to, read from
    Redis's MONITOR (one line per command: ``+time [db client] "NAME" "arg" ...``) until :meth:`stop`."""

    def __init__(self, port: int) -> None:
        self.names: set[str] = set()
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.sendall(b"MONITOR\r\n")
        self._file = self._sock.makefile("rb")
        assert self._file.readline() == b"+OK\r\n"
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while line := self._file.readline():  # b"" once stop() shuts the socket down
            name, *args = MONITOR_ARG.findall(line.decode(errors="replace")) or [""]
            if (last := PUBSUB_COMMANDS.get(name.upper(), 0)) != 0:
                self.names.update(args[:last])

    def stop(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self._file.close()
        self._sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def watch(server: RedisServer) -> Iterator[PubSubWatch]:
    w = PubSubWatch(server.port)  # before anything subscribes
    yield w
    w.stop()


@pytest.fixture(scope="module")
def deployments(server: RedisServer, watch: PubSubWatch, tokenizer_dir) -> Iterator[list[Deployment]]:  # noqa: ANN001
    run = uuid.uuid4().hex[:6]
    deps = [Deployment(label, Stack(redis_url=server.url, namespace=f"ns{label}{run}", model_path=tokenizer_dir,
                                    env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1"}), f"w{label}")
            for label in ("a", "b")]
    try:
        for d in deps:
            d.stack.start_worker(d.worker)
            d.stack.start_frontend()
            d.stack.processes.spawn("router", [sys.executable, "-m", "sluice", "router", "--port",
                                               str(d.router_port)], d.stack.env())
            d.stack._spawn("flower", ["flower", "--port", str(d.flower_port)], d.stack.env())
        for d in deps:
            d.stack.wait_ready(MODEL, workers=1)
        yield deps
    finally:
        for d in deps:
            d.stack.stop()


def _get(url: str, **params: str) -> httpx.Response | None:
    try:
        r = httpx.get(url, params=params, timeout=5)
    except httpx.HTTPError:
        return None
    return r if r.status_code == 200 else None


def _chat(d: Deployment) -> str:
    """One chat request through the deployment's frontend; returns its request id."""
    r = httpx.post(f"{d.stack.base_url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": f"Hello from {d.label}"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.headers["x-sluice-worker"] == d.worker
    return r.json()["id"].removeprefix("chatcmpl-")


def _router_workers(d: Deployment) -> set[str]:
    r = _get(f"http://127.0.0.1:{d.router_port}/workers")
    return {w["worker_id"] for w in r.json()["data"]} if r is not None else set()


def _flower_names(payload: object) -> set[str]:
    names = payload if isinstance(payload, dict) else [w["hostname"] for w in payload]  # type: ignore[union-attr]
    return {str(name).split("@")[0] for name in names}


def _flower_workers(d: Deployment) -> tuple[set[str], set[str]]:
    """The workers Flower lists from remote control (``/api/workers``) and from task events (``/workers``)."""
    base = f"http://127.0.0.1:{d.flower_port}"
    by_control = _get(f"{base}/api/workers", refresh="1")
    by_events = _get(f"{base}/workers", json="1")
    return (_flower_names(by_control.json()) if by_control is not None else set(),
            _flower_names(by_events.json()["data"]) if by_events is not None else set())


def _celery_ping(d: Deployment) -> set[str]:
    """``celery -A workers.celery_app inspect ping``, as an operator of the deployment runs it."""
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "workers.celery_app", "inspect", "ping", "--json",
                          "--timeout", "5"], env=d.stack.env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    replies = json.loads(out.stdout.strip().splitlines()[-1])
    return _flower_names(replies)


def _owner(name: str | bytes, deps: list[Deployment]) -> list[str]:
    """The deployments whose namespace prefix ``name`` starts with."""
    text = name.decode(errors="replace") if isinstance(name, bytes) else name
    return [d.label for d in deps if text.startswith(f"{d.keys.prefix}:")]


def _unattributed(names: set[str] | list[bytes], deps: list[Deployment]) -> list[str]:
    """The names that are under no namespace's prefix, or under both."""
    decoded = (n.decode(errors="replace") if isinstance(n, bytes) else n for n in names)
    return sorted(n for n in decoded if len(_owner(n, deps)) != 1)


def test_two_namespaces_on_one_redis_share_nothing(server: RedisServer, watch: PubSubWatch,
                                                   deployments: list[Deployment]) -> None:
    a, b = deployments
    rdb = redis.Redis.from_url(server.url)
    try:
        wait_until(lambda: all(all(d.worker in seen for seen in _flower_workers(d)) for d in deployments), 60,
                   "each Flower to list its own worker, by remote control and by events", interval=0.5)
        ids = {d.label: _chat(d) for d in deployments}

        for d in deployments:
            assert _router_workers(d) == {d.worker}, f"GET /workers of {d.label}"
            assert _celery_ping(d) == {d.worker}, f"celery inspect ping of {d.label}"

        def tasks_listed() -> bool:
            for d in deployments:
                r = _get(f"http://127.0.0.1:{d.flower_port}/api/tasks", limit="1000")
                if r is None or ids[d.label] not in r.json():
                    return False
            return True

        wait_until(tasks_listed, 30, "each Flower to list its own request's task", interval=0.25)
        for d, other in ((a, b), (b, a)):
            tasks = _get(f"http://127.0.0.1:{d.flower_port}/api/tasks", limit="1000").json()  # type: ignore[union-attr]
            assert ids[other.label] not in tasks, f"{d.label}'s Flower lists {other.label}'s task"
            assert {str(t.get("worker")).split("@")[0] for t in tasks.values()} == {d.worker}
            # Both workers have sent heartbeats for seconds: neither Flower has heard the other's.
            by_control, by_events = _flower_workers(d)
            assert other.worker not in by_control | by_events and d.worker in by_events, f"{d.label}'s Flower"

        every_key = list(rdb.scan_iter(count=1000))
        assert {label: any(_owner(k, deployments) == [label] for k in every_key) for label in "ab"} == {
            "a": True, "b": True}
        brokers = [k for k in every_key if k.startswith((a.keys.broker_prefix.encode(), b.keys.broker_prefix.encode()))]
        assert brokers, "the Celery broker's keys are under the namespaces' broker prefixes"
        stray = [k for k in _unattributed(every_key, deployments) if k not in SHARED_KEYS]
        assert stray == [], "keys outside every namespace (or in both)"

        channels = set(rdb.pubsub_channels())
        assert _unattributed(channels, deployments) == []
        assert {tuple(_owner(c, deployments)) for c in channels} == {("a",), ("b",)}  # token and control channels
        published = set(watch.names)
        assert _unattributed(published, deployments) == [], "channels or patterns outside every namespace"
        for d in deployments:  # kombu's event and broadcast channels are there, under each prefix
            ours = [n for n in published if n.startswith(d.keys.broker_prefix)]
            assert any("celeryev" in n for n in ours) and any("celery.pidbox" in n for n in ours), sorted(ours)
    finally:
        rdb.close()


def test_reaping_one_namespaces_worker_leaves_the_other_alone(server: RedisServer,
                                                              deployments: list[Deployment]) -> None:
    a, b = deployments
    rdb = redis.Redis.from_url(server.url)

    def lasting_keys(d: Deployment) -> set[bytes]:
        return {k for k in rdb.scan_iter(match=f"{d.keys.prefix}:*", count=1000)
                if not TRANSIENT.search(k.decode(errors="replace"))}

    try:
        b_before = lasting_keys(b)
        b_bindings = b.keys.broker_binding_sets(b.keys.pool_queue(MODEL, "agg"))
        assert all(k.encode() in b_before for k in b_bindings)  # b's worker queue is bound
        a.stack.kill(a.worker)
        # a's frontend and router reap it: registration, index, its queue and binding.
        wait_until(lambda: not rdb.zscore(a.keys.workers, a.worker)
                   and not any(a.worker in k.decode(errors="replace") for k in lasting_keys(a)), 30,
                   f"{a.label}'s reapers to forget {a.worker}", interval=0.25)
        assert lasting_keys(b) >= b_before, sorted(b_before - lasting_keys(b))
        assert _router_workers(b) == {b.worker}
        _chat(b)
    finally:
        rdb.close()
