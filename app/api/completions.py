"""``POST /v1/completions``: one prompt, text or token ids, continued; ``echo`` puts the prompt in
front of the completion (streamed: ahead of the first text)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import CallerDep, RuntimeDep
from app.api.openapi import STREAM_RESPONSE, error_responses
from app.api.serving import Endpoint, serve
from app.model_card import ModelCard
from app.output.logprobs import Entries, PromptEntries, completion_logprobs
from app.prompts.rendering import completion_prompt_ids
from app.protocol.completions import Completion, CompletionChoice, CompletionRequest
from app.protocol.logprobs import CompletionLogprobs
from core.errors import InvalidRequest

router = APIRouter()


class Completions(Endpoint):
    id_prefix = "cmpl-"
    chunk = Completion
    response = Completion

    def __init__(self, body: CompletionRequest) -> None:
        prompts = body.prompts()
        if len(prompts) != 1:
            raise InvalidRequest("exactly one prompt per request is supported", param="prompt")
        self.body = body
        self.prompt = prompts[0]
        self.echo = ""

    async def prompt_ids(self, card: ModelCard) -> list[int]:
        ids = await completion_prompt_ids(card, self.prompt)
        if self.body.echo:
            self.echo = self.prompt if isinstance(self.prompt, str) else card.decode(ids)
        return ids

    @property
    def max_tokens(self) -> int | None:
        return self.body.max_tokens

    @property
    def logprobs(self) -> int | None:
        return self.body.logprobs

    def format_logprobs(self, card: ModelCard, entries: Entries, offset: int) -> CompletionLogprobs:
        return completion_logprobs(card, entries, offset)

    @property
    def prompt_logprobs(self) -> int | None:
        return self.body.logprobs if self.body.echo else None

    def format_prompt_logprobs(self, card: ModelCard, entries: PromptEntries) -> CompletionLogprobs | None:
        return completion_logprobs(card, entries, 0) if entries else None

    def opening(self, index: int = 0, logprobs: CompletionLogprobs | None = None) -> CompletionChoice | None:
        return CompletionChoice(index, self.echo, None, logprobs) if self.echo else None

    def opening_text(self) -> str:
        return self.echo

    def delta(self, text: str | None, finish_reason: str | None = None, index: int = 0,
              logprobs: CompletionLogprobs | None = None) -> CompletionChoice:
        return CompletionChoice(index, text or "", finish_reason, logprobs)

    def whole(self, text: str, finish_reason: str | None, index: int = 0,
              logprobs: CompletionLogprobs | None = None) -> CompletionChoice:
        return CompletionChoice(index, self.echo + text, finish_reason, logprobs)


@router.post("/v1/completions", responses={**STREAM_RESPONSE, **error_responses(400, 401, 403, 404, 413, 429, 502, 503)})
async def completions(body: CompletionRequest, request: Request, rt: RuntimeDep, principal: CallerDep) -> Response:
    return await serve(rt, request, body, principal, Completions)
