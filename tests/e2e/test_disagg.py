"""Disaggregated serving on the mocker, as a user runs it: ``sluice serve`` with a prefill worker
(``SLUICE_POOL=prefill``), a decode worker (``SLUICE_POOL=decode``) and an aggregated worker for
comparison, real ``celery worker`` processes on a private Redis.

What a prefill moved and what the decode worker computed come from the engines' own counters, read
off the token channel (the final delta's usage): ``transferred_tokens`` is what the decode worker
read from the prefill worker instead of computing it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from bench.devstack import Stack, final_delta, wait_until
from core.keys import Keys
from tests.e2e.conftest import MODEL
from tests.e2e.disagg_support import LONG, SHORT, counter, wait_idle

MIN_TOKENS = "512"  # the remote-prefill threshold for these stacks (the default is 2,048)


def _stack(redis_server, tokenizer_dir, prefill_env: dict[str, str]) -> Stack:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"dis{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_DISAGG__MIN_TOKENS": MIN_TOKENS})
    s.start_worker("p1", SLUICE_POOL="prefill", **prefill_env)
    s.start_worker("d1", SLUICE_POOL="decode")
    s.start_worker("a1", SLUICE_POOL="agg")
    s.start_frontend()
    s.wait_ready(MODEL, workers=3)
    return s


@pytest.fixture(scope="module")
def disagg(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    s = _stack(redis_server, tokenizer_dir, {})
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def watcher(redis_server, disagg: Stack) -> Iterator[redis.client.PubSub]:  # noqa: ANN001
    r = redis.Redis.from_url(redis_server.url)
    w = r.pubsub()
    w.psubscribe(f"sluice:{disagg.namespace}:tok:*")
    yield w
    w.close()
    r.close()


def _complete(stack: Stack, prompt: str, router: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "seed": 7, "ignore_eos": True}
    r = httpx.post(f"{stack.base_url}/v1/completions", json=body, headers={"x-sluice-router": router}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_a_long_prompt_is_prefilled_remotely_and_decodes_the_same_tokens(
        disagg: Stack, watcher: redis.client.PubSub, redis_server) -> None:  # noqa: ANN001
    aggregated = _complete(disagg, LONG, "worker_id=a1")
    assert "x-sluice-prefill-worker" not in aggregated.headers
    remote = _complete(disagg, LONG, "worker_id=d1")
    assert remote.headers["x-sluice-prefill-worker"] == "p1" and remote.headers["x-sluice-worker"] == "d1"
    assert remote.json()["choices"][0]["text"] == aggregated.json()["choices"][0]["text"]
    usage = remote.json()["usage"]
    assert usage == {**aggregated.json()["usage"], "prompt_tokens_details": usage.get("prompt_tokens_details")}
    assert usage["completion_tokens"] == 24 and usage["prompt_tokens"] > 1500
    final = final_delta(watcher, remote.json()["id"].removeprefix("cmpl-"))
    assert final is not None and final.worker_id is None  # the decode worker's last delta (seq > 0)
    assert final.usage.transferred_tokens == usage["prompt_tokens"], "the decode worker recomputed the prompt"
    r = redis.Redis.from_url(redis_server.url)
    try:
        wait_idle(r, disagg, "p1", "d1")
    finally:
        r.close()


def test_a_short_prompt_stays_on_the_decode_worker(disagg: Stack) -> None:
    r = _complete(disagg, SHORT, "worker_id=d1")
    assert "x-sluice-prefill-worker" not in r.headers and r.headers["x-sluice-worker"] == "d1"


def test_a_prompt_the_decode_worker_holds_stays_local(disagg: Stack) -> None:
    prompt = LONG.replace("fox", "cat")
    first = _complete(disagg, prompt, "worker_id=d1")
    assert first.headers.get("x-sluice-prefill-worker") == "p1"
    # The decode worker now caches the prompt (the blocks it read entered its cache and the index).
    def local_now() -> bool:
        again = _complete(disagg, prompt, "worker_id=d1")
        return "x-sluice-prefill-worker" not in again.headers and \
            again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 1000
    wait_until(local_now, 10, "the decode worker's cached prompt to keep the prefill local")


def test_usage_and_metrics_report_transferred_tokens_apart_from_cached_ones(disagg: Stack) -> None:
    """A new long prompt prefilled remotely: its usage (a stream's usage chunk) and the frontend's
    ``sluice_transferred_tokens_total`` count the whole prompt as transferred, none as cached. The
    same prompt again stays on the decode worker, which now holds it: cached, nothing transferred.
    The frontend's counters grow by exactly what the responses reported."""
    prompt = "Count the transferred tokens. " + LONG  # no worker holds any block of it
    counters = ("sluice_transferred_tokens_total", "sluice_cached_tokens_total")
    before = {name: counter(disagg, name) for name in counters}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    _, usage, headers = _stream_text(disagg, body, "worker_id=d1")
    assert headers["x-sluice-prefill-worker"] == "p1" and headers["x-sluice-worker"] == "d1"
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "transferred_tokens": usage["prompt_tokens"]}
    reported = [usage]

    def local_now() -> bool:
        again = _complete(disagg, prompt, "worker_id=d1")
        reported.append(again.json()["usage"])
        return "x-sluice-prefill-worker" not in again.headers
    wait_until(local_now, 10, "the decode worker's cached prompt to keep the prefill local")
    details = reported[-1]["prompt_tokens_details"]
    assert details["transferred_tokens"] == 0 and details["cached_tokens"] > 1000, details
    expected = {name: before[name] + sum(u["prompt_tokens_details"][field] for u in reported)
                for name, field in zip(counters, ("transferred_tokens", "cached_tokens"), strict=True)}
    wait_until(lambda: {name: counter(disagg, name) for name in counters} == expected, 10,
               f"the frontend's token counters to reach {expected}")


