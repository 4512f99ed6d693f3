"""``tool_choice`` ``required`` and a named function, guaranteed by structured outputs.

A model may answer free-form however it is prompted, so vLLM's way is followed: the output is
constrained to a JSON schema. ``required``: an array of one or more calls (one at most when
``parallel_tool_calls`` is false), each ``{"name": <one of the tools>, "parameters": <its
arguments' schema>}``. A named function: the function's arguments object itself. The engine's
structured-output backend enforces the schema (an engine without one answers 400, app.output.structured),
and app.output.chat reads the constrained text back as tool calls.
"""

from __future__ import annotations

import json
from typing import Any

from app.protocol.chat import ChatCompletionRequest
from app.protocol.tools import ToolDefinition
from core.messages import StructuredOutput

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _parameters(tool: ToolDefinition) -> dict[str, Any]:
    return tool.function.parameters or _ANY_OBJECT


def required_schema(tools: list[ToolDefinition], parallel: bool) -> dict[str, Any]:
    calls = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": _parameters(t)},
              "required": ["name", "parameters"]} for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def tool_constraint(body: ChatCompletionRequest) -> StructuredOutput | None:
    """The output constraint ``tool_choice`` asks for (None: ``auto``, ``none`` or no tools)."""
    choice, tools = body.tool_choice, body.tools
    if not tools or choice is None or choice in ("auto", "none"):
        return None
    if choice == "required":
        return StructuredOutput(json=json.dumps(required_schema(tools, body.parallel_tool_calls is not False)))
    assert not isinstance(choice, str)
    tool = next(t for t in tools if t.function.name == choice.function.name)
    return StructuredOutput(json=json.dumps(_parameters(tool)))
