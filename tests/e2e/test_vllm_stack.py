"""The real model through the whole stack: ``sluice serve`` + one ``sluice worker`` running vLLM.

SmolLM2-135M-Instruct (weights prepared once into the user cache) on vLLM's CPU build, behind the
frontend, Celery and Redis, asked through the ``openai`` client. One worker serves the module
(vLLM starts in about a minute on CPU), with a second one for the migration test and vLLM's own
server for the tests that compare answers with it, all three started side by side (a vLLM start is
mostly one core's imports: three overlap on a 2-core machine). Tests that look at one worker name it
(``x-sluice-router: worker_id=...``); the migration test kills the second worker, and the last test
kills the first one's engine, so it stays last.

Run in the vLLM environment: ``.venv-vllm/bin/python -m pytest -m vllm tests/e2e/test_vllm_stack.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from bench.devstack import Stack, wait_until
from core.keys import Keys
from core.timing import TimingModel
from tests.e2e.vllm_reference import LORA_RANK, VllmServer, make_adapter
from tests.workers.vllm_support import MODEL, VLLM_SKIP, smollm2_weights_dir

pytestmark = [pytest.mark.vllm, VLLM_SKIP]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
#: The context this stack serves (SmolLM2's is 8,192): its longest prompt takes a quarter of the
#: prefill time (20 s or more here), still far longer than the stall clock.
CONTEXT_LENGTH = 4096
#: Shorter than that prefill, and long enough for a decode step on a machine busy with other work.
STALL_TIMEOUT_S = 10
#: vLLM loads in about a minute on an idle 2-core machine; leave room for a busy one.
START_TIMEOUT_S = 300
WORKER = "vllm-1"
#: The worker the migration test kills mid-stream.
SECOND = "vllm-2"
#: Pins a request to the module's first worker.
ON_WORKER = {"x-sluice-router": f"worker_id={WORKER}"}
#: The LoRA adapter (random weights) the stack loads at run time and vLLM's own server at its start.
ADAPTER = "random-lora"


@dataclass
class Launched:
    """The module's processes: the Sluice stack (two vLLM workers) and vLLM's own server (the parity
    tests' reference), started side by side."""

    stack: Stack
    reference: VllmServer
    adapter: Path


@pytest.fixture(scope="module")
def launched(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"vllm{uuid.uuid4().hex[:8]}", model_path=smollm2_weights_dir(),
              env_extra={"SLUICE_ENGINE": "vllm", "SLUICE_WORKER__VLLM__MAX_NUM_SEQS": "8",
                         "SLUICE_WORKER__VLLM__KV_CACHE_GIB": "1",
                         "SLUICE_WORKER__VLLM__MAX_MODEL_LEN": str(CONTEXT_LENGTH),
                         "SLUICE_WORKER__VLLM__OMP_THREADS": str(os.cpu_count() or 1),
                         "SLUICE_WORKER__VLLM__MAX_LORAS": "1",
                         "SLUICE_WORKER__VLLM__MAX_LORA_RANK": str(LORA_RANK)})
    reference = None
    try:
        s.start_worker(WORKER)
        s.start_worker(SECOND)
        # The frontend is pointed at no model directory at all: its tokenizer and chat template
        # can only come from what the worker registers.
        s.start_frontend(SLUICE_MODEL_PATH="/nonexistent/sluice-model",
                         SLUICE_FRONTEND__REASONING_PARSERS=json.dumps({MODEL: "think"}),
                         SLUICE_FRONTEND__STALL_TIMEOUT_S=str(STALL_TIMEOUT_S))
        adapter = make_adapter(smollm2_weights_dir(), tmp_path_factory.mktemp("lora") / ADAPTER)
        # vLLM's own server on the same model, engine settings and adapter.
        reference = VllmServer(smollm2_weights_dir(), MODEL, {ADAPTER: adapter})
        s.wait_ready(MODEL, workers=2, timeout=START_TIMEOUT_S)
        yield Launched(s, reference, adapter)
    finally:
        if reference is not None:
            reference.stop()
        s.stop()


@pytest.fixture(scope="module")
def vllm_stack(launched: Launched) -> Stack:
    return launched.stack


@pytest.fixture(scope="module")
def client(vllm_stack: Stack) -> openai.OpenAI:
    # A request of 300 tokens decodes at a few tokens a second on a CPU shared with other work: the
    # client waits as long as the test may (pytest's timeout ends a test that hangs).
    return openai.OpenAI(base_url=f"{vllm_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=600)


def test_models_lists_the_model_with_its_context_length(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] == CONTEXT_LENGTH


def test_greedy_answer_names_paris(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=32, temperature=0)
    answer = r.choices[0].message.content
    assert "Paris" in answer, answer
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_sampling_fields_reach_vllm(client: openai.OpenAI, vllm_stack: Stack) -> None:
    """logit_bias, the penalties, top_k and min_p go to vLLM's sampler: +100 forces a token, and a
    strong frequency penalty changes the greedy answer."""
    forced = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature=0,
                                            logit_bias={"4242": 100}, extra_body={"ignore_eos": True})
    text = httpx.post(f"{vllm_stack.base_url}/detokenize", json={"tokens": [4242] * 4}, timeout=10).json()["prompt"]
    assert forced.choices[0].message.content == text
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    penalised = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0,
                                               frequency_penalty=2.0, presence_penalty=1.0,
                                               extra_body={"repetition_penalty": 1.5, "top_k": 5, "min_p": 0.01})
    assert penalised.choices[0].message.content != plain.choices[0].message.content


