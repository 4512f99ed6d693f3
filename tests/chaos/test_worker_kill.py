"""A worker SIGKILLed under 32 streams: every stream completes, token for token what an undisturbed
run gives (the deterministic mocker, greedy), each with one usage carrying the true totals."""

from __future__ import annotations

import concurrent.futures

import httpx
import orjson

from tests.chaos.support import MODEL, client_of, migrations, own_stack

STREAMS = 32
#: Long enough that no stream ends between its start and the kill, even on a busy machine.
MAX_TOKENS = 500


def _run(client, i: int, heads: dict[int, list] | None = None, its: dict | None = None):  # noqa: ANN001, ANN202
    if its is not None:
        it = its[i]
        chunks = [*heads[i], *it]
    else:
        chunks = list(_open(client, i))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usages = [c.usage for c in chunks if c.usage is not None]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return text, usages, finish


def _open(client, i: int):  # noqa: ANN001, ANN202
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Story number {i}, please."}], max_tokens=MAX_TOKENS,
        stream=True, temperature=0, extra_body={"ignore_eos": True}, stream_options={"include_usage": True})


def test_32_streams_survive_a_worker_sigkill_token_exactly(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir) as s:
        client = client_of(s)
        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            reference = list(pool.map(lambda i: _run(client, i), range(STREAMS)))
            # All opened and started at once: opened one after another on a busy machine, the first ones
            # could end before the kill and never need to move.
            its = dict(enumerate(pool.map(lambda i: iter(_open(client, i)), range(STREAMS))))
            heads = dict(enumerate(pool.map(lambda i: [next(its[i]) for _ in range(2)], range(STREAMS))))
            s.kill("w1")
            results = list(pool.map(lambda i: _run(client, i, heads, its), range(STREAMS)))
        for i, (text, usages, finish) in enumerate(results):
            ref_text, (ref_usage,), _ = reference[i]
            assert text == ref_text, f"stream {i} differs after the kill"
            assert finish == ["length"]
            assert len(usages) == 1 and usages[0].completion_tokens == MAX_TOKENS
            assert usages[0].prompt_tokens == ref_usage.prompt_tokens
        assert migrations(s) >= STREAMS // 4  # round robin put about half of them on w1


def _pinned_stream(base_url: str, router: str) -> tuple[httpx.Client, httpx.Response]:
    client = httpx.Client(base_url=base_url, timeout=60)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me everything."}], "max_tokens": 2000,
            "stream": True, "temperature": 0, "ignore_eos": True}
    resp = client.send(client.build_request("POST", "/v1/chat/completions", json=body,
                                            headers={"x-sluice-router": router}), stream=True)
    assert resp.status_code == 200
    return client, resp


def test_a_request_past_its_migration_limit_ends_with_a_clear_error(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    """``max_migrations=0`` on one request: its worker's death ends it with a ``migration_limit`` error
    event, while a request beside it on the same worker, with the deployment's limit, moves on."""
    with own_stack(redis_server.url, tokenizer_dir) as s:
        opened = [_pinned_stream(s.base_url, "worker_id=w1, max_migrations=0"), _pinned_stream(s.base_url, "worker_id=w1")]
        lines = [resp.iter_lines() for _, resp in opened]
        for it in lines:
            assert next(line for line in it if line.startswith("data: "))
        s.kill("w1")
        limited, moved = ([orjson.loads(e) for e in _data(it)[:-1]] for it in lines)
        error = limited[-1]["error"]
        assert error["code"] == "migration_limit" and "0 of 0" in error["message"], error
        assert moved[-1]["choices"][0]["finish_reason"] == "length" and not any("error" in c for c in moved)
        for client, _ in opened:
            client.close()
        assert migrations(s) == 1


def _data(lines) -> list[str]:  # noqa: ANN001
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return events
