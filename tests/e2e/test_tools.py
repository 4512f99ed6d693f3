"""Tool calling and reasoning end to end on the mocker stack: the mocker replays scripted model
outputs (workers.engines.mocker.script), and the frontend renders the tools into the prompt and
parses the outputs into ``tool_calls`` and ``reasoning_content``, streamed and whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench.devstack import Stack
from tests.chaos.support import client_of, own_stack
from tests.e2e.conftest import MODEL

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
    "timezone": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]

ONE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
TWO_CALLS = ('Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Oslo"}}\n</tool_call>')
SPACED = "  two leading spaces, and one at the end "
SCRIPT = [  # the first entry that matches wins
    {"match": "Spaces, please", "output": SPACED},
    # Only a prompt where the tool result was rendered (as the template-less fallback writes it) matches.
    {"match": '<tool_response>\n{"temperature": 18}\n</tool_response>', "output": "It is 18 degrees in Paris."},
    {"match": "weather in Paris", "output": ONE_CALL},
    {"match": "weather and time in Oslo", "output": TWO_CALLS},
    {"match": "Think first", "output": "<think>6 times 7 is 42, no tool needed.</think>The answer is 42."},
    {"match": "Think, then call", "output": "<think>I need the weather.</think>\n" + ONE_CALL},
]


@pytest.fixture(scope="module")
def stack(redis_server, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # noqa: ANN001
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with own_stack(redis_server.url, tokenizer_dir, workers=("w1",),
                   frontend_env={"SLUICE_FRONTEND__REASONING_PARSERS": json.dumps({MODEL: "think"})},
                   SLUICE_WORKER__MOCKER__SCRIPT=str(script)) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return client_of(stack)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def streamed_answer(client: openai.OpenAI, **kwargs: object) -> tuple[dict[int, dict], str, str, str | None, list]:
    """A streamed answer put together as a client does: calls by index, content, reasoning, the
    finish reason, and every tool-call delta as sent."""
    calls: dict[int, dict] = {}
    content, reasoning, finish, deltas = "", "", None, []
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **kwargs):
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                deltas.append(tc)
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or tc.id
                call["name"] += (tc.function.name or "") if tc.function else ""
                call["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = choice.finish_reason or finish
    return calls, content, reasoning, finish, deltas


def test_a_tool_call_comes_back_as_tool_calls(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask("What is the weather in Paris?"), tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}


def test_streamed_tool_calls_equal_the_whole_answer(client: openai.OpenAI) -> None:
    calls, content, _, finish, deltas = streamed_answer(client, messages=ask("What are the weather and time in Oslo?"),
                                                 tools=TOOLS)
    assert finish == "tool_calls"
    assert content.strip() == "Let me check both."
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_time"]
    assert [json.loads(c["arguments"]) for c in calls.values()] == [{"city": "Oslo"}, {"timezone": "Europe/Oslo"}]
    assert all(c["id"].startswith("call_") for c in calls.values()) and calls[0]["id"] != calls[1]["id"]
    # Each call's first delta carries its id, type and name; later ones only arguments.
    firsts = {}
    for d in deltas:
        if d.index not in firsts:
            firsts[d.index] = d
            assert d.id and d.type == "function" and d.function.name
        else:
            assert d.id is None and not d.function.name
    whole = client.chat.completions.create(model=MODEL, messages=ask("What are the weather and time in Oslo?"),
                                           tools=TOOLS)
    assert whole.choices[0].message.content == "Let me check both."
    assert [c.function.name for c in whole.choices[0].message.tool_calls] == ["get_weather", "get_time"]


def test_parallel_tool_calls_false_keeps_the_first_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask("What are the weather and time in Oslo?"),
                                       tools=TOOLS, parallel_tool_calls=False)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    calls, *_ = streamed_answer(client, messages=ask("What are the weather and time in Oslo?"), tools=TOOLS,
                         parallel_tool_calls=False)
    assert [c["name"] for c in calls.values()] == ["get_weather"]


def test_tool_choice_none_leaves_the_text_alone(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask("What is the weather in Paris?"), tools=TOOLS,
                                       tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == ONE_CALL and r.choices[0].finish_reason == "stop"


def test_reasoning_is_split_from_the_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask("Think first: what is 6 times 7?"))
    message = r.choices[0].message
    assert message.reasoning_content == "6 times 7 is 42, no tool needed."
    assert message.content == "The answer is 42."
    _, content, reasoning, finish, _ = streamed_answer(client, messages=ask("Think first: what is 6 times 7?"))
    assert (reasoning, content, finish) == ("6 times 7 is 42, no tool needed.", "The answer is 42.", "stop")


def test_reasoning_then_a_tool_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask("Think, then call: weather?"), tools=TOOLS)
    message = r.choices[0].message
    assert message.reasoning_content == "I need the weather."
    assert message.tool_calls[0].function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    calls, content, reasoning, finish, _ = streamed_answer(client, messages=ask("Think, then call: weather?"), tools=TOOLS)
    assert reasoning == "I need the weather." and not content.strip()
    assert calls[0]["name"] == "get_weather" and finish == "tool_calls"


def test_tool_results_are_rendered_into_the_next_turn(client: openai.OpenAI, stack: Stack) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ask("What is the weather in Paris?"), tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    history = [*ask("What is the weather in Paris?"),
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert r.choices[0].message.content == "It is 18 degrees in Paris."
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    # The prompt holds the tools' descriptions and the earlier call, in the model's format.
    ids = httpx.post(f"{stack.base_url}/tokenize", json={"model": MODEL, "messages": history, "tools": TOOLS},
                     timeout=30).json()["tokens"]
    text = httpx.post(f"{stack.base_url}/detokenize", json={"model": MODEL, "tokens": ids}, timeout=30).json()["prompt"]
    assert "<tools>" in text and '"name": "get_time"' in text and '"city": "Paris"' in text


def test_n_choices_each_get_their_calls(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask("What is the weather in Paris?"), tools=TOOLS, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.tool_calls[0].function.name == "get_weather" for c in r.choices)


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice", "unsupported_by_engine"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice",
     "unsupported_by_engine"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", None),
    ({"tool_choice": "required"}, "tool_choice", None),
    ({"tools": [WEATHER, WEATHER]}, "tools", None),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools", None),
    ({"tools": [{"type": "retrieval"}]}, "tools", None),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     None),
    ({"messages": [*ask("hi"), {"role": "tool", "content": "18"}]}, "messages.1.tool_call_id", None),
])
def test_bad_tool_requests_are_400s(stack: Stack, extra: dict, param: str, code: str | None) -> None:
    body = {"model": MODEL, "messages": ask("What is the weather in Paris?"), **extra}
    r = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"] or "").startswith(param), err
    if code:
        assert err["code"] == code and "mocker" in err["message"]


def test_plain_answers_pass_through_the_parsers_unchanged(client: openai.OpenAI) -> None:
    """With tools offered and a reasoning parser on, an answer with neither keeps every character
    (surrounding whitespace included), whole and streamed."""
    body = {"messages": ask("Spaces, please"), "tools": TOOLS}
    whole = client.chat.completions.create(model=MODEL, **body).choices[0]
    _, streamed, reasoning, finish, _ = streamed_answer(client, **body)
    assert whole.message.content == streamed == SPACED and not reasoning
    assert whole.finish_reason == finish == "stop" and whole.message.tool_calls is None
