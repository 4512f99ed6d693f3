"""``/tokenize``, ``/detokenize`` and ``/version`` shapes, as vLLM's server has them."""

from __future__ import annotations

from typing import Annotated

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from app.protocol.chat import ChatMessage
from app.protocol.fields import Flag, NonEmptyText, Text, TokenId
from app.protocol.tools import ToolDefinition


class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: NonEmptyText | None = None
    prompt: Text
    add_special_tokens: Flag = True
    return_token_strs: Flag = False


class TokenizeChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: NonEmptyText | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: Flag = True
    tools: list[ToolDefinition] | None = None
    return_token_strs: Flag = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: NonEmptyText | None = None
    tokens: list[TokenId]


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(msgspec.Struct):
    prompt: str


class VersionResponse(msgspec.Struct):
    version: str
