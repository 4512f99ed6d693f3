"""A worker SIGKILLed under 32 streams: every stream completes, token for token what an undisturbed
run gives (the deterministic mocker, greedy), each with one usage carrying the true totals."""

from __future__ import annotations

import concurrent.futures

from tests.chaos.support import MODEL, client_of, migrations, own_stack

STREAMS = 32
MAX_TOKENS = 300


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
            its = {i: iter(_open(client, i)) for i in range(STREAMS)}
            heads = {i: [next(its[i]) for _ in range(2)] for i in range(STREAMS)}
            s.kill("w1")
            results = list(pool.map(lambda i: _run(client, i, heads, its), range(STREAMS)))
        for i, (text, usages, finish) in enumerate(results):
            ref_text, (ref_usage,), _ = reference[i]
            assert text == ref_text, f"stream {i} differs after the kill"
            assert finish == ["length"]
            assert len(usages) == 1 and usages[0].completion_tokens == MAX_TOKENS
            assert usages[0].prompt_tokens == ref_usage.prompt_tokens
        assert migrations(s) >= STREAMS // 4  # round robin put about half of them on w1
