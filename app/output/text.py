"""Incremental detokenization and stop strings: token ids in, client-visible text out.

Invariants: the text emitted is exactly the detokenized output up to (not including) the first
occurrence of any stop string, even when a stop string spans several tokens; text that might
still turn out to be the start of a stop string is held back until it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class StopMatcher:
    """Finds stop strings in a growing text. Pure; one per request."""

    __slots__ = ("_stops", "_held")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit now, whether a stop string was found)."""
        if not self._stops:
            return text, False
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        hold = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), hold, -1):
                if buf.endswith(stop[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """At the end of generation, whatever was held back is plain text."""
        held, self._held = self._held, ""
        return held


class TextAssembler:
    """Token ids -> text, incrementally, with stop strings applied."""

    __slots__ = ("_tokenizer", "_decoder", "_stops", "stopped")

    def __init__(self, tokenizer: Tokenizer, decoder: DecodeStream, stops: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._decoder = decoder
        self._stops = StopMatcher(stops)
        self.stopped = False

    def add(self, token_ids: Sequence[int]) -> str:
        if self.stopped:
            return ""
        step = self._decoder.step
        pieces = []
        for tid in token_ids:
            piece = step(self._tokenizer, tid)
            if piece:
                pieces.append(piece)
        if not pieces:
            return ""
        text, self.stopped = self._stops.feed("".join(pieces))
        return text

    def finish(self) -> str:
        return "" if self.stopped else self._stops.flush()
