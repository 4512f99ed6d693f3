"""A chat choice's text shaped into the assistant's message: reasoning, content and tool calls.

What a request gets depends on its :class:`OutputPlan`: the model's reasoning parser (when it has
one) splits ``<think>`` text into ``reasoning_content``; then, with tools offered,

* ``auto``: the model's tool-call parser (app.output.parsing) turns the calls it finds in the content
  into ``tool_calls`` and leaves the rest as content;
* ``required``: the output is the JSON array app.output.tool_choice constrained it to, read as calls;
* a named function: the output is that function's arguments;
* ``none`` (or no tools): the text is content.

Streamed, :class:`ChoiceShaper` turns each piece of text into the deltas it completes: content as
it arrives (text that may open a tool call waits until it is known not to), a tool call's first
delta with its id, type and name, then pieces of its arguments. ``finish_reason`` is
``tool_calls`` when ``auto`` or ``required`` produced calls and the model stopped by itself (a
named function ends with ``stop``, as OpenAI's does).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from app.model_card import ModelCard
from app.output.parser_choice import reasoning_parser_name, tool_parser_name
from app.output.parsing.reasoning import get_reasoning_parser
from app.output.parsing.tool_calls import ContentDelta, ParsedToolCall, get_tool_parser
from app.protocol.chat import ChatCompletionRequest, Delta, ResponseMessage
from app.protocol.tools import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from core.settings import FrontendSettings

ToolMode = Literal["off", "auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class OutputPlan:
    tool_mode: ToolMode = "off"
    #: The model's tool-call parser (app.output.parser_choice): what ``auto`` output is read with, and the
    #: format tools are written into a prompt in (app.prompts.tools); named: the function.
    tool_parser: str = "hermes"
    function: str | None = None
    parallel: bool = True
    reasoning_parser: str | None = None

    @property
    def plain(self) -> bool:
        """The text is the content, unchanged."""
        return self.tool_mode == "off" and self.reasoning_parser is None


def output_plan(body: ChatCompletionRequest, card: ModelCard, frontend: FrontendSettings) -> OutputPlan:
    choice = body.tool_choice
    mode: ToolMode
    if not body.tools or choice == "none":
        mode = "off"
    elif choice is None or choice == "auto":
        mode = "auto"
    elif choice == "required":
        mode = "required"
    else:
        mode = "named"
    return OutputPlan(tool_mode=mode, tool_parser=tool_parser_name(card, frontend),
                      function=None if isinstance(choice, str) or choice is None else choice.function.name,
                      parallel=body.parallel_tool_calls is not False,
                      reasoning_parser=reasoning_parser_name(card, frontend))


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def required_calls(text: str) -> list[ParsedToolCall] | None:
    """The calls of a ``required`` output (None: not the constrained array, e.g. cut short)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in data):
        return None
    return [ParsedToolCall(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in data]


def _split_reasoning(plan: OutputPlan, text: str) -> tuple[str | None, str]:
    if plan.reasoning_parser is None:
        return None, text
    split = get_reasoning_parser(plan.reasoning_parser).split(text)
    if split.reasoning is None:  # no thought: the text is the content, as it came
        return None, text
    return split.reasoning, split.content or ""


def whole_message(plan: OutputPlan, text: str) -> tuple[ResponseMessage, bool]:
    """The assistant message of a whole output, and whether it calls tools."""
    if plan.plain:
        return ResponseMessage("assistant", text), False
    reasoning, content = _split_reasoning(plan, text)
    calls: list[ParsedToolCall] = []
    if plan.tool_mode == "auto":
        parsed = get_tool_parser(plan.tool_parser).parse(content)
        calls = parsed.tool_calls
        if calls:  # without calls the content stays as it came (whitespace included)
            content = parsed.content or ""
    elif plan.tool_mode == "required":
        calls = required_calls(content) or []
        content = "" if calls else content
    elif plan.tool_mode == "named" and plan.function:
        calls, content = [ParsedToolCall(plan.function, content.strip())], ""
    if not plan.parallel:
        calls = calls[:1]
    tool_calls = [ToolCall(call_id(), FunctionCall(c.name, c.arguments)) for c in calls] or None
    return ResponseMessage("assistant", content or (None if tool_calls else ""), reasoning, tool_calls), bool(calls)


def finish_reason(plan: OutputPlan, reason: str | None, called: bool) -> str | None:
    if called and reason == "stop" and plan.tool_mode in ("auto", "required"):
        return "tool_calls"
    return reason


def _merge(deltas: list[Delta]) -> list[Delta]:
    """Adjacent content (or reasoning) deltas as one."""
    out: list[Delta] = []
    for d in deltas:
        last = out[-1] if out else None
        if last is not None and d.tool_calls is None and last.tool_calls is None:
            if d.content is not None and last.content is not None and last.reasoning_content is None:
                out[-1] = Delta(content=last.content + d.content)
                continue
            if d.reasoning_content is not None and last.reasoning_content is not None and last.content is None:
                out[-1] = Delta(reasoning_content=last.reasoning_content + d.reasoning_content)
                continue
        out.append(d)
    return out


@dataclass
class ChoiceShaper:
    """One streamed choice's deltas (see the module's docstring)."""

    plan: OutputPlan
    called: bool = False
    _ids: dict[int, str] = field(default_factory=dict)
    _held: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        plan = self.plan
        self._reasoning = get_reasoning_parser(plan.reasoning_parser).streamer() if plan.reasoning_parser else None
        self._tools = get_tool_parser(plan.tool_parser).streamer() if plan.tool_mode == "auto" else None

    def feed(self, text: str) -> list[Delta]:
        if self.plan.plain:
            return [Delta(content=text)]
        pieces = self._reasoning.feed(text) if self._reasoning else [("content", text)]
        return _merge(self._shape(pieces, end=False))

    def finish(self) -> list[Delta]:
        if self.plan.plain:
            return []
        pieces = self._reasoning.finish() if self._reasoning else []
        return _merge(self._shape(pieces, end=True))

    def _shape(self, pieces: Sequence[tuple[str, str]], *, end: bool) -> list[Delta]:
        out: list[Delta] = []
        for kind, text in pieces:
            if kind == "reasoning":
                out.append(Delta(reasoning_content=text))
            else:
                out += self._content(text)
        if end:
            out += self._content_end()
        return out

    def _call(self, index: int, name: str | None, arguments: str) -> Delta:
        self.called = True
        if name is not None and index not in self._ids:
            self._ids[index] = call_id()
            return Delta(tool_calls=[DeltaToolCall(index, DeltaFunctionCall(name, arguments), self._ids[index],
                                                   "function")])
        return Delta(tool_calls=[DeltaToolCall(index, DeltaFunctionCall(arguments=arguments))])

    def _content(self, text: str) -> list[Delta]:
        mode = self.plan.tool_mode
        if mode == "off":
            return [Delta(content=text)] if text else []
        if mode == "named" and self.plan.function:
            return [self._call(0, self.plan.function if 0 not in self._ids else None, text)] if text else []
        if mode == "required":
            self._held.append(text)
            return []
        assert self._tools is not None
        return self._tool_events(self._tools.feed(text))

    def _content_end(self) -> list[Delta]:
        mode = self.plan.tool_mode
        if mode == "required":
            text = "".join(self._held)
            calls = required_calls(text)
            if calls is None:
                return [Delta(content=text)] if text else []
            calls = calls if self.plan.parallel else calls[:1]
            return [self._call(i, c.name, c.arguments) for i, c in enumerate(calls)]
        if mode == "auto" and self._tools is not None:
            return self._tool_events(self._tools.finish())
        return []

    def _tool_events(self, events: list) -> list[Delta]:
        out: list[Delta] = []
        for e in events:
            if isinstance(e, ContentDelta):
                if e.text:
                    out.append(Delta(content=e.text))
            elif self.plan.parallel or e.index == 0:
                out.append(self._call(e.index, e.name, e.arguments))
        return out
