"""Pythonic tool calls (Llama 3.2 / Llama 4, ToolACE): output that, after whitespace and an optional
``<|python_start|>``, is a Python list of calls, ``[get_weather(city='Paris'), get_time()]``,
optionally followed by ``<|python_end|>``.

The list is read with ``ast`` (never evaluated): every element must be a call of a (dotted) name
with keyword arguments only, each a literal (str, int, float, bool, None, and lists, tuples and
dicts of them; JSON's ``true``/``false``/``null`` are read too, as models trained on JSON write
them). Anything else is content. Streaming: an output that starts with ``[`` is buffered until its
brackets close, then decoded; text after the list is content. Any other output streams as content.
"""

from __future__ import annotations

import ast
import math
from enum import Enum, auto
from typing import ClassVar

from app.output.parsing.base import (
    ContentDelta,
    HeldText,
    ParsedOutput,
    ParsedToolCall,
    StreamEvent,
    dump_arguments,
    emit_calls,
    parse_whole,
)
from app.output.parsing.scan import BracketScanner, skip_lead

START = "<|python_start|>"
END = "<|python_end|>"
_JSON_NAMES: dict[str, object] = {"true": True, "false": False, "null": None}


class _NotACall(Exception):
    """Raised inside the AST walk to abandon a list that is not a list of calls."""


def decode_call_list(source: str) -> list[ParsedToolCall] | None:
    """The calls in ``source`` (a Python list literal of calls), or None when it is not one."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
        if not isinstance(tree.body, ast.List) or not tree.body.elts:
            return None
        return [_call(node) for node in tree.body.elts]
    except (SyntaxError, ValueError, RecursionError, MemoryError, _NotACall):
        return None


def _call(node: ast.expr) -> ParsedToolCall:
    if not isinstance(node, ast.Call) or node.args:
        raise _NotACall
    arguments: dict[str, object] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise _NotACall
        arguments[keyword.arg] = _literal(keyword.value)
    return ParsedToolCall(name=_dotted_name(node.func), arguments=dump_arguments(arguments))


def _dotted_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise _NotACall


def _literal(node: ast.expr) -> object:
    """The JSON value of a literal node; raises _NotACall for anything JSON cannot carry."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        raise _NotACall
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _literal(node.operand)
        if isinstance(operand, bool) or not isinstance(operand, int | float):
            raise _NotACall
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, object] = {}
        for key, item in zip(node.keys, node.values, strict=True):
            if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
                raise _NotACall
            out[key.value] = _literal(item)
        return out
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise _NotACall


class _State(Enum):
    LEAD = auto()
    LIST = auto()
    AFTER = auto()
    CONTENT = auto()


class PythonicStreamer(HeldText[StreamEvent]):
    """One output's state; while in ``LIST`` the list starts at ``_scanner``'s start, the lead before
    it still held so that a list that is not calls is told as content whole."""

    __slots__ = ("_state", "_scanner", "_list_at")

    def __init__(self) -> None:
        super().__init__()
        self._state = _State.LEAD
        self._scanner = BracketScanner("'\"")
        self._list_at = 0

    def _drain(self, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while self._held:
            held = self._held
            if self._state is _State.LEAD:
                at = skip_lead(held, START)
                if at is None and not final:
                    return events
                if at is None or held[at] != "[":
                    self._state = _State.CONTENT
                    continue
                self._state, self._list_at, self._scanner = _State.LIST, at, BracketScanner("'\"", at)
            elif self._state is _State.LIST:
                end = self._scanner.end(held)
                if end is None and not final:
                    return events
                calls = None if end is None else decode_call_list(held[self._list_at:end])
                if end is None or calls is None:
                    self._state = _State.CONTENT
                    continue
                events.extend(emit_calls(calls, 0))
                self._held, self._state = held[end:], _State.AFTER
            elif self._state is _State.AFTER:
                at = skip_lead(held, END)
                if at is None and not final:
                    return events
                if at is None and held.strip() in ("", END):
                    self._held = ""
                    return events
                self._held = held if at is None or END not in held[:at] else held[at:]
                self._state = _State.CONTENT
            else:
                events.append(ContentDelta(held))
                self._held = ""
        return events


class PythonicParser:
    name: ClassVar[str] = "pythonic"

    def parse(self, text: str) -> ParsedOutput:
        return parse_whole(self.streamer(), text)

    def streamer(self) -> PythonicStreamer:
        return PythonicStreamer()
