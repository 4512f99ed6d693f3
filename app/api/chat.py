"""``POST /v1/chat/completions``: the chat template renders the messages (and tools); the reply is
one assistant message per choice, streamed as deltas that open with the assistant's role. Its text
is shaped into reasoning, content and tool calls by app.output.chat."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import CallerDep, RuntimeDep
from app.api.openapi import STREAM_RESPONSE, error_responses
from app.api.serving import Endpoint, serve
from app.model_card import ModelCard
from app.output.chat import ChoiceShaper, OutputPlan, output_plan, whole_message
from app.output.chat import finish_reason as finish_reason_of
from app.output.logprobs import Entries, chat_logprobs
from app.prompts.rendering import chat_prompt_ids
from app.protocol.chat import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    Delta,
    check_tools,
)
from app.protocol.logprobs import ChatLogprobs
from core.settings import FrontendSettings

router = APIRouter()


class Chat(Endpoint):
    id_prefix = "chatcmpl-"
    chunk = ChatCompletionChunk
    response = ChatCompletion

    def __init__(self, body: ChatCompletionRequest) -> None:
        check_tools(body)
        self.body = body
        self.plan = OutputPlan()
        #: Streaming: each choice's shaper, and the logprobs of text it holds back.
        self._shapers: dict[int, ChoiceShaper] = {}
        self._held_logprobs: dict[int, ChatLogprobs] = {}

    def prepare(self, card: ModelCard, frontend: FrontendSettings) -> None:
        self.plan = output_plan(self.body, card, frontend)

    async def prompt_ids(self, card: ModelCard) -> list[int]:
        return await chat_prompt_ids(card, self.body, self.plan.tool_parser)

    @property
    def max_tokens(self) -> int | None:
        return self.body.token_limit()

    def opening(self, index: int = 0, logprobs: ChatLogprobs | None = None) -> ChunkChoice:
        return ChunkChoice(index, Delta(role="assistant", content=""))

    @property
    def logprobs(self) -> int | None:
        return (self.body.top_logprobs or 0) if self.body.logprobs else None

    def format_logprobs(self, card: ModelCard, entries: Entries, offset: int) -> ChatLogprobs:
        return chat_logprobs(card, entries)

    def delta(self, text: str | None, finish_reason: str | None = None, index: int = 0,
              logprobs: ChatLogprobs | None = None) -> ChunkChoice:
        return ChunkChoice(index, Delta(content=text), finish_reason, logprobs)

    def _shaper(self, index: int) -> ChoiceShaper:
        shaper = self._shapers.get(index)
        if shaper is None:
            shaper = self._shapers[index] = ChoiceShaper(self.plan)
        return shaper

    def _with_logprobs(self, index: int, deltas: list[Delta], logprobs: ChatLogprobs | None,
                       finish_reason: str | None = None, end: bool = False) -> list[ChunkChoice]:
        """The deltas as streamed choices; logprobs of text held back go out with the next delta."""
        held = self._held_logprobs.pop(index, None)
        if held is not None and logprobs is not None:
            logprobs = ChatLogprobs(held.content + logprobs.content)
        else:
            logprobs = held or logprobs
        if end:
            return [ChunkChoice(index, d) for d in deltas] + [ChunkChoice(index, Delta(), finish_reason, logprobs)]
        if not deltas:
            if logprobs is not None:
                self._held_logprobs[index] = logprobs
            return []
        return [ChunkChoice(index, deltas[0], None, logprobs)] + [ChunkChoice(index, d) for d in deltas[1:]]

    def stream_text(self, index: int, text: str, logprobs: ChatLogprobs | None) -> list[ChunkChoice]:
        if self.plan.plain:
            return [self.delta(text, index=index, logprobs=logprobs)]
        return self._with_logprobs(index, self._shaper(index).feed(text), logprobs)

    def stream_end(self, index: int, finish_reason: str | None, logprobs: ChatLogprobs | None) -> list[ChunkChoice]:
        if self.plan.plain:
            return [self.delta(None, finish_reason, index, logprobs)]
        shaper = self._shaper(index)
        deltas = shaper.finish()
        return self._with_logprobs(index, deltas, logprobs,
                                   finish_reason_of(self.plan, finish_reason, shaper.called), end=True)

    def whole(self, text: str, finish_reason: str | None, index: int = 0,
              logprobs: ChatLogprobs | None = None) -> ChatChoice:
        message, called = whole_message(self.plan, text)
        return ChatChoice(index, message, finish_reason_of(self.plan, finish_reason, called), logprobs)


@router.post("/v1/chat/completions", responses={**STREAM_RESPONSE, **error_responses(400, 401, 403, 404, 413, 429, 502, 503)})
async def chat_completions(body: ChatCompletionRequest, request: Request, rt: RuntimeDep,
                           principal: CallerDep) -> Response:
    return await serve(rt, request, body, principal, Chat)
