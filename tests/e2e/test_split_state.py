"""The routing state apart from the broker, end to end: ``sluice serve`` in ``kv`` mode and two ``sluice
worker`` (mocker) subprocesses with ``SLUICE_INDEX_REDIS_URL`` set, the Celery broker on the session's
Redis. Each test runs on two layouts: the routing state on a Redis of its own, and on a three-node Redis
Cluster (``SLUICE_REDIS__INDEX_CLUSTER=1``, keys with hash tags: core.keys).

What it shows, through HTTP and by reading both Redis: requests stream and complete; a repeated long
prompt goes to the worker that holds its blocks and reports them cached; every routing key (registry,
prefix index, in-flight sums) is on the index Redis and none on the broker, whose keys are the Celery
queues' and the frontends'; ``sluice status`` and ``sluice prometheus-targets`` see the workers; a worker
killed with SIGKILL is reaped from the index's registry and its queue from the broker, its stream moves
to the other worker, and requests keep succeeding there.

Every wait polls a condition (the index holds the blocks, the workers are idle, the worker is reaped);
no assertion depends on how fast anything runs. The last test kills a worker: it must stay last.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from bench.devstack import REPO, RedisServer, wait_until
from tests.e2e.conftest import MODEL
from tests.support.routing_state import chat as routing_chat
from tests.support.routing_state import wait_workers_idle
from tests.support.split_state import LAYOUTS, SplitDeployment, assert_routing_state_apart, bound, split_deployment

WORKERS = ("s1", "s2")
SURVIVOR, VICTIM = WORKERS
BLOCK = 16  # the mocker's default block size
HEARTBEAT_S = 0.1
REFRESH_S = 0.05
SYSTEM = ("You are the archivist of a river authority. Quote the register entry of every lock you mention, "
          "give its keeper's name when the register has one, and never guess a date that is not written. ") * 5


@pytest.fixture(scope="module", params=LAYOUTS)
def deployment(request: pytest.FixtureRequest, redis_server: RedisServer,
               tokenizer_dir) -> Iterator[SplitDeployment]:  # noqa: ANN001
    env = {"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_ROUTER_MODE": "kv",
           "SLUICE_WORKER__HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S), "SLUICE_ROUTER__REGISTRY_REFRESH_S": str(REFRESH_S)}
    with split_deployment(request.param, redis_server.url, tokenizer_dir, MODEL, {w: {} for w in WORKERS},
                          env) as d:
        yield d


def index_blocks(d: SplitDeployment, worker: str) -> int:
    return d.index_blocks(worker, MODEL)


def wait_idle(d: SplitDeployment, workers: tuple[str, ...] = WORKERS) -> None:
    """Until the workers are idle on the index Redis and the frontend's snapshot has taken it in."""
    wait_workers_idle(d.index, d.keys, MODEL, workers, REFRESH_S)


def chat(client: openai.OpenAI, messages: list[dict], **kw: object) -> tuple[str, str, int, int]:
    return routing_chat(client, MODEL, messages, **kw)


def stream(client: openai.OpenAI, messages: list[dict], max_tokens: int, worker: str | None = None) -> openai.Stream:
    pin = {"x-sluice-router": f"worker_id={worker}"} if worker else {}
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, stream=True,
                                          temperature=0, seed=5, stream_options={"include_usage": True},
                                          extra_body={"ignore_eos": True}, extra_headers=pin)


def text_of(chunks: list) -> str:  # noqa: ANN001
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def cli(d: SplitDeployment, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "sluice", *args], cwd=REPO, env=d.stack.env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_requests_stream_and_complete_on_each_worker(deployment: SplitDeployment) -> None:
    client = deployment.client()
    for worker in WORKERS:
        chunks = list(stream(client, [{"role": "user", "content": f"Count the locks, {worker}."}], 24, worker))
        assert text_of(chunks)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
        assert chunks[-1].usage.completion_tokens == 24 and chunks[-1].usage.prompt_tokens > 0


def test_a_repeated_long_prompt_goes_to_the_worker_that_holds_it(deployment: SplitDeployment) -> None:
    """Three conversations, each routed once, then continued: every follow-up lands on the worker whose
    KV events put the first turn's blocks in the index Redis, and its engine reports them cached (a worker
    without them could not)."""
    client = deployment.client()
    conversations = [[{"role": "system", "content": f"Register {uuid.uuid4().hex} volume {i}. " + SYSTEM},
                      {"role": "user", "content": f"Which keeper held lock number {40 + i}?"}] for i in range(3)]
    first: list[tuple[str, int]] = []
    wait_idle(deployment)
    for messages in conversations:
        worker, reply, prompt_tokens, _ = chat(client, messages)
        assert worker in WORKERS and prompt_tokens >= 8 * BLOCK
        messages.append({"role": "assistant", "content": reply})
        first.append((worker, prompt_tokens))
    for worker in {w for w, _ in first}:
        least = min(p for w, p in first if w == worker) // BLOCK
        wait_until(lambda w=worker, n=least: index_blocks(deployment, w) >= n, 30, f"the index to list {worker}'s blocks")
    for messages, (worker, prompt_tokens) in zip(conversations, first, strict=True):
        messages.append({"role": "user", "content": "And who followed him?"})
        wait_idle(deployment)  # the last request's load must not outweigh the cached prefix
        again, _, _, cached = chat(client, messages)
        assert again == worker
        assert cached >= prompt_tokens // BLOCK * BLOCK and cached % BLOCK == 0