def test_logprobs_are_vllms(client: openai.OpenAI) -> None:
    """Greedy with top_logprobs: each chosen token is vLLM's most likely one, and the log
    probabilities are real ones (negative, not all equal), streamed as whole."""
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = client.chat.completions.create(**ask)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    # The end-of-sequence token, when it ends the answer, has its logprob too.
    assert "".join(t.token for t in content).startswith(whole.choices[0].message.content)
    assert all(t.top_logprobs[0].token == t.token and t.logprob <= 0 for t in content)
    assert len({round(t.logprob, 3) for t in content}) > 1
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed == [t.token for t in content]


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0,
                                                                            "maximum": 120},
                         "city": {"type": "string", "enum": ["Paris", "London", "Rome"]}}}


@pytest.mark.timeout(1200)  # two answers of up to 300 tokens, decoded on a busy CPU
def test_structured_outputs_parse_and_validate(client: openai.OpenAI) -> None:
    """vLLM's structured-output backend on this CPU: a strict JSON schema, JSON, a choice and a regex."""
    import jsonschema

    ask = [{"role": "user", "content": "Describe a person who lives in a capital city, as JSON."}]
    # Room for the whitespace the grammar allows between tokens: a cut answer would not parse.
    r = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=300, temperature=0,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=300, temperature=0, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}) if c.choices)
    jsonschema.validate(json.loads(streamed), PERSON)
    # Any JSON object: the small model may go on for hundreds of tokens, so a cut answer is allowed.
    obj = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=48, temperature=0,
                                         response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":  # JSON, if the model closed it within the budget
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:
        assert obj.choices[0].message.content.lstrip().startswith("{")
    choice = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0,
                                            extra_body={"guided_choice": ["Paris", "Lyon", "Nice"]})
    assert choice.choices[0].message.content in ("Paris", "Lyon", "Nice")
    digits = client.completions.create(model=MODEL, prompt="The year is", max_tokens=6, temperature=0,
                                       extra_body={"structured_outputs": {"regex": " [0-9]{4}"}})
    assert re.fullmatch(r" [0-9]{4}", digits.choices[0].text), digits.choices[0].text


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Rome"]}},
    "required": ["city"], "additionalProperties": False}}}
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def _tool_schema(name: str) -> dict:
    return next(t["function"]["parameters"] for t in (WEATHER, TIME) if t["function"]["name"] == name)


def test_tool_choice_required_and_named_give_valid_calls(client: openai.OpenAI) -> None:
    """``required`` and a named function are held to the tools' schemas by vLLM's structured outputs."""
    import jsonschema

    r = client.chat.completions.create(model=MODEL, messages=WEATHER_Q, tools=[WEATHER, TIME], tool_choice="required",
                                       temperature=0, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
        jsonschema.validate(json.loads(call.function.arguments), _tool_schema(call.function.name))
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(model=MODEL, messages=WEATHER_Q, tools=[WEATHER, TIME],
                                                tool_choice="required", temperature=0, max_tokens=200, stream=True):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
        [(t.function.name, json.loads(t.function.arguments)) for t in choice.message.tool_calls]

    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model=MODEL, messages=WEATHER_Q, tools=[WEATHER, TIME], tool_choice=named,
                                       temperature=0, max_tokens=100)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(call.function.arguments), _tool_schema("get_time"))


