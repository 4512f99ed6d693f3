"""Stop strings and incremental detokenization (pure)."""

from __future__ import annotations

import pytest

from app.output.text import StopMatcher


def feed_all(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = []
    for p in pieces:
        text, stopped = m.feed(p)
        out.append(text)
        if stopped:
            return "".join(out), True
    out.append(m.flush())
    return "".join(out), False


def test_no_stops_passes_through() -> None:
    assert feed_all([], ["a", "b"]) == ("ab", False)


def test_stop_inside_one_piece_is_cut_and_not_leaked() -> None:
    assert feed_all(["END"], ["hello END world"]) == ("hello ", True)


@pytest.mark.parametrize("pieces", [["hel", "lo E", "N", "D!"], ["hello ", "E", "ND"], ["h", "e", "l", "l", "o", " ", "E", "N", "D"]])
def test_stop_across_piece_boundaries(pieces: list[str]) -> None:
    assert feed_all(["END"], pieces) == ("hello ", True)


def test_partial_match_is_held_then_released() -> None:
    m = StopMatcher(["ENDX"])
    assert m.feed("abc EN") == ("abc ", False)
    assert m.feed("D") == ("", False)
    assert m.feed("Y") == ("ENDY", False)


def test_held_text_is_flushed_at_the_end() -> None:
    assert feed_all(["END"], ["abc E"]) == ("abc E", False)


def test_earliest_of_several_stops_wins() -> None:
    assert feed_all(["world", "lo"], ["hello world"]) == ("hel", True)


def test_text_assembler_round_trip(tokenizer_dir) -> None:  # noqa: ANN001
    from app.model_card import ModelCard
    from app.output.text import TextAssembler

    card = ModelCard.load("smollm2", tokenizer_dir)
    text = "The capital of France is Paris. Ünïcödé — 東京 ok"
    ids = card.encode(text, add_special_tokens=False)
    asm = TextAssembler(card.tokenizer, card.decode_stream(), [])
    out = "".join(asm.add([t]) for t in ids) + asm.finish()
    assert out == text
    asm = TextAssembler(card.tokenizer, card.decode_stream(), ["Paris"])
    out = "".join(asm.add([t]) for t in ids)
    assert out == "The capital of France is " and asm.stopped
