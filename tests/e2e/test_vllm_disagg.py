"""Disaggregated serving on the real model: a vLLM prefill worker and a vLLM decode worker whose
KV moves over vLLM's NixlConnector (NIXL over UCX on loopback), behind ``sluice serve``.

What the decode worker read instead of computing is vLLM's own count (``transferred_tokens`` in the
decode worker's usage: the prompt tokens vLLM did not compute there, less its own prefix hit), and
idle KV is vLLM's own KV-cache usage (the workers' load records). The module's last test kills the
prefill worker. A prefill worker killed during the prefill is left to the mocker's module
(tests/e2e/test_disagg.py): the decode worker then computes the prompt itself, which the first test
checks on vLLM (``disagg=off``), and one engine start less keeps this suite shorter.

Run in the vLLM environment: ``.venv-vllm/bin/python -m pytest -m vllm tests/e2e/test_vllm_disagg.py``.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from bench.devstack import Stack, final_delta, wait_until
from core.keys import Keys
from core.messages import ControlCommand, encode_control
from tests.e2e.disagg_support import LONG, busy, counter, wait_idle
from tests.workers.vllm_support import MODEL, VLLM_SKIP, smollm2_weights_dir

pytestmark = [pytest.mark.vllm, VLLM_SKIP]

START_TIMEOUT_S = 400
#: About 900 tokens: above the disaggregation threshold (512), and half of LONG's prefill time on the
#: one thread each worker has here. The cancellation test keeps a prompt four times as long.
PROMPT = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(60))
#: As long, with no block in common with PROMPT: the first transfer of the module (_open_the_transfer_connection).
OPENER = " ".join(f"row {i}: a slow grey owl sleeps under the old stone bridge." for i in range(60))


@pytest.fixture(scope="module")
def pd(redis_server) -> Iterator[Stack]:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"vpd{uuid.uuid4().hex[:8]}", model_path=smollm2_weights_dir(),
              env_extra={"SLUICE_ENGINE": "vllm", "SLUICE_WORKER__VLLM__MAX_NUM_SEQS": "4",
                         "SLUICE_WORKER__VLLM__KV_CACHE_GIB": "0.5", "SLUICE_WORKER__VLLM__OMP_THREADS": "1",
                         # The prefill worker holds the blocks until the decode worker read them,
                         # or this long: a loaded machine's decode worker may start a read late.
                         "SLUICE_DISAGG__MIN_TOKENS": "512", "SLUICE_DISAGG__KV_HOLD_S": "60",
                         # A prefill here takes tens of seconds on one thread, and the frontend's
                         # stall clock still counts a prefill as silence.
                         "SLUICE_FRONTEND__STALL_TIMEOUT_S": "240"})
    try:
        s.start_worker("p1", SLUICE_POOL="prefill")
        # A long lease: the transfer-failure test freezes d1 for the length of a prefill.
        s.start_worker("d1", SLUICE_POOL="decode", SLUICE_WORKER__LEASE_TTL_S="120")
        s.start_frontend()
        s.wait_ready(MODEL, workers=2, timeout=START_TIMEOUT_S)
        yield s
    finally:
        s.stop()


def _logs(stack: Stack, what: object, *names: str) -> str:
    """``what``, then the last lines each named process logged (what a failed assertion shows)."""
    return "\n".join([str(what), *(f"--- {n}:\n{stack.processes.procs[n].tail(60)}" for n in names)])


def _prefill_seen(stack: Stack) -> None:
    """Until the frontend's worker snapshot holds the prefill worker. A machine starved of CPU (p1 still
    computing a prefill the test before cancelled, on two cores) can hold a worker's heartbeat past its
    lease; the frontend then rightly computes prompts on the decode worker until the worker renews it,
    and a test of the disaggregated path must not start in that moment."""
    def seen() -> bool:
        try:
            body = httpx.get(f"{stack.base_url}/ready", timeout=2).json()
        except httpx.HTTPError:
            return False
        return body.get("pools", {}).get(MODEL, {}).get("prefill", 0) >= 1
    wait_until(seen, 30, "the frontend to see the prefill worker")


def _prefilled_on_p1(stack: Stack, resp: httpx.Response) -> None:
    assert resp.status_code == 200 and resp.headers.get("x-sluice-prefill-worker") == "p1", _logs(
        stack, f"{resp.status_code}, prefill computed where {resp.headers.get('x-sluice-disagg-reason')!r} put it",
        *stack.processes.procs)


@pytest.fixture
def r(redis_server) -> Iterator[redis.Redis]:  # noqa: ANN001
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def _complete(stack: Stack, prompt: str, router: str, max_tokens: int = 16) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    try:  # shorter than the test's own timeout, so that a hang shows the processes' logs
        resp = httpx.post(f"{stack.base_url}/v1/completions", json=body, headers={"x-sluice-router": router},
                          timeout=150)
    except httpx.TimeoutException as exc:
        raise AssertionError(_logs(stack, f"no answer in 150 s: {exc!r}", *stack.processes.procs)) from exc
    assert resp.status_code == 200, _logs(stack, resp.text, *stack.processes.procs)
    return resp


def _clear_cache(r: redis.Redis, stack: Stack, worker: str) -> None:
    """Empty the worker's prefix cache (its control channel) and wait until the index says so."""
    keys = Keys(stack.namespace)
    r.publish(keys.control_channel(worker), encode_control(ControlCommand("clear_kv")))
    wait_until(lambda: r.scard(keys.kv_worker(worker)) == 0, 20, f"{worker}'s cache to be cleared")