def test_tool_choice_auto_answers_with_calls_or_text(client: openai.OpenAI) -> None:
    """The small model decides for itself: whatever it answers is well formed, and its raw text
    (``tool_choice: none``, same greedy request) parses to the same answer."""
    from app.output.parsing.tool_calls import get_tool_parser

    raw = client.chat.completions.create(model=MODEL, messages=WEATHER_Q, tools=[WEATHER, TIME], tool_choice="none",
                                         temperature=0, max_tokens=120)
    auto = client.chat.completions.create(model=MODEL, messages=WEATHER_Q, tools=[WEATHER, TIME], temperature=0,
                                          max_tokens=120)
    parsed = get_tool_parser("hermes").parse(raw.choices[0].message.content)
    message = auto.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []] == \
        [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
    assert (message.content or None) == parsed.content
    assert auto.choices[0].finish_reason == ("tool_calls" if parsed.tool_calls and raw.choices[0].finish_reason == "stop"
                                             else raw.choices[0].finish_reason)


def test_reasoning_is_split_on_the_real_models_output(client: openai.OpenAI) -> None:
    """The model is held to a thought then an answer (a regex constraint), and the reasoning parser
    splits the two, whole and streamed."""
    regex = {"structured_outputs": {"regex": "<think>[a-z ]{8,40}</think>[A-Z][a-z ]{4,30}[.]"}}
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=60,
                                           extra_body=regex)
    message = whole.choices[0].message
    assert re.fullmatch(r"[a-z ]{8,40}", getattr(message, "reasoning_content", "") or ""), message
    assert re.fullmatch(r"[A-Z][a-z ]{4,30}[.]", message.content or ""), message
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=60,
                                                extra_body=regex, stream=True):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
    assert (reasoning.strip(), content.strip()) == (message.reasoning_content, message.content)


def test_streaming_gives_the_same_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=32, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=32, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text and text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # streamed, not one blob
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_prompt_ids_come_from_the_registered_model_card(client: openai.OpenAI) -> None:
    """The frontend (given no model directory) tokenized with the worker's tokenizer and template."""
    from tokenizers import Tokenizer

    model_dir = smollm2_weights_dir()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    template = json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert "<|im_start|>" in template  # ChatML
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1, temperature=0)
    rendered = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert r.usage.prompt_tokens == len(tokenizer.encode(rendered, add_special_tokens=False).ids)


def test_a_prompt_longer_than_the_context_is_a_400_naming_the_limit(vllm_stack: Stack) -> None:
    long_text = "hello " * (CONTEXT_LENGTH + 100)
    r = httpx.post(f"{vllm_stack.base_url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": long_text}], "max_tokens": 4})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and str(CONTEXT_LENGTH) in error["message"]


def _registered(stack: Stack, worker_id: str) -> bool:
    client = redis.Redis.from_url(stack.redis_url)
    try:
        return bool(client.exists(Keys(stack.namespace).worker(worker_id)))
    finally:
        client.close()


@pytest.mark.parametrize("case", ["missing", "corrupt"])
def test_a_model_that_fails_to_load_stops_the_worker_before_it_registers(
        vllm_stack: Stack, tmp_path: Path, case: str) -> None:
    model_dir = tmp_path / "broken"
    if case == "corrupt":  # a complete-looking directory whose weights are garbage
        model_dir.mkdir()
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(smollm2_weights_dir() / name, model_dir / name)
        (model_dir / "model.safetensors").write_bytes(b"not a safetensors file")
    name = f"broken-{case}"
    proc = vllm_stack.start_worker(name, SLUICE_MODEL_PATH=str(model_dir))
    rc = proc.popen.wait(START_TIMEOUT_S)
    assert rc != 0
    assert "sluice worker: " in proc.tail(200)
    message = "no tokenizer" if case == "missing" else "failed to start"
    assert message in proc.tail(200)
    assert not _registered(vllm_stack, name)
    assert vllm_stack.ready_workers().get(MODEL) == 2


