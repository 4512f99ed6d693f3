"""Reading Redis replies whose type redis-py cannot know ahead: bytes, or str on a client made with
``decode_responses`` (the project's own clients never are; tests' and tools' may be)."""

from __future__ import annotations


def text(raw: bytes | str) -> str:
    """A reply's string, from either form."""
    return raw.decode() if isinstance(raw, bytes) else raw


#: An argument of a Lua script call, as redis-py takes it.
ScriptArg = bytes | str | int | float
