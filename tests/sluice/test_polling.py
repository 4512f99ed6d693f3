"""``sluice status`` and ``sluice prometheus-targets`` read each part of a deployment where the frontends
keep it (sluice.polling, core.redis_topology): the frontends' leases and the queues on the broker's
Redis, the worker registry and the prefix index on the routing state's. Each layout is tried: one Redis,
the routing state on a Redis of its own, and on a three-node Redis Cluster (keys with hash tags).
The state is written here as the processes write it, each part on its own plane only, so a command
that looked for a part on the wrong Redis would find nothing there."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator

import pytest

from bench.devstack import RedisServer, free_port
from core.redis_topology import RedisPlanes, RedisTopology
from core.settings import RedisSettings, Settings
from router.frontends import FrontendRecord, FrontendRegistry
from router.prefix_index import PrefixIndex
from router.queues import queue_list_keys
from router.registry import Registry, WorkerLoad
from sluice import status, targets
from sluice.polling import redis_names
from tests.router.factories import make_record
from tests.support.redis_topologies import RedisClusterNodes

MODEL = "m"
LAYOUTS = ("together", "apart", "cluster")


@pytest.fixture(scope="module")
def index_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster_nodes() -> Iterator[RedisClusterNodes]:
    with RedisClusterNodes().start() as nodes:
        yield nodes


@pytest.fixture(params=LAYOUTS)
def settings(request: pytest.FixtureRequest, redis_server: RedisServer) -> Settings:
    """A fresh namespace on the session's Redis (the broker), its routing state where the layout puts it."""
    layout = request.param
    index: dict[str, object] = {}
    if layout == "apart":
        index = {"index_url": request.getfixturevalue("index_server").url}
    elif layout == "cluster":
        index = {"index_url": request.getfixturevalue("cluster_nodes").url, "index_cluster": True}
    return Settings(redis=RedisSettings(url=redis_server.url, namespace=f"p{uuid.uuid4().hex[:10]}", **index))


def worker_record(planes: RedisPlanes, worker_id: str, port: int):  # noqa: ANN201
    keys = planes.topology.keys
    return dataclasses.replace(make_record(worker_id, -1, model=MODEL), queue=keys.worker_queue(worker_id),
                               pool_queue=keys.pool_queue(MODEL, "agg"), started_at=time.time(),
                               metrics_url=f"http://127.0.0.1:{port}/metrics")


async def _seed(settings: Settings) -> None:
    """Two live workers with index entries, one frontend, and queued messages, each on its own plane."""
    planes = RedisPlanes.open(RedisTopology.from_settings(settings.redis), "background")
    keys = planes.topology.keys
    registry = Registry(planes.index, keys)
    try:
        for worker_id, port in (("w1", 9101), ("w2", 9102)):
            await registry.register(worker_record(planes, worker_id, port),
                                    WorkerLoad(running=1, total_blocks=1000, updated_at=time.time()), ttl_s=60)
        await planes.index.sadd(keys.kv_worker("w1", MODEL), "00ff", "0100", "0101")
        await FrontendRegistry(planes.broker, keys).renew(FrontendRecord(
            frontend_id="f1", url="http://127.0.0.1:8000", metrics_url="http://127.0.0.1:8000/metrics",
            router_mode="kv", started_at=time.time(), in_flight=2, updated_at=time.time()), ttl_s=60)
        await planes.broker.lpush(queue_list_keys(keys, keys.pool_queue(MODEL, "agg"))[0], b"a", b"b")
        await planes.broker.lpush(queue_list_keys(keys, keys.worker_queue("w2"))[0], b"c")
        assert (await PrefixIndex(planes.index, keys).sizes(["w1"], MODEL)) == {"w1": 3}
    finally:
        await registry.aclose()
        await planes.aclose()


@pytest.fixture
def seeded(settings: Settings) -> Settings:
    asyncio.run(_seed(settings))
    return settings


def test_status_reads_the_registry_and_index_where_they_live_and_the_queues_on_the_broker(
        seeded: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert status.run(seeded, watch_s=None, as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["namespace"] == seeded.redis.namespace
    workers = {w["worker_id"]: w for w in report["workers"]}
    assert set(workers) == {"w1", "w2"}
    assert (workers["w1"]["index_blocks"], workers["w2"]["index_blocks"]) == (3, 0)
    assert (workers["w1"]["queue_messages"], workers["w2"]["queue_messages"]) == (0, 1)
    assert workers["w1"]["running"] == 1 and workers["w1"]["kv_blocks_total"] == 1000
    [model] = report["models"]
    assert model == {"model": MODEL, "workers": 2, "pools": {"agg": {"workers": 2, "queue_messages": 2}},
                     "running": 2, "waiting": 0, "queued": 3, "index_blocks": 3}
    assert [f["frontend_id"] for f in report["frontends"]] == ["f1"] and report["in_flight"] == 2


def test_prometheus_targets_lists_workers_from_the_registry_and_frontends_from_the_broker(
        seeded: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert targets.run(seeded, output=None, watch_s=None) == 0
    groups = json.loads(capsys.readouterr().out)
    assert [(g["labels"]["component"], g["targets"]) for g in groups] == [
        ("frontend", ["127.0.0.1:8000"]), ("worker", ["127.0.0.1:9101"]), ("worker", ["127.0.0.1:9102"])]
    assert {g["labels"]["sluice_namespace"] for g in groups} == {seeded.redis.namespace}


@pytest.mark.parametrize("command", ["status", "prometheus-targets"])
def test_an_unreachable_routing_state_fails_the_command_and_names_both_redis(
        redis_server: RedisServer, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    index_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings = Settings(redis=RedisSettings(url=redis_server.url, index_url=index_url, namespace="nowhere"))
    if command == "status":
        code = status.run(settings, watch_s=None, as_json=True)
    else:
        code = targets.run(settings, output=None, watch_s=None)
    assert code == 1
    err = capsys.readouterr().err
    assert f"cannot read {redis_server.url} (broker) or {index_url} (routing state)" in err


def test_redis_names() -> None:
    one = RedisTopology.from_settings(RedisSettings(url="redis://b:6379/0"))
    assert redis_names(one) == "redis://b:6379/0"
    cluster = RedisTopology.from_settings(RedisSettings(url="redis://b:6379/0", index_url="redis://c:7000",
                                                        index_cluster=True))
    assert redis_names(cluster) == "redis://b:6379/0 (broker) or redis://c:7000 (routing state, Redis Cluster)"