def _longest_prompt(tokenizer_json: Path, salt: str) -> list[int]:
    """A prompt of CONTEXT_LENGTH - 1 token ids (room for one generated token): real text, repeated."""
    from tokenizers import Tokenizer

    text = (f"{salt}. " + "The lighthouse keeper wrote down the weather, the ships and the birds every day. ") * 900
    ids = Tokenizer.from_file(str(tokenizer_json)).encode(text).ids
    assert len(ids) >= CONTEXT_LENGTH
    return ids[:CONTEXT_LENGTH - 1]


def test_the_longest_prompt_the_model_accepts_succeeds_streamed_and_not(vllm_stack: Stack) -> None:
    """4,095 prompt tokens on this CPU take far longer than the stall clock (STALL_TIMEOUT_S) to prefill:
    the worker is alive and computing, so the frontend waits for the first token."""
    tokenizer = smollm2_weights_dir() / "tokenizer.json"
    url = f"{vllm_stack.base_url}/v1/completions"
    body = {"model": MODEL, "prompt": _longest_prompt(tokenizer, "Streamed"), "max_tokens": 1, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url, json=body, timeout=600) as resp:
        assert resp.status_code == 200
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events[-3:]
    usage = json.loads(events[-2])["usage"]
    assert usage["prompt_tokens"] == CONTEXT_LENGTH - 1 and usage["completion_tokens"] == 1
    body = {**body, "prompt": _longest_prompt(tokenizer, "Whole"), "stream": False}
    resp = httpx.post(url, json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens"] == CONTEXT_LENGTH - 1
    assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < 100  # computed, not cached


# ---- the same requests to vLLM's own server --------------------------------------------------------
@pytest.fixture(scope="module")
def adapter(launched: Launched) -> Path:
    return launched.adapter


@pytest.fixture(scope="module")
def reference(launched: Launched) -> openai.OpenAI:
    """vLLM's own server on the same model, engine settings and adapter (started beside the stack)."""
    launched.reference.wait_up(START_TIMEOUT_S)
    return openai.OpenAI(base_url=f"{launched.reference.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_lora_adapter_loads_at_run_time_and_answers_as_vllms_server_does(
        client: openai.OpenAI, vllm_stack: Stack, adapter: Path, reference: openai.OpenAI) -> None:
    r = httpx.post(f"{vllm_stack.base_url}/v1/load_lora_adapter",
                   json={"lora_name": ADAPTER, "lora_path": str(adapter)}, timeout=300)
    assert r.status_code == 200, r.text
    listed = {m.id: m for m in client.models.list().data}
    assert listed[ADAPTER].model_extra["parent"] == MODEL
    prompt = {"prompt": "The capital of France is", "max_tokens": 20, "temperature": 0}
    tuned = client.completions.create(model=ADAPTER, **prompt).choices[0].text
    assert tuned != client.completions.create(model=MODEL, **prompt).choices[0].text
    assert tuned == reference.completions.create(model=ADAPTER, **prompt).choices[0].text
    ask = {"messages": QUESTION, "max_tokens": 24, "temperature": 0}
    assert client.chat.completions.create(model=ADAPTER, **ask).choices[0].message.content == \
        reference.chat.completions.create(model=ADAPTER, **ask).choices[0].message.content
    assert httpx.post(f"{vllm_stack.base_url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER},
                      timeout=60).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=ADAPTER, **ask)


#: Greedy requests whose answers must be vLLM's own, field for field (tools are left out: for a
#: template without tools, as this model's, Sluice writes them into the prompt and vLLM drops them).
PARITY = {
    "chat": {"messages": QUESTION, "max_tokens": 32},
    "sampling fields": {"messages": [{"role": "user", "content": "Name three rivers of Europe."}], "max_tokens": 40,
                        "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.3, "presence_penalty": 0.5,
                        "frequency_penalty": 0.5, "logit_bias": {"330": 3.0}, "min_tokens": 8},
    "stop": {"messages": QUESTION, "max_tokens": 40, "stop": ["."], "stop_token_ids": [13]},
    "seeded sampling": {"messages": QUESTION, "max_tokens": 24, "temperature": 0.9, "seed": 1234},
    "json schema": {"messages": [{"role": "user", "content": "Describe a person who lives in a capital city."}],
                    "max_tokens": 120, "response_format": {"type": "json_schema", "json_schema": {
                        "name": "person", "schema": PERSON, "strict": True}}},
    "choice": {"messages": QUESTION, "max_tokens": 10, "structured_outputs": {"choice": ["Paris", "Lyon"]}},
}


