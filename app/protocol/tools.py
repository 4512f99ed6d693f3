"""Tool-calling request and response shapes: ``tools``, ``tool_choice``, an assistant message's
``tool_calls`` and a ``tool`` message's ``tool_call_id`` (OpenAI's names and field order).

A function's name follows OpenAI's rule (letters, digits, ``_`` and ``-``, at most 64); its
``parameters`` are a JSON schema object (absent: a function without arguments).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

from app.protocol.fields import Flag, Text

FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: Flag | None = None


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName


class NamedToolChoice(BaseModel):
    """``{"type": "function", "function": {"name": ...}}``: call this function."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


# In messages (TypedDicts, as the messages are: app.protocol.chat).
class CalledFunction(TypedDict):
    name: FunctionName
    arguments: Text


class MessageToolCall(TypedDict):
    id: Text
    type: Literal["function"]
    function: CalledFunction


# In responses.
class FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class DeltaFunctionCall(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, omit_defaults=True):
    """A streamed piece of tool call ``index``: its first carries ``id``, ``type`` and the name, the
    next ones more of its arguments."""

    index: int
    function: DeltaFunctionCall
    id: str | None = None
    type: str | None = None