#: Openers tried before the module gives up on opening the NIXL connection.
OPENER_TRIES = 4


def _open_the_transfer_connection(stack: Stack, r: redis.Redis) -> None:
    """The first transfer between two engines opens their NIXL connection. vLLM's handshake gives up after
    a fixed 5 s, and the request then computes its prompt on the decode worker: the same text, nothing
    transferred. That happens when the prefill worker is starved of CPU (on a fresh clone it failed twice
    in a row, the opener's and the next request's). Requests with prompts of their own (no block in
    common with PROMPT, nor with each other) take that chance until one transfers, so the checks after
    it test the transfer, not the handshake's timing."""
    for attempt in range(OPENER_TRIES):
        before = counter(stack, "sluice_transferred_tokens_total")
        _complete(stack, f"attempt {attempt}. {OPENER}", "worker_id=d1", max_tokens=2)
        wait_idle(r, stack, "p1", "d1", timeout=30)
        deadline = time.monotonic() + 10  # the frontend counts the request as it closes it
        while time.monotonic() < deadline:
            if counter(stack, "sluice_transferred_tokens_total") > before:
                return
            time.sleep(0.1)
    raise AssertionError(f"no transfer between p1 and d1 in {OPENER_TRIES} tries: vLLM's NIXL handshake kept failing")


def test_greedy_output_is_identical_and_the_decode_worker_reads_the_prompt(pd: Stack, r: redis.Redis) -> None:
    _open_the_transfer_connection(pd, r)
    transferred_before = counter(pd, "sluice_transferred_tokens_total")
    w = r.pubsub()
    w.psubscribe(f"sluice:{pd.namespace}:tok:*")
    try:
        remote = _complete(pd, PROMPT, "worker_id=d1")
        assert remote.headers["x-sluice-prefill-worker"] == "p1" and remote.headers["x-sluice-worker"] == "d1"
        final = final_delta(w, remote.json()["id"].removeprefix("cmpl-"), timeout=30)
    finally:
        w.close()
    usage = remote.json()["usage"]
    assert usage["prompt_tokens"] >= 800 and usage["completion_tokens"] == 16, _logs(pd, usage, "p1", "d1")
    assert final is not None and final.usage is not None
    # vLLM on the decode worker computed no prompt token: all of them came over NIXL.
    assert final.usage.transferred_tokens == usage["prompt_tokens"], _logs(pd, final.usage, "p1", "d1")
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "transferred_tokens": usage["prompt_tokens"]}
    wait_until(lambda: counter(pd, "sluice_transferred_tokens_total") - transferred_before == usage["prompt_tokens"], 10,
               "the frontend to count the transferred tokens")
    wait_idle(r, pd, "p1", "d1", timeout=30)  # p1's held blocks freed once read

    _clear_cache(r, pd, "d1")
    local = _complete(pd, PROMPT, "worker_id=d1, disagg=off")
    assert "x-sluice-prefill-worker" not in local.headers
    assert local.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "transferred_tokens": 0}  # computed
    assert remote.json()["choices"][0]["text"] == local.json()["choices"][0]["text"]


