"""``POST /v1/chat/completions``: the chat template renders the messages; the reply is one assistant
message, streamed as deltas that open with the assistant's role."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import CallerDep, RuntimeDep
from app.api.openapi import STREAM_RESPONSE, error_responses
from app.api.serving import Endpoint, serve
from app.logprobs import Entries, chat_logprobs
from app.model_card import ModelCard
from app.prompting import chat_prompt_ids
from app.protocol.chat import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    Delta,
    ResponseMessage,
)
from app.protocol.logprobs import ChatLogprobs

router = APIRouter()


class Chat(Endpoint):
    id_prefix = "chatcmpl-"
    chunk = ChatCompletionChunk
    response = ChatCompletion

    def __init__(self, body: ChatCompletionRequest) -> None:
        self.body = body

    async def prompt_ids(self, card: ModelCard) -> list[int]:
        return await chat_prompt_ids(card, self.body)

    @property
    def max_tokens(self) -> int | None:
        return self.body.token_limit()

    def opening(self, index: int = 0) -> ChunkChoice:
        return ChunkChoice(index, Delta(role="assistant", content=""))

    @property
    def logprobs(self) -> int | None:
        return (self.body.top_logprobs or 0) if self.body.logprobs else None

    def format_logprobs(self, card: ModelCard, entries: Entries, offset: int) -> ChatLogprobs:
        return chat_logprobs(card, entries)

    def delta(self, text: str | None, finish_reason: str | None = None, index: int = 0,
              logprobs: ChatLogprobs | None = None) -> ChunkChoice:
        return ChunkChoice(index, Delta(content=text), finish_reason, logprobs)

    def whole(self, text: str, finish_reason: str | None, index: int = 0,
              logprobs: ChatLogprobs | None = None) -> ChatChoice:
        return ChatChoice(index, ResponseMessage("assistant", text), finish_reason, logprobs)


@router.post("/v1/chat/completions", responses={**STREAM_RESPONSE, **error_responses(400, 401, 403, 404, 413, 429, 502, 503)})
async def chat_completions(body: ChatCompletionRequest, request: Request, rt: RuntimeDep,
                           principal: CallerDep) -> Response:
    return await serve(rt, request, body, principal, Chat)
