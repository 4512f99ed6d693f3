"""The OpenAI API end to end through uvicorn, Redis, Celery workers and the mocker engine."""

from __future__ import annotations

import concurrent.futures
import signal
import sys
import uuid

import httpx
import openai
import pytest
import redis

from bench.devstack import Stack, free_port, wait_until
from core.keys import Keys
from tests.e2e.conftest import MODEL

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PIN_W1 = {"x-sluice-router": "worker_id=w1"}


def registered_block_size(stack: Stack, worker_id: str) -> int:
    """The KV block size the worker registered (its engine's, not a test's guess)."""
    client = redis.Redis.from_url(stack.redis_url)
    try:
        return int(client.hget(Keys(stack.namespace).worker(worker_id), "block_size"))
    finally:
        client.close()


def unseen(messages: list[dict]) -> list[dict]:
    """``messages`` behind a system message no request has had: the prompt's first block (and so
    every block, the hashes being chained) is new to every worker. Without it the model's default
    system prompt, which fills the first block, would already be cached."""
    return [{"role": "system", "content": f"Session {uuid.uuid4().hex}."}, *messages]


def reused_tokens(prompt_tokens: int, block_size: int) -> int:
    """What an engine reports as cached for a prompt whose every block it holds: its full blocks,
    except that the last prompt token is always computed (vLLM's rule, which the mocker follows)."""
    return (prompt_tokens - 1) // block_size * block_size


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] == 8192


def test_chat_non_streaming(client: openai.OpenAI, stack: Stack) -> None:
    fresh = unseen(QUESTION)
    r = client.chat.completions.create(model=MODEL, messages=fresh, max_tokens=12, temperature=0,
                                       extra_headers=PIN_W1)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant" and choice.message.content
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # a prompt no worker has seen
    again = client.chat.completions.create(model=MODEL, messages=fresh, max_tokens=12, temperature=0,
                                           extra_headers=PIN_W1)
    expected = reused_tokens(r.usage.prompt_tokens, registered_block_size(stack, "w1"))
    assert again.usage.prompt_tokens == r.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens == expected > 0


def test_chat_streaming_matches_non_streaming_and_reports_usage(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_string_is_honoured_across_tokens_and_not_leaked(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40, temperature=0)
    text = full.choices[0].message.content
    assert len(text) > 20
    stop = text[10:16]  # six characters, wherever the token boundaries fall
    cut = text.index(stop)
    for stream in (False, True):
        if stream:
            chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40,
                                                         temperature=0, stop=[stop], stream=True))
            got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][0]
        else:
            r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40, temperature=0, stop=stop)
            got, reason = r.choices[0].message.content, r.choices[0].finish_reason
        assert got == text[:cut] and reason == "stop"


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def ask(seed: int) -> str:
        return client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=1.0,
                                              seed=seed).choices[0].message.content
    assert ask(7) == ask(7)
    assert ask(7) != ask(8)


def test_completions_text_and_token_prompts(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    ids_prompt = client.completions.create(model=MODEL, prompt=[1500, 2500, 3500], max_tokens=5, temperature=0)
    assert ids_prompt.usage.prompt_tokens == 3
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == 8


def test_repeated_long_prompt_reports_cached_tokens(client: openai.OpenAI, stack: Stack) -> None:
    long_q = unseen([{"role": "user", "content": "Tell me about rivers. " * 40}])
    first = client.chat.completions.create(model=MODEL, messages=long_q, max_tokens=4, extra_headers=PIN_W1)
    again = client.chat.completions.create(model=MODEL, messages=long_q, max_tokens=4, extra_headers=PIN_W1)
    assert first.usage.prompt_tokens == again.usage.prompt_tokens > 200
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    expected = reused_tokens(again.usage.prompt_tokens, registered_block_size(stack, "w1"))
    assert again.usage.prompt_tokens_details.cached_tokens == expected >= 192


def test_concurrent_streams_all_complete(client: openai.OpenAI) -> None:
    def one(i: int) -> int:
        chunks = client.chat.completions.create(model=MODEL, max_tokens=10, stream=True,
                                                messages=[{"role": "user", "content": f"question {i}"}])
        return sum(1 for c in chunks if c.choices and c.choices[0].finish_reason == "length")
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert list(pool.map(one, range(32))) == [1] * 32


@pytest.mark.parametrize(("body", "status", "param", "code"), [
    ({"model": "nope", "messages": QUESTION}, 404, "model", "model_not_found"),
    ({"model": MODEL, "messages": QUESTION, "temperature": 5}, 400, "temperature", None),
    ({"model": MODEL, "messages": []}, 400, "messages", None),
    ({"model": MODEL}, 400, "messages", None),
    ({"model": MODEL, "messages": QUESTION, "n": 17}, 400, "n", None),
    ({"model": MODEL, "messages": QUESTION, "max_tokens": 0}, 400, "max_tokens", None),
    ({"model": MODEL, "messages": QUESTION, "max_tokens": 9000}, 400, "max_tokens", "context_length_exceeded"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi " * 9000}]}, 400, "messages",
     "context_length_exceeded"),
    ({"model": MODEL, "messages": QUESTION, "stop": [""]}, 400, "stop", None),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, None, None),
])
def test_bad_requests_get_openai_errors(stack: Stack, body: dict, status: int, param: str | None,
                                        code: str | None) -> None:
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param or (err["param"] or "").startswith(param)
    if code is not None:
        assert err["code"] == code


