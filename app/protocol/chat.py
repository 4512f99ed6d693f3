"""``/v1/chat/completions`` request and response shapes (OpenAI field order)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.protocol.common import SamplingFields, UsageInfo


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _unsupported(self) -> ChatCompletionRequest:
        if self.logprobs:
            raise ValueError("logprobs are not supported")
        if self.tools:
            raise ValueError("tools are not supported")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ValueError("only response_format type 'text' is supported")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ResponseMessage(msgspec.Struct):
    role: str
    content: str


class ChatChoice(msgspec.Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: None = None


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


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: str = "chat.completion.chunk"
    usage: UsageInfo | None = None
