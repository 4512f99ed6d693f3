"""Text scanning the streamers share: held-back marker prefixes, an optional leading tag, and where
a bracketed literal closes.

All of them work on a growing text without rescanning it from the start, so feeding an output one
character at a time stays linear (except ``partial_marker_len``, bounded by the marker's length).
"""

from __future__ import annotations


def partial_marker_len(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``: the part a
    streamer must hold back because the next delta may complete the marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def skip_lead(text: str, tag: str) -> int | None:
    """Index of the first character after leading whitespace, an optional ``tag`` and the whitespace
    after it. None while ``text`` could still be only that lead (whitespace, or a prefix of ``tag``)."""
    start = len(text) - len(text.lstrip())
    rest = text[start:]
    if rest.startswith(tag):
        after = start + len(tag)
        body = text[after:]
        stripped = body.lstrip()
        return after + len(body) - len(stripped) if stripped else None
    if tag.startswith(rest):
        return None
    return start


class BracketScanner:
    """Finds where the bracketed literal that opens at ``start`` closes, one delta at a time.

    Brackets ``[({`` and ``)]}`` count alike (the literal's parser, not this scanner, checks that
    they pair); brackets inside quoted strings do not count, and a backslash escapes the character
    after it inside a string. Each call is given the same text, grown; the scan resumes where it
    stopped. The answer only bounds a candidate literal: callers decode it and treat anything that
    fails as content, so a scanner misled by odd text costs latency, never correctness.
    """

    __slots__ = ("_quotes", "_start", "_pos", "_depth", "_quote", "_escaped")

    def __init__(self, quotes: str, start: int = 0) -> None:
        self._quotes = quotes
        self._start = start
        self._pos = start
        self._depth = 0
        self._quote: str | None = None
        self._escaped = False

    def end(self, text: str) -> int | None:
        """Index just past the closing bracket, or None while the literal is still open."""
        for i in range(self._pos, len(text)):
            c = text[i]
            if self._quote is not None:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == self._quote:
                    self._quote = None
            elif c in self._quotes:
                self._quote = c
            elif c in "[({":
                self._depth += 1
            elif c in ")]}":
                self._depth -= 1
                if self._depth <= 0:
                    self._pos = i + 1
                    return i + 1
        self._pos = len(text)
        return None