def test_malformed_json_unknown_route_and_wrong_method(stack: Stack) -> None:
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", content=b"{nope", timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.get(f"{stack.base_url}/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(f"{stack.base_url}/v1/chat/completions", timeout=10)
    assert r.status_code == 405 and "error" in r.json()


def test_bad_completion_prompt_ids(stack: Stack) -> None:
    r = httpx.post(f"{stack.base_url}/v1/completions", json={"model": MODEL, "prompt": [10**7]}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_health_ready_and_metrics(stack: Stack) -> None:
    assert httpx.get(f"{stack.base_url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{stack.base_url}/ready").json()
    assert ready == {"ready": True, "models": {MODEL: 2}, "pools": {MODEL: {"agg": 2}}}
    metrics = httpx.get(f"{stack.base_url}/metrics").text
    assert "sluice_requests_total" in metrics


def test_omitted_sampling_fields_take_the_deployments_defaults(client: openai.OpenAI, stack: Stack) -> None:
    """A second frontend on the same workers whose deployment default is temperature 0: a request
    that names no temperature is then greedy, token for token what temperature 0 gives."""
    port = free_port()
    stack.processes.spawn("frontend-greedy", [sys.executable, "-m", "sluice", "serve", "--port", str(port),
                                              "--log-level", "warning", "--no-banner"],
                          stack.env(SLUICE_FRONTEND__SAMPLING_DEFAULTS='{"temperature": 0}'))
    try:
        greedy = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        wait_until(lambda: _ready(port), 30, "the second frontend")
        asked = greedy.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, seed=5)
        explicit = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0)
        sampled = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, seed=5)
        assert asked.choices[0].message.content == explicit.choices[0].message.content
        assert sampled.choices[0].message.content != explicit.choices[0].message.content  # the model's 0.2
    finally:
        stack.processes.kill("frontend-greedy", signal.SIGTERM)


def test_completions_default_to_openais_16_tokens(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Once upon a time", extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_tokenize_and_detokenize_use_the_served_models_tokenizer(client: openai.OpenAI, stack: Stack) -> None:
    """vLLM's /tokenize and /detokenize: a chat tokenizes to the prompt a chat request is charged for."""
    usage = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1, temperature=0).usage
    chat = httpx.post(f"{stack.base_url}/tokenize", json={"model": MODEL, "messages": QUESTION}, timeout=10).json()
    assert chat["count"] == len(chat["tokens"]) == usage.prompt_tokens and chat["max_model_len"] == 8192
    text = httpx.post(f"{stack.base_url}/tokenize", timeout=10,
                      json={"prompt": "Hello world", "return_token_strs": True}).json()  # the one served model
    assert text["count"] == len(text["token_strs"]) > 0
    back = httpx.post(f"{stack.base_url}/detokenize", json={"model": MODEL, "tokens": text["tokens"]}, timeout=10)
    assert back.json() == {"prompt": "Hello world"}
    bad = httpx.post(f"{stack.base_url}/detokenize", json={"model": MODEL, "tokens": [10**9]}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    unknown = httpx.post(f"{stack.base_url}/tokenize", json={"model": "nope", "prompt": "x"}, timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert httpx.get(f"{stack.base_url}/version", timeout=10).json()["version"]


def test_logit_bias_and_penalties_reach_the_engine(client: openai.OpenAI, stack: Stack) -> None:
    """The mocker weighs bias and penalties like a model (workers.engines.mocker.tokens): +100 forces
    a token, and a frequency penalty then stops it repeating."""
    forced = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0,
                                            logit_bias={"4242": 100}, extra_body={"ignore_eos": True})
    expected = httpx.post(f"{stack.base_url}/detokenize", json={"tokens": [4242] * 6}, timeout=10).json()["prompt"]
    assert forced.choices[0].message.content == expected
    mild = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0,
                                          logit_bias={"4242": 9}, frequency_penalty=2,
                                          extra_body={"ignore_eos": True, "repetition_penalty": 1.0, "top_k": 4,
                                                      "min_p": 0.1})
    assert mild.choices[0].message.content != expected
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", timeout=10,
                   json={"model": MODEL, "messages": QUESTION, "logit_bias": {"99999999": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def test_n_choices_streamed_interleaved_and_whole(client: openai.OpenAI, stack: Stack) -> None:
    """n = 3: three choices with their own index and seed, the prompt counted once in usage; the
    streamed choices, read by index, give the same texts."""
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 12, "n": 3, "temperature": 0.7, "seed": 11,
           "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**ask)
    single = client.chat.completions.create(**{**ask, "n": 1})
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) == 3 and texts[0] == single.choices[0].message.content  # choice 0 keeps the seed
    assert whole.usage.prompt_tokens == single.usage.prompt_tokens and whole.usage.completion_tokens == 36
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    streamed = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(3)}
    assert [streamed[i] for i in range(3)] == texts
    finishes = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason == "length")
    assert finishes == [0, 1, 2] and chunks[-1].usage.completion_tokens == 36
    too_many = httpx.post(f"{stack.base_url}/v1/chat/completions", timeout=10,
                          json={"model": MODEL, "messages": QUESTION, "n": 100})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"


