"""Tool-call parsers: table tests per format, and the streaming invariant on every row.

The outputs are written to the published format of each model family (Hermes 2 Pro / Qwen2.5
``<tool_call>`` blocks, Llama 3.1 JSON tool calling with ``<|python_tag|>``, Llama 3.2 / Llama 4
pythonic lists), plus the deviations models are seen to make: unclosed blocks, lists in a block,
``parameters`` for ``arguments``, prose that merely looks like the start of a call.

The invariant: any split of an output into deltas streams the same content (modulo surrounding
whitespace) and the same calls as ``parse`` of the whole text.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.output.parsing.base import collect
from app.output.parsing.tool_calls import (
    TOOL_PARSERS,
    ContentDelta,
    ParsedOutput,
    StreamEvent,
    ToolCallDelta,
    get_tool_parser,
)


@dataclass(frozen=True)
class Row:
    id: str
    text: str
    content: str | None
    calls: list[tuple[str, dict[str, Any]]]


# Written to the published format (Hermes 2 Pro / Qwen2.5 function calling).
HERMES = [
    Row("single", '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA", "unit": "celsius"}}\n</tool_call>',
        None, [("get_current_temperature", {"location": "San Francisco, CA, USA", "unit": "celsius"})]),
    Row("parallel", '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_temperature_date", "arguments": {"location": "Paris", "date": "2024-10-01"}}\n</tool_call>',
        None, [("get_current_temperature", {"location": "Paris"}),
               ("get_temperature_date", {"location": "Paris", "date": "2024-10-01"})]),
    Row("text-before", 'I will look that up for you.\n\n<tool_call>\n{"name": "search", "arguments": {"query": "tides Brest"}}\n</tool_call>',
        "I will look that up for you.", [("search", {"query": "tides Brest"})]),
    Row("text-after", '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>\nWaiting for the result.',
        "Waiting for the result.", [("search", {"query": "x"})]),
    Row("name-last", '<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}\n</tool_call>',
        None, [("get_stock_fundamentals", {"symbol": "TSLA"})]),
    Row("nested", '<tool_call>\n{"name": "create_event", "arguments": {"title": "Sync", "attendees": [{"email": "a@x.io", "optional": false}, {"email": "b@x.io", "optional": true}], "when": {"start": "09:00", "minutes": 30, "repeat": null}}}\n</tool_call>',
        None, [("create_event", {"title": "Sync", "attendees": [{"email": "a@x.io", "optional": False}, {"email": "b@x.io", "optional": True}],
                                 "when": {"start": "09:00", "minutes": 30, "repeat": None}})]),
    Row("unicode-escapes", '<tool_call>\n{"name": "translate", "arguments": {"text": "Il a dit \\"bonjour\\" à l\'été — 東京 🙂", "to": "ja", "path": "C:\\\\tmp"}}\n</tool_call>',
        None, [("translate", {"text": "Il a dit \"bonjour\" à l'été — 東京 🙂", "to": "ja", "path": "C:\\tmp"})]),
    Row("braces-in-strings", '<tool_call>\n{"name": "run", "arguments": {"code": "if (x) { return \\"}\\"; }"}}\n</tool_call>',
        None, [("run", {"code": 'if (x) { return "}"; }'})]),
    Row("empty-arguments", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', None, [("get_time", {})]),
    Row("no-arguments-key", '<tool_call>\n{"name": "get_time"}\n</tool_call>', None, [("get_time", {})]),
    Row("parameters-synonym", '<tool_call>\n{"name": "get_time", "parameters": {"tz": "UTC"}}\n</tool_call>', None, [("get_time", {"tz": "UTC"})]),
    Row("list-in-block", '<tool_call>[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": [1, 2]}}]</tool_call>',
        None, [("f", {"a": 1}), ("g", {"b": [1, 2]})]),
    Row("unclosed-valid", 'Checking.\n<tool_call>\n{"name": "search", "arguments": {"query": "weather"}}\n',
        "Checking.", [("search", {"query": "weather"})]),
    Row("unclosed-truncated", 'Checking.\n<tool_call>\n{"name": "search", "arguments": {"query": "wea',
        'Checking.\n<tool_call>\n{"name": "search", "arguments": {"query": "wea', []),
    Row("malformed-json", '<tool_call>\n{"name": "search", "arguments": {"query": "x",}}\n</tool_call>',
        '<tool_call>\n{"name": "search", "arguments": {"query": "x",}}\n</tool_call>', []),
    Row("malformed-then-valid", '<tool_call>{name: f}</tool_call>\n<tool_call>{"name": "g", "arguments": {}}</tool_call>',
        "<tool_call>{name: f}</tool_call>", [("g", {})]),
    Row("arguments-not-object", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', []),
    Row("no-name", '<tool_call>{"arguments": {"a": 1}}</tool_call>', '<tool_call>{"arguments": {"a": 1}}</tool_call>', []),
    Row("plain-content", "The capital of France is Paris.", "The capital of France is Paris.", []),
    Row("prose-partial-marker", "Wrap calls in <tool_calls> or <tool_c tags; a < b.", "Wrap calls in <tool_calls> or <tool_c tags; a < b.", []),
    Row("prose-full-marker", "I would emit a <tool_call> block here, but no tool fits.",
        "I would emit a <tool_call> block here, but no tool fits.", []),
    Row("stray-close", "Done.</tool_call>", "Done.</tool_call>", []),
    Row("empty", "", None, []),
    Row("whitespace-only", " \n ", None, []),
]

# Written to the published format (Llama 3.1 JSON-based tool calling; Llama 3.2 uses the same).
LLAMA3_JSON = [
    Row("single", '{"name": "get_weather", "parameters": {"city": "San Francisco", "metric": "celsius"}}',
        None, [("get_weather", {"city": "San Francisco", "metric": "celsius"})]),
    Row("python-tag", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        None, [("get_weather", {"city": "Oslo"})]),
    Row("leading-whitespace", '\n\n  {"name": "get_weather", "arguments": {"city": "Oslo"}}',
        None, [("get_weather", {"city": "Oslo"})]),
    Row("parallel-semicolon", '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y": "2"}}',
        None, [("a", {"x": 1}), ("b", {"y": "2"})]),
    Row("parallel-newline", '{"name": "a", "parameters": {}}\n{"name": "b", "parameters": {"k": [1, {"z": null}]}}',
        None, [("a", {}), ("b", {"k": [1, {"z": None}]})]),
    Row("nested-unicode", '{"name": "send_message", "parameters": {"to": {"name": "Zoë", "ids": [1, 2]}, "body": "He said \\"ok\\" {fine} ✓"}}',
        None, [("send_message", {"to": {"name": "Zoë", "ids": [1, 2]}, "body": 'He said "ok" {fine} ✓'})]),
    Row("empty-parameters", '{"name": "get_time", "parameters": {}}', None, [("get_time", {})]),
    Row("text-after", '{"name": "get_time", "parameters": {}}\nI have asked for the time.', "I have asked for the time.", [("get_time", {})]),
    Row("plain-content", "Paris is the capital of France.", "Paris is the capital of France.", []),
    Row("prose-with-json", 'Here is JSON: {"name": "x", "parameters": {}}', 'Here is JSON: {"name": "x", "parameters": {}}', []),
    Row("tag-then-prose", "<|python_tag|>brave_search.call(query=\"x\")", "<|python_tag|>brave_search.call(query=\"x\")", []),
    Row("malformed-json", '{"name": "f", "parameters": {"a": 1,}}', '{"name": "f", "parameters": {"a": 1,}}', []),
    Row("not-a-call", '{"answer": 42}', '{"answer": 42}', []),
    Row("arguments-not-object", '{"name": "f", "parameters": [1, 2]}', '{"name": "f", "parameters": [1, 2]}', []),
    Row("unclosed", '<|python_tag|>{"name": "f", "parameters": {"a": "b', '<|python_tag|>{"name": "f", "parameters": {"a": "b', []),
    Row("valid-then-malformed", '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {oops}}',
        '{"name": "g", "parameters": {oops}}', [("f", {})]),
    Row("empty", "", None, []),
]

# Written to the published format (Llama 3.2 / Llama 4 pythonic tool calling; ToolACE).
PYTHONIC = [
    Row("single", "[get_weather(city='San Francisco', metric=\"celsius\")]",
        None, [("get_weather", {"city": "San Francisco", "metric": "celsius"})]),
    Row("parallel", "[get_weather(city='Paris'), get_time(tz='Europe/Paris')]",
        None, [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})]),
    Row("llama4-wrappers", "<|python_start|>[get_time()]<|python_end|>", None, [("get_time", {})]),
    Row("wrappers-whitespace", "  <|python_start|>\n[get_time()]\n<|python_end|>\n", None, [("get_time", {})]),
    Row("literals", "[book(seats=2, price=-19.5, vip=True, note=None, tags=['a', \"b\"], opts={'window': False, 'n': (1, 2)})]",
        None, [("book", {"seats": 2, "price": -19.5, "vip": True, "note": None, "tags": ["a", "b"], "opts": {"window": False, "n": [1, 2]}})]),
    Row("json-literals", "[toggle(on=true, value=null, off=false)]", None, [("toggle", {"on": True, "value": None, "off": False})]),
    Row("unicode-escapes", "[say(text='It\\'s \"déjà vu\" ]) 東京', end=\"\\n\")]", None, [("say", {"text": "It's \"déjà vu\" ]) 東京", "end": "\n"})]),
    Row("dotted-name", "[math.sqrt(x=2)]", None, [("math.sqrt", {"x": 2})]),
    Row("text-after", "[get_time()]\nOne moment.", "One moment.", [("get_time", {})]),
    Row("plain-content", "The weather in Paris is mild.", "The weather in Paris is mild.", []),
    Row("prose-bracket", "[1] Smith, J. (2020). On tides.", "[1] Smith, J. (2020). On tides.", []),
    Row("list-not-calls", "[1, 2, 3]", "[1, 2, 3]", []),
    Row("positional-args", "[get_weather('Paris')]", "[get_weather('Paris')]", []),
    Row("non-literal-arg", "[f(x=os.system('ls'))]", "[f(x=os.system('ls'))]", []),
    Row("kwargs-splat", "[f(**opts)]", "[f(**opts)]", []),
    Row("empty-list", "[]", "[]", []),
    Row("unclosed", "[get_weather(city='Par", "[get_weather(city='Par", []),
    Row("syntax-error", "[get_weather(city=)]", "[get_weather(city=)]", []),
    Row("empty", "", None, []),
]

TABLES = {"hermes": HERMES, "llama3_json": LLAMA3_JSON, "pythonic": PYTHONIC}
ALL_ROWS = [pytest.param(name, row, id=f"{name}-{row.id}") for name, rows in TABLES.items() for row in rows]


def _calls(output: ParsedOutput) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in output.tool_calls]


def _stream(parser_name: str, chunks: list[str]) -> list[StreamEvent]:
    streamer = get_tool_parser(parser_name).streamer()
    events: list[StreamEvent] = []
    for chunk in chunks:
        events.extend(streamer.feed(chunk))
    events.extend(streamer.finish())
    return events


def _random_chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _assert_stream_matches(parser_name: str, text: str, chunks: list[str]) -> None:
    assert "".join(chunks) == text
    events = _stream(parser_name, chunks)
    whole = get_tool_parser(parser_name).parse(text)
    streamed = collect(events)
    assert streamed.content == whole.content
    assert _calls(streamed) == _calls(whole)
    seen: set[int] = set()
    for event in events:
        if isinstance(event, ToolCallDelta):
            assert (event.name is not None) == (event.index not in seen), "the name comes on a call's first delta only"
            seen.add(event.index)
        else:
            assert event.text, "no empty content deltas"
    assert sorted(seen) == list(range(len(seen)))


@pytest.mark.parametrize(("parser_name", "row"), ALL_ROWS)
def test_parse(parser_name: str, row: Row) -> None:
    out = get_tool_parser(parser_name).parse(row.text)
    assert out.content == row.content
    assert _calls(out) == row.calls
    for call in out.tool_calls:
        assert call.arguments == json.dumps(json.loads(call.arguments), ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize(("parser_name", "row"), ALL_ROWS)
def test_stream_one_char_at_a_time(parser_name: str, row: Row) -> None:
    _assert_stream_matches(parser_name, row.text, list(row.text))


@pytest.mark.parametrize(("parser_name", "row"), ALL_ROWS)
def test_stream_whole(parser_name: str, row: Row) -> None:
    _assert_stream_matches(parser_name, row.text, [row.text] if row.text else [])


@pytest.mark.parametrize(("parser_name", "row"), ALL_ROWS)
def test_stream_random_splits(parser_name: str, row: Row) -> None:
    for seed in range(25):
        _assert_stream_matches(parser_name, row.text, _random_chunks(row.text, random.Random(seed)))


def test_content_before_a_call_streams_as_it_arrives() -> None:
    streamer = get_tool_parser("hermes").streamer()
    assert streamer.feed("Let me check that. <tool_c") == [ContentDelta("Let me check that. ")]
    assert streamer.feed('all>{"name": "f", "arguments": {}}') == []
    assert streamer.feed("</tool_call>") == [ToolCallDelta(index=0, name="f", arguments="{}")]
    assert streamer.feed(" Done") == [ContentDelta(" Done")]
    assert streamer.finish() == []


def test_a_held_partial_marker_is_released_when_it_is_not_one() -> None:
    streamer = get_tool_parser("hermes").streamer()
    assert streamer.feed("a <tool") == [ContentDelta("a ")]
    assert streamer.feed("box> b") == [ContentDelta("<toolbox> b")]
    assert streamer.feed(" <") == [ContentDelta(" ")]
    assert streamer.finish() == [ContentDelta("<")]


@pytest.mark.parametrize(("parser_name", "first"), [("llama3_json", "Sure"), ("pythonic", "The")])
def test_outputs_that_do_not_open_with_a_call_stream_at_once(parser_name: str, first: str) -> None:
    streamer = get_tool_parser(parser_name).streamer()
    assert streamer.feed("  ") == []
    assert streamer.feed(f"{first} thing") == [ContentDelta(f"  {first} thing")]
    assert streamer.feed(" [x]{y}") == [ContentDelta(" [x]{y}")]
    assert streamer.finish() == []


def test_llama3_calls_are_told_as_each_object_closes() -> None:
    streamer = get_tool_parser("llama3_json").streamer()
    assert streamer.feed('<|python_tag|>{"name": "a", "parameters": {"s": "}"}}') == [
        ToolCallDelta(index=0, name="a", arguments='{"s":"}"}')]
    assert streamer.feed('; {"name": "b", "parameters": {}') == []
    assert streamer.feed("}") == [ToolCallDelta(index=1, name="b", arguments="{}")]
    assert streamer.finish() == []


def test_registry() -> None:
    assert set(TOOL_PARSERS) == {"hermes", "llama3_json", "pythonic"}
    for name, cls in TOOL_PARSERS.items():
        assert cls.name == name
        assert get_tool_parser(name).name == name
    with pytest.raises(ValueError, match="hermes, llama3_json, pythonic"):
        get_tool_parser("mistral")


_FRAGMENTS = ['<tool_call>', '</tool_call>', '<tool_', '{"name": "f", "arguments": {"a": "x"}}', '{"name": "g"}',
              '[f(a=1)]', "[g(b='}')]", '<|python_tag|>', '<|python_start|>', '<|python_end|>', ';', '\n', ' ',
              '{', '}', '[', ']', '"', "'", '\\', 'text', 'é', '[{"name": "h", "parameters": {}}]']


@settings(max_examples=150, deadline=None, database=None)
@given(parser_name=st.sampled_from(sorted(TABLES)), pieces=st.lists(st.sampled_from(_FRAGMENTS), max_size=12),
       seed=st.integers(0, 2**16))
def test_stream_matches_parse_on_fragment_soup(parser_name: str, pieces: list[str], seed: int) -> None:
    text = "".join(pieces)
    _assert_stream_matches(parser_name, text, _random_chunks(text, random.Random(seed)))
    _assert_stream_matches(parser_name, text, list(text))


#: Recorded: what SmolLM2-135M-Instruct (the default model, vLLM 0.32 on CPU, greedy) answered to five
#: questions with two tools written into its prompt in Hermes' format (tests/e2e/test_tools.py's
#: get_weather and get_time). The small model never calls a tool; its answers, JSON-looking code
#: included, must stay content for every parser.
SMOLLM2_RECORDED = [
    'The weather in Paris right now is extremely hot and humid, with a high of 32°C (90°F) and a low of 22°C (72°F).',
    'Tokyo is approximately 2:15:52 AM on a standard Pacific time (UTC+9).',
    'To create a JSON string with the weather and time in both Oslo and Rome, you can use the following code:\n\n```\n{\n  "type": "json",\n  "data": {\n    "location": {\n      "type": "string",\n      "name": "Oslo"\n    },\n    "time": {\n      "type": "datetime",\n      "format": "YYYY-MM-DD HH:MM:SS"\n    },\n    "weather": {\n      "type": "json",\n      "data": {\n        "location": {\n          "type":',
    "I'm fine. Just a normal day, I'm.",
    'To use the get_weather tool for London, you can use the following code:\n```\nfunction get_weather_by_city() {\n  return {\n    "location": {\n      "type": "string",\n      "description": "London"\n    },\n    "temperature": {\n      "type": "number",\n      "value": 25\n    },\n    "weather": {\n      "type": "weather",\n      "location": {\n        "type": "string",\n        "description": "London"\n      },\n      "temperature": {\n        "type": "number",',
]


@pytest.mark.parametrize("parser", sorted(TOOL_PARSERS))
@pytest.mark.parametrize("text", SMOLLM2_RECORDED, ids=[f"smollm2-{i}" for i in range(len(SMOLLM2_RECORDED))])
def test_a_real_models_plain_answers_stay_content(parser: str, text: str) -> None:
    parsed = get_tool_parser(parser).parse(text)
    assert parsed.tool_calls == [] and parsed.content == text.strip()
    streamer = get_tool_parser(parser).streamer()
    events = [e for i in range(0, len(text), 7) for e in streamer.feed(text[i:i + 7])] + streamer.finish()
    assert all(isinstance(e, ContentDelta) for e in events)
    assert "".join(e.text for e in events).strip() == text.strip()