def test_routing_keys_are_on_the_index_redis_and_queues_on_the_broker(deployment: SplitDeployment) -> None:
    d = deployment
    chat(d.client(), [{"role": "user", "content": "Name the oldest lock. " * 20}])  # some index blocks, at least
    wait_until(lambda: any(index_blocks(d, w) for w in WORKERS), 30, "KV events in the index")
    assert_routing_state_apart(d, MODEL, {w: "agg" for w in WORKERS})


def test_status_and_prometheus_targets_see_the_workers_on_the_index_redis(deployment: SplitDeployment) -> None:
    d = deployment
    wait_until(lambda: any(index_blocks(d, w) for w in WORKERS), 30, "KV events in the index")
    status = json.loads(cli(d, "status", "--json"))
    workers = {w["worker_id"]: w for w in status["workers"]}
    assert set(workers) == set(WORKERS)
    assert {w: workers[w]["index_blocks"] for w in WORKERS} == {w: index_blocks(d, w) for w in WORKERS}
    assert all(workers[w]["state"] == "live" and workers[w]["kv_blocks_total"] > 0 for w in WORKERS)
    [frontend] = status["frontends"]
    assert frontend["url"] == d.stack.base_url and frontend["router_mode"] == "kv"
    groups = json.loads(cli(d, "prometheus-targets"))
    assert groups == httpx.get(f"{d.stack.base_url}/prometheus/targets", timeout=10).json()
    assert sorted(g["labels"].get("worker", "") for g in groups) == ["", *WORKERS]


def test_a_killed_worker_is_reaped_from_the_index_and_requests_go_on(deployment: SplitDeployment) -> None:
    """Runs last: it kills a worker of the module's stack."""
    d, k = deployment, deployment.keys
    client = d.client()
    cached_on_victim = [{"role": "system", "content": f"Ledger {uuid.uuid4().hex}. " + SYSTEM},
                        {"role": "user", "content": "Read me the first entry."}]
    worker, _, prompt_tokens, _ = chat(client, cached_on_victim, extra_headers={"x-sluice-router": f"worker_id={VICTIM}"})
    assert worker == VICTIM
    wait_until(lambda: index_blocks(d, VICTIM) >= prompt_tokens // BLOCK, 30, "the victim's blocks in the index")
    assert bound(d.broker, k, k.pool_queue(MODEL, "agg"), k.worker_queue(VICTIM))

    question = [{"role": "user", "content": "Tell me everything about the weir."}]
    reference = text_of(list(stream(client, question, 200, SURVIVOR)))
    it = iter(stream(client, question, 200, VICTIM))
    head = [next(it) for _ in range(3)]
    d.stack.kill(VICTIM)
    # The victim's lease ends, and the stream continues on the survivor from the tokens already sent.
    assert text_of([*head, *it]) == reference

    def reaped() -> bool:
        return (d.index.zscore(k.workers, VICTIM) is None and not d.index.exists(k.worker(VICTIM))
                and not d.index.hexists(k.worker_queues, VICTIM) and not d.index.exists(k.kv_worker(VICTIM, MODEL))
                and VICTIM.encode() not in d.index.hvals(k.kv_slot_owners_of(MODEL))
                and VICTIM.encode() not in d.index.hvals(k.slots)
                and not bound(d.broker, k, k.pool_queue(MODEL, "agg"), k.worker_queue(VICTIM)))

    wait_until(reaped, 30, f"the reaper to forget {VICTIM} on the index Redis and its queue on the broker")
    assert d.index.zscore(k.workers, SURVIVOR) is not None
    wait_until(lambda: d.stack.ready_workers().get(MODEL) == 1, 10, "/ready to drop the dead worker")
    for i in range(4):
        messages = cached_on_victim if i == 0 else [{"role": "user", "content": f"Lock {i}: open or closed?"}]
        served, reply, _, _ = chat(client, messages)
        assert served == SURVIVOR and reply
    chunks = list(stream(client, question, 12))
    assert text_of(chunks) and chunks[-1].usage.completion_tokens == 12