def test_logprobs_in_openais_shapes_streamed_and_whole(client: openai.OpenAI) -> None:
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 10, "temperature": 0, "logprobs": True,
           "top_logprobs": 3, "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**ask)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 10
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    for t in content:  # greedy: the chosen token is the most likely one
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token and t.logprob <= 0
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
        assert bytes(t.bytes).decode() == t.token
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    plain = client.chat.completions.create(**{**ask, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None

    done = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=2,
                                     extra_body={"ignore_eos": True})
    lp = done.choices[0].logprobs
    assert "".join(lp.tokens) == done.choices[0].text and len(lp.token_logprobs) == 6
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    assert all(len(top) == 2 for top in lp.top_logprobs)


def test_echo_with_logprobs_gives_the_prompts_logprobs_first(client: openai.OpenAI) -> None:
    ask = {"model": MODEL, "prompt": "Once upon a time there was", "max_tokens": 5, "temperature": 0, "echo": True,
           "logprobs": 2, "extra_body": {"ignore_eos": True}}
    done = client.completions.create(**ask)
    choice, lp = done.choices[0], done.choices[0].logprobs
    assert len(lp.tokens) == done.usage.prompt_tokens + 5 == len(lp.token_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == choice.text and choice.text.startswith("Once upon a time there was")
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing precedes the first token
    assert all(v <= 0 for v in lp.token_logprobs[1:]) and all(len(t) == 2 for t in lp.top_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    chunks = list(client.completions.create(**ask, stream=True))
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs
    assert chunks[0].choices[0].text == "Once upon a time there was"  # the echo, with the prompt's logprobs
    assert len(chunks[0].choices[0].logprobs.tokens) == done.usage.prompt_tokens


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
     "response_format"),
    ({"guided_choice": ["yes", "no"]}, "guided_choice"),
    ({"structured_outputs": {"regex": "[0-9]+"}}, "structured_outputs"),
])
def test_a_constraint_the_mocker_cannot_honour_is_a_400_naming_it(stack: Stack, extra: dict, param: str) -> None:
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", timeout=10,
                   json={"model": MODEL, "messages": QUESTION, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_by_engine" and "mocker" in error["message"] and error["param"] == param


def test_two_constraints_or_a_bad_one_are_400s(stack: Stack) -> None:
    both = httpx.post(f"{stack.base_url}/v1/chat/completions", timeout=10, json={
        "model": MODEL, "messages": QUESTION, "guided_regex": "a+", "guided_choice": ["a"]})
    assert both.status_code == 400 and both.json()["error"]["param"] == "guided_choice"
    none_of = httpx.post(f"{stack.base_url}/v1/completions", timeout=10, json={
        "model": MODEL, "prompt": "x", "structured_outputs": {}})
    assert none_of.status_code == 400 and none_of.json()["error"]["param"] == "structured_outputs"
    not_json = httpx.post(f"{stack.base_url}/v1/completions", timeout=10, json={
        "model": MODEL, "prompt": "x", "guided_json": "{nope"})
    assert not_json.status_code == 400 and not_json.json()["error"]["param"] == "guided_json"