def test_a_client_that_leaves_during_the_prefill_cancels_it_on_the_prefill_worker(
        pd: Stack, r: redis.Redis) -> None:
    keys = Keys(pd.namespace)
    body = {"model": MODEL, "prompt": LONG.replace("fox", "owl") * 2, "max_tokens": 16, "stream": True}
    _prefill_seen(pd)
    with httpx.stream("POST", f"{pd.base_url}/v1/completions", json=body, timeout=60,
                      headers={"x-sluice-router": "worker_id=d1"}) as resp:
        _prefilled_on_p1(pd, resp)
        wait_until(lambda: busy(r, pd, "p1"), 30, "p1 to take the prefill")
    hung_up = time.monotonic()
    wait_idle(r, pd, "p1", "d1", timeout=20)
    # Well before the prefill would have ended (a 3,400-token prompt takes tens of seconds here).
    assert time.monotonic() - hung_up < 10
    assert r.llen(keys.broker_queue_list(keys.worker_queue("d1"))) == 0, "a decode task was pushed for a cancelled request"


def test_a_transfer_that_fails_is_computed_on_the_decode_worker(pd: Stack, r: redis.Redis) -> None:
    """The prefill worker dies after handing the request off and before the decode worker read its
    KV (the decode worker is frozen meanwhile): vLLM's read fails, the decode worker recomputes the
    prompt (``kv_load_failure_policy="recompute"``), and the client gets the text one worker gives.
    Runs last: it kills p1."""
    prompt = PROMPT.replace("fox", "elk")
    reference = _complete(pd, prompt, "worker_id=d1, disagg=off").json()["choices"][0]["text"]
    _clear_cache(r, pd, "d1")  # blocks d1 holds would not be read: nothing to fail
    import orjson

    w = r.pubsub()
    w.psubscribe(f"sluice:{pd.namespace}:tok:*")
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True}
    texts: list[str] = []
    request_id = ""
    _prefill_seen(pd)
    try:
        with httpx.stream("POST", f"{pd.base_url}/v1/completions", json=body, timeout=300,
                          headers={"x-sluice-router": "worker_id=d1, disagg=on"}) as resp:
            _prefilled_on_p1(pd, resp)
            wait_until(lambda: busy(r, pd, "p1"), 60, "p1 to take the prefill")
            pd.signal("d1", signal.SIGSTOP)  # the prefill takes seconds: d1 stops well before the hand-off
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    chunk = orjson.loads(line[6:])
                    assert "error" not in chunk, chunk
                    texts.append("".join(c["text"] for c in chunk["choices"]))
                    if len(texts) == 1:  # the first token, from p1: the decode task is on d1's queue
                        request_id = chunk["id"].removeprefix("cmpl-")
                        pd.kill("p1")
                        pd.signal("d1", signal.SIGCONT)
        final = final_delta(w, request_id, timeout=30)
    finally:
        pd.signal("d1", signal.SIGCONT)
        w.close()
    assert "".join(texts) == reference
    assert final is not None and final.usage is not None
    assert final.usage.transferred_tokens == 0, final.usage  # read nothing: computed the prompt
    wait_idle(r, pd, "d1", timeout=30)
