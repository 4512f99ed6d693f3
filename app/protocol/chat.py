"""``/v1/chat/completions`` request and response shapes (OpenAI field order)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

import msgspec
from pydantic import AfterValidator, ConfigDict, Discriminator, Field, Strict, Tag, model_validator
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from app.protocol.common import SamplingFields, UsageInfo
from app.protocol.fields import Flag, Text, TokenCount, valid_unicode
from app.protocol.logprobs import ChatLogprobs
from app.protocol.structured import ResponseFormat
from app.protocol.tools import DeltaToolCall, MessageToolCall, ToolCall, ToolChoice, ToolDefinition
from core.errors import InvalidRequest

# Messages and their parts are TypedDicts, not models: validating one is several times cheaper,
# and a body within the size limit may hold a hundred thousand of them.


class TextPart(TypedDict):
    type: Literal["text"]
    text: Text


def _content_shape(content: Any) -> str | None:
    return "text" if isinstance(content, str) else "parts" if isinstance(content, list) else None


def _valid_content(content: str | list[TextPart]) -> str | list[TextPart]:
    return valid_unicode(content) if isinstance(content, str) else content


#: A message's content: a string, or text parts. Only the shape given is validated, so an error
#: names the part at fault.
Content = Annotated[
    Annotated[
        Annotated[str, Tag("text")] | Annotated[list[TextPart], Tag("parts")],
        Discriminator(_content_shape, custom_error_type="content_type",
                      custom_error_message="content must be a string or a list of content parts"),
    ],
    AfterValidator(_valid_content),
]


class ChatMessage(TypedDict):
    # pydantic reads its config from this attribute, which the typing spec does not allow on a TypedDict.
    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: NotRequired[Content | None]
    name: NotRequired[Text | None]
    #: An assistant message's calls, and a ``tool`` message's answer to one of them.
    tool_calls: NotRequired[list[MessageToolCall] | None]
    tool_call_id: NotRequired[Text | None]


def message_text(message: ChatMessage) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content)


def check_tools(body: ChatCompletionRequest) -> None:
    """A 400 for tools, a tool choice or tool messages that do not fit together."""
    names = [t.function.name for t in body.tools or ()]
    if len(set(names)) != len(names):
        raise InvalidRequest("function names must be unique among the tools", param="tools")
    choice = body.tool_choice
    if choice == "required" and not names:
        raise InvalidRequest("tool_choice 'required' needs tools", param="tool_choice")
    if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        raise InvalidRequest(f"tool_choice names function {choice.function.name!r}, which is not among the tools",
                             param="tool_choice")
    for i, m in enumerate(body.messages):
        if m["role"] == "tool" and not m.get("tool_call_id"):
            raise InvalidRequest("a tool message needs the tool_call_id it answers", param=f"messages.{i}.tool_call_id")


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: Flag | None = None
    top_logprobs: Annotated[int, Strict(), Field(ge=0, le=20)] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Flag | None = None
    response_format: ResponseFormat | None = None
    add_generation_prompt: Flag = True

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ResponseMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    object: str = "chat.completion"
    system_fingerprint: str | None = None


class Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: str = "chat.completion.chunk"
    usage: UsageInfo | None = None