@pytest.mark.parametrize("case", sorted(PARITY))
def test_chat_answers_equal_vllms_server(client: openai.OpenAI, reference: openai.OpenAI, case: str) -> None:
    body = {"temperature": 0, **PARITY[case]}
    ours = httpx.post(f"{client.base_url}chat/completions", json={"model": MODEL, **body}, timeout=120).json()
    theirs = httpx.post(f"{reference.base_url}chat/completions", json={"model": MODEL, **body}, timeout=120).json()
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
    for field in ("prompt_tokens", "completion_tokens"):
        assert ours["usage"][field] == theirs["usage"][field]


def test_completions_and_logprobs_equal_vllms_server(client: openai.OpenAI, reference: openai.OpenAI) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "logprobs": 3}
    ours = client.completions.create(model=MODEL, **body).choices[0]
    theirs = reference.completions.create(model=MODEL, **body).choices[0]
    assert ours.text == theirs.text and ours.logprobs.tokens == theirs.logprobs.tokens
    assert ours.logprobs.token_logprobs == pytest.approx(theirs.logprobs.token_logprobs, abs=1e-3)
    chat = {"messages": QUESTION, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    ours_c = client.chat.completions.create(model=MODEL, **chat).choices[0].logprobs.content
    theirs_c = reference.chat.completions.create(model=MODEL, **chat).choices[0].logprobs.content
    assert [t.token for t in ours_c] == [t.token for t in theirs_c]
    assert [t.logprob for t in ours_c] == pytest.approx([t.logprob for t in theirs_c], abs=1e-3)
    assert [[a.token for a in t.top_logprobs] for t in ours_c] == [[a.token for a in t.top_logprobs] for t in theirs_c]
    echo = {**body, "echo": True, "max_tokens": 4}
    ours_e = client.completions.create(model=MODEL, **echo).choices[0]
    theirs_e = reference.completions.create(model=MODEL, **echo).choices[0]
    assert ours_e.text == theirs_e.text and ours_e.logprobs.tokens == theirs_e.logprobs.tokens
    assert ours_e.logprobs.token_logprobs[0] is None is theirs_e.logprobs.token_logprobs[0]
    assert ours_e.logprobs.token_logprobs[1:] == pytest.approx(theirs_e.logprobs.token_logprobs[1:], abs=1e-3)


def _engine_core(worker_pid: int) -> psutil.Process:
    """vLLM's engine core: the worker's child process that runs the model (titled ``VLLM::EngineCore``)."""
    for child in psutil.Process(worker_pid).children(recursive=True):
        try:
            described = child.name() + " " + " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "EngineCore" in described:
            return child
    raise AssertionError(f"no vLLM engine core under worker {worker_pid}")


def test_the_vllm_worker_serves_its_metrics_found_through_the_discovery(vllm_stack: Stack, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, extra_headers=ON_WORKER)
    # Steps enough for the worker's timing fit (TimingFit.min_steps) over prompts of several lengths, whatever
    # this module ran before.
    for words in (40, 200, 500):
        story = [{"role": "user", "content": f"Story {words}: " + " ".join(["river"] * words)}]
        client.chat.completions.create(model=MODEL, messages=story, max_tokens=8, temperature=0,
                                       extra_headers=ON_WORKER)
    groups = httpx.get(f"{vllm_stack.base_url}/prometheus/targets", timeout=10).json()
    workers = {g["labels"]["worker"]: g for g in groups if g["labels"]["component"] == "worker"}
    assert sorted(workers) == [WORKER, SECOND]
    worker = workers[WORKER]
    assert worker["labels"]["engine"] == "vllm"
    url = f"http://{worker['targets'][0]}{worker['labels']['__metrics_path__']}"

    def sample(name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
            for s in family.samples:
                if s.name == name and s.labels == labels:
                    return s.value
        raise KeyError(name)

    wait_until(lambda: sample("sluice_worker_kv_blocks_capacity") > 0, 10, "a heartbeat to set the gauges")
    # vLLM's iteration details, through Sluice's stat logger: every step timed, by phase.
    assert sample("sluice_worker_step_duration_seconds_count", phase="prefill") >= 1
    assert sample("sluice_worker_step_duration_seconds_count", phase="decode") >= 1
    assert sample("sluice_worker_step_duration_seconds_sum", phase="decode") > 0
    assert sample("sluice_worker_generated_tokens_total") >= 8
    assert sample("sluice_worker_prompt_tokens_total") > 0
    assert sample("sluice_worker_kv_events_published_total", kind="stored") > 0
    # The worker's own step-time model, fitted on vLLM's timed steps, travels with its load: it
    # predicts what the steps measured (decode-only steps, at the usages they ran at).
    r = redis.Redis.from_url(vllm_stack.redis_url)

    def load() -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in r.hgetall(Keys(vllm_stack.namespace).load(WORKER)).items()}

    try:
        wait_until(lambda: TimingModel.decode_text(load().get("timing", "")) is not None, 10,
                   "a heartbeat to carry the fitted model")
        last = load()
    finally:
        r.close()
    timing = TimingModel.decode_text(last.get("timing", ""))
    assert timing is not None, last
    assert timing.prefill_ms(4000) > timing.prefill_ms(100) > 0
    measured_ms = 1000 * sample("sluice_worker_step_duration_seconds_sum", phase="decode") / \
        sample("sluice_worker_step_duration_seconds_count", phase="decode")
    assert 0.5 < timing.decode_ms(float(last["active_blocks"]) / float(last["total_blocks"])) / measured_ms < 2


def _story(client: openai.OpenAI, worker: str) -> openai.Stream:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        max_tokens=80, temperature=0, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True}, extra_headers={"x-sluice-router": f"worker_id={worker}"})


