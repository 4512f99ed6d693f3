"""Reasoning split: table tests for both starting points, and the streaming invariant on every row.

Outputs are written to the published format (DeepSeek-R1 and Qwen3 ``<think>`` reasoning; for
DeepSeek-R1 the chat template opens ``<think>`` in the prompt, so the output starts inside it).
"""

from __future__ import annotations

import random

import pytest

from app.output.parsing.reasoning import (
    REASONING_PARSERS,
    ReasoningParser,
    ReasoningSplit,
    collect,
    get_reasoning_parser,
)

ROWS = [
    # (parser, id, output, reasoning, content)
    ("think", "closed", "<think>\nThe user wants 2+2. That is 4.\n</think>\n\n2 + 2 = 4.", "The user wants 2+2. That is 4.", "2 + 2 = 4."),
    ("think", "whitespace-before", "\n<think>plan</think>answer", "plan", "answer"),
    ("think", "text-before", "Sure. <think>plan</think> Answer.", "plan", "Sure.  Answer."),
    ("think", "no-reasoning", "Just an answer.", None, "Just an answer."),
    ("think", "empty-reasoning", "<think>\n\n</think>\n\nHello!", None, "Hello!"),
    ("think", "unclosed", "<think>Let me think about déjà vu… 東京", "Let me think about déjà vu… 東京", None),
    ("think", "reasoning-only", "<think>hmm</think>", "hmm", None),
    ("think", "second-block-is-content", "<think>a</think>b<think>c</think>", "a", "b<think>c</think>"),
    ("think", "stray-end", "Answer.</think>", None, "Answer.</think>"),
    ("think", "prose-partial-marker", "Use <thin or <think mode", None, "Use <thin or <think mode"),
    ("think", "marker-like-in-reasoning", "<think>is </thinking> a tag? </thin</think>ok", "is </thinking> a tag? </thin", "ok"),
    ("think", "empty", "", None, None),
    ("deepseek_r1", "closed", "Okay, the user asks for 2+2.\n</think>\n\n**4**", "Okay, the user asks for 2+2.", "**4**"),
    ("deepseek_r1", "opens-anyway", "<think>\nOkay.\n</think>\n\nHi", "Okay.", "Hi"),
    ("deepseek_r1", "opens-after-whitespace", "\n <think>Okay.</think>Hi", "Okay.", "Hi"),
    ("deepseek_r1", "unclosed", "Okay, let me work through this", "Okay, let me work through this", None),
    ("deepseek_r1", "empty-reasoning", "</think>\n\nHi", None, "Hi"),
    ("deepseek_r1", "think-later-is-reasoning", "a <think> b</think>c", "a <think> b", "c"),
    ("deepseek_r1", "partial-start-only", "<thi", "<thi", None),
    ("deepseek_r1", "empty", "", None, None),
]
PARAMS = [pytest.param(p, text, reasoning, content, id=f"{p}-{row_id}") for p, row_id, text, reasoning, content in ROWS]


def _stream(parser: ReasoningParser, chunks: list[str]) -> ReasoningSplit:
    streamer = parser.streamer()
    events = [event for chunk in chunks for event in streamer.feed(chunk)]
    events.extend(streamer.finish())
    assert all(text for _, text in events), "no empty deltas"
    return collect(events)


def _random_chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), PARAMS)
def test_split(name: str, text: str, reasoning: str | None, content: str | None) -> None:
    assert get_reasoning_parser(name).split(text) == ReasoningSplit(reasoning=reasoning, content=content)


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), PARAMS)
def test_stream_in_any_chunking(name: str, text: str, reasoning: str | None, content: str | None) -> None:
    parser = get_reasoning_parser(name)
    expected = parser.split(text)
    assert _stream(parser, list(text)) == expected
    assert _stream(parser, [text]) == expected
    for seed in range(25):
        assert _stream(parser, _random_chunks(text, random.Random(seed))) == expected


def test_reasoning_streams_as_it_arrives_and_holds_only_partial_markers() -> None:
    streamer = get_reasoning_parser("think").streamer()
    assert streamer.feed("Hi <th") == [("content", "Hi ")]
    assert streamer.feed("ink>step one</th") == [("reasoning", "step one")]
    assert streamer.feed("ink>Answer") == [("content", "Answer")]
    assert streamer.finish() == []


def test_deepseek_streams_reasoning_from_the_start() -> None:
    streamer = get_reasoning_parser("deepseek_r1").streamer()
    assert streamer.feed("  ") == []
    assert streamer.feed("Okay") == [("reasoning", "  Okay")]
    assert streamer.feed("</think") == []
    assert streamer.finish() == [("reasoning", "</think")]


def test_custom_markers() -> None:
    parser = ReasoningParser(start="<reason>", end="</reason>")
    assert parser.split("<reason>r</reason>c") == ReasoningSplit(reasoning="r", content="c")
    with pytest.raises(ValueError):
        ReasoningParser(start="")


def test_registry() -> None:
    assert set(REASONING_PARSERS) == {"think", "deepseek_r1"}
    assert get_reasoning_parser("deepseek_r1").starts_in_reasoning
    assert not get_reasoning_parser("think").starts_in_reasoning
    with pytest.raises(ValueError, match="deepseek_r1, think"):
        get_reasoning_parser("qwen3")
