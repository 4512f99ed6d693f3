"""``POST /v1/chat/completions``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import RuntimeDep
from app.api.errors import error_payload
from app.api.serving import start_generation, streaming_response, worker_header
from app.api.sse import DONE, sse_event
from app.generation import Generation
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
from app.protocol.common import encode, make_usage
from core.errors import InvalidRequest, SluiceError

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, rt: RuntimeDep) -> Response:
    principal = await rt.accounts.authenticate(request.headers.get("authorization"))
    if body.n > rt.settings.frontend.max_n:
        raise InvalidRequest(f"n must be at most {rt.settings.frontend.max_n}", param="n")
    card = await rt.directory.card(body.model)
    prompt_ids = await chat_prompt_ids(card, body)
    gen = await start_generation(rt, request, body, card, principal, prompt_ids, body.token_limit())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return streaming_response(_stream(gen, body.model, include_usage), gen)
    async with gen:
        text = "".join([piece async for piece in gen.text()])
    return Response(encode(ChatCompletion(
        id=f"chatcmpl-{gen.request_id}", created=int(time.time()), model=body.model,
        choices=[ChatChoice(0, ResponseMessage("assistant", text), gen.finish_reason)],
        usage=make_usage(gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens))),
        media_type="application/json", headers=worker_header(gen))


async def _stream(gen: Generation, model: str, include_usage: bool):  # type: ignore[no-untyped-def]
    cid, created = f"chatcmpl-{gen.request_id}", int(time.time())

    def chunk(delta: Delta, finish: str | None = None) -> bytes:
        return sse_event(encode(ChatCompletionChunk(cid, created, model, [ChunkChoice(0, delta, finish)])))

    # Events that are ready together go out in one write: the role chunk with the first text, and
    # the finish chunk, usage and [DONE] at the end (each write is a send on the socket).
    head = chunk(Delta(role="assistant", content=""))
    async with gen:
        try:
            async for text in gen.text():
                yield head + chunk(Delta(content=text))
                head = b""
            tail = head + chunk(Delta(), gen.finish_reason)
            if include_usage:
                tail += sse_event(encode(ChatCompletionChunk(cid, created, model, [], usage=make_usage(
                    gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens))))
        except SluiceError as exc:
            tail = head + sse_event(error_payload(exc))
        yield tail + DONE