def test_a_killed_worker_s_stream_continues_on_the_other_with_the_same_text(
        vllm_stack: Stack, client: openai.OpenAI) -> None:
    """Migration on the real model: the second worker, serving a greedy stream, is SIGKILLed mid-stream,
    and the stream continues on the first, its text equal to that worker's uninterrupted text. The
    signal reaches the worker process alone, as the OOM killer's does: the vLLM engine core it started
    ends by itself (workers/engines/die_with_worker.py)."""
    assert _registered(vllm_stack, SECOND), vllm_stack.procs[SECOND].tail(200)
    reference = list(_story(client, WORKER))
    it = iter(_story(client, SECOND))
    head = [next(it) for _ in range(10)]
    vllm_stack.kill(SECOND, alone=True)  # the worker process only: its engine core must end by itself
    moved = [*head, *it]

    def text(chunks: list) -> str:
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert text(moved) == text(reference)
    usage = [c.usage for c in moved if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 80
    assert usage[0].prompt_tokens == next(c.usage for c in reference if c.usage is not None).prompt_tokens
    wait_until(lambda: vllm_stack.ready_workers().get(MODEL) == 1, 30, "the killed worker to leave")


def test_zz_engine_death_fails_in_flight_requests_and_deregisters_the_worker(
        vllm_stack: Stack, client: openai.OpenAI) -> None:
    """Runs last, after the migration test killed the second worker: it kills the first one's engine."""
    worker = vllm_stack.procs[WORKER]
    stream = iter(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a very long story about a lighthouse."}],
        max_tokens=4000, temperature=0, stream=True, extra_body={"ignore_eos": True}, extra_headers=ON_WORKER))
    for _ in range(3):  # the request is running on the engine
        next(stream)
    _engine_core(worker.popen.pid).kill()
    with pytest.raises(openai.APIError, match="(?i)engine"):
        for _ in stream:
            pass
    worker.popen.wait(120)  # the worker shuts itself down ...
    assert "engine died" in worker.tail(400)
    assert not _registered(vllm_stack, WORKER)  # ... and deregisters
    wait_until(lambda: httpx.get(f"{vllm_stack.base_url}/ready").status_code == 503, 10, "/ready to report no worker")