def test_disagg_can_be_turned_off_or_forced_per_request(disagg: Stack) -> None:
    assert "x-sluice-prefill-worker" not in _complete(disagg, LONG + " off", "worker_id=d1, disagg=off").headers
    forced = _complete(disagg, SHORT + " on", "worker_id=d1, disagg=on")
    assert forced.headers["x-sluice-prefill-worker"] == "p1"
    bad = httpx.post(f"{disagg.base_url}/v1/completions", json={"model": MODEL, "prompt": "x"},
                     headers={"x-sluice-router": "disagg=maybe"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-sluice-router"


@pytest.fixture(scope="module")
def slow(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    """A prefill worker 50x slower than the timing model: prompts take seconds to compute."""
    s = _stack(redis_server, tokenizer_dir, {"SLUICE_WORKER__MOCKER__SPEEDUP": "0.02"})
    try:
        yield s
    finally:
        s.stop()


def test_a_client_that_leaves_during_the_prefill_cancels_it_on_the_prefill_worker(
        slow: Stack, redis_server) -> None:  # noqa: ANN001
    """The client hangs up while the prompt is being computed. The prefill worker aborts it (its
    last delta says so), no decode task is pushed, and both workers' KV blocks go back to idle."""
    s = slow
    r = redis.Redis.from_url(redis_server.url)
    w = r.pubsub()
    w.psubscribe(f"sluice:{s.namespace}:tok:*")
    try:
        body = {"model": MODEL, "prompt": LONG * 3, "max_tokens": 64, "stream": True}
        with httpx.stream("POST", f"{s.base_url}/v1/completions", json=body, timeout=30,
                          headers={"x-sluice-router": "worker_id=d1"}) as resp:
            assert resp.status_code == 200 and resp.headers["x-sluice-prefill-worker"] == "p1"
            # Hang up before any token: the prefill is still running on p1.
        # The prefill worker's last delta for the request (its id never reached the client): its abort.
        final = final_delta(w, None, timeout=30)
        assert final is not None and final.finish_reason == "abort" and final.worker_id == "p1", final
        def p1_idle() -> bool:
            load = r.hgetall(f"sluice:{s.namespace}:load:p1")
            return load.get(b"running") == b"0" and load.get(b"waiting") == b"0"
        wait_until(p1_idle, 10, "p1 to drop the cancelled prefill")
        keys = Keys(s.namespace)
        assert r.llen(keys.broker_queue_list(keys.worker_queue("d1"))) == 0, "a decode task was pushed for a cancelled request"
        wait_idle(r, s, "p1", "d1")
    finally:
        w.close()
        r.close()


def test_pools_show_in_ready_and_models(disagg: Stack) -> None:
    ready = httpx.get(f"{disagg.base_url}/ready", timeout=10).json()
    assert ready["pools"] == {MODEL: {"prefill": 1, "decode": 1, "agg": 1}}
    models = httpx.get(f"{disagg.base_url}/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["pools"]) for m in models] == [(MODEL, {"prefill": 1, "decode": 1, "agg": 1})]



# --- Failures: each request still completes, and no KV block stays in use -------------------------

def _stream_text(stack: Stack, body: dict, router: str, on_chunk=None) -> tuple[str, dict, httpx.Headers]:  # noqa: ANN001
    """Stream a completion; ``on_chunk(n)`` runs after the n-th data event (0: the response's
    headers are in, no event yet; a prefill is still running then). Returns the text, the
    usage (from ``stream_options.include_usage``) and the response headers."""
    import orjson

    text, usage, n = "", {}, 0
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{stack.base_url}/v1/completions", json=body, timeout=120,
                      headers={"x-sluice-router": router}) as resp:
        assert resp.status_code == 200, resp.read()
        if on_chunk is not None:
            on_chunk(0)
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            assert "error" not in chunk, chunk
            text += "".join(c["text"] for c in chunk["choices"])
            usage = chunk.get("usage") or usage
            n += 1
            if on_chunk is not None:
                on_chunk(n)
        return text, usage, resp.headers


def _migrations(stack: Stack) -> float:
    return counter(stack, "sluice_request_migrations_total")


@pytest.fixture
def fragile(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    """A slow prefill worker (its prompts take seconds) and two decode workers, owned by one test."""
    s = Stack(redis_url=redis_server.url, namespace=f"frag{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_DISAGG__MIN_TOKENS": MIN_TOKENS})
    try:
        s.start_worker("p1", SLUICE_POOL="prefill", SLUICE_WORKER__MOCKER__SPEEDUP="0.02")
        s.start_worker("d1", SLUICE_POOL="decode")
        s.start_worker("d2", SLUICE_POOL="decode")
        s.start_frontend()
        s.wait_ready(MODEL, workers=3)
        yield s
    finally:
        s.stop()


BODY = {"model": MODEL, "prompt": LONG, "max_tokens": 300, "temperature": 0, "seed": 7, "ignore_eos": True}


def test_a_prefill_worker_killed_mid_prefill_falls_back_to_a_local_prefill(fragile: Stack, redis_server) -> None:  # noqa: ANN001
    """``p1`` is SIGKILLed while it computes the prompt (seconds, at its speed): once its lease ends,
    the request is prefilled on the decode worker it was meant for and completes as it would have."""
    s = fragile
    reference, _, _ = _stream_text(s, BODY, "worker_id=d2, disagg=off")
    text, usage, headers = _stream_text(s, BODY, "worker_id=d1", lambda n: n == 0 and s.kill("p1"))
    assert headers["x-sluice-prefill-worker"] == "p1"
    assert text == reference
    assert usage["completion_tokens"] == 300 and _migrations(s) == 1
    r = redis.Redis.from_url(redis_server.url)
    try:
        wait_idle(r, s, "d1", "d2")
    finally:
        r.close()


def test_a_decode_worker_killed_after_the_hand_off_hands_the_stream_to_another(
        fragile: Stack, redis_server) -> None:  # noqa: ANN001
    """``d1`` is SIGKILLed while it streams the decode: the request continues on ``d2`` from the
    tokens already sent (the prompt and them computed there), token for token what one worker gives,
    and the prefill worker's held blocks are freed."""
    s = fragile
    reference, _, _ = _stream_text(s, BODY, "worker_id=d2, disagg=off")

    def kill_mid_decode(n: int) -> None:
        if n == 20:
            s.kill("d1")

    text, usage, headers = _stream_text(s, BODY, "worker_id=d1", kill_mid_decode)
    assert headers["x-sluice-prefill-worker"] == "p1" and headers["x-sluice-worker"] == "d1"
    assert not s.procs["d1"].alive()
    assert text == reference and usage["completion_tokens"] == 300
    assert _migrations(s) == 1
    r = redis.Redis.from_url(redis_server.url)
    try:
        wait_idle(r, s, "p1", "d2")
    finally:
        r.close()


def test_a_transfer_that_times_out_is_computed_on_the_decode_worker(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    """The decode worker's link is so slow that reading the prompt's KV would outlast the prefill
    worker's hold: the read fails at the hold's end and the decode worker computes the prompt."""
    s = Stack(redis_url=redis_server.url, namespace=f"xfer{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_DISAGG__MIN_TOKENS": MIN_TOKENS})
    r = redis.Redis.from_url(redis_server.url)
    w = r.pubsub()
    w.psubscribe(f"sluice:{s.namespace}:tok:*")
    try:
        s.start_worker("p1", SLUICE_POOL="prefill")
        s.start_worker("d1", SLUICE_POOL="decode", SLUICE_WORKER__MOCKER__TRANSFER_GB_PER_S="0.00001",
                       SLUICE_DISAGG__KV_HOLD_S="1")
        s.start_worker("a1", SLUICE_POOL="agg")
        s.start_frontend()
        s.wait_ready(MODEL, workers=3)
        aggregated = _complete(s, LONG, "worker_id=a1")
        remote = _complete(s, LONG, "worker_id=d1")
        assert remote.headers["x-sluice-prefill-worker"] == "p1"
        assert remote.json()["choices"][0]["text"] == aggregated.json()["choices"][0]["text"]
        final = final_delta(w, remote.json()["id"].removeprefix("cmpl-"))
        assert final is not None and final.usage.transferred_tokens == 0 and final.usage.cached_tokens == 0
        wait_idle(r, s, "p1", "d1")
    finally:
        w.close()
        r.close()
        s.stop()
