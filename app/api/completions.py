"""``POST /v1/completions``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import RuntimeDep
from app.api.errors import error_payload
from app.api.serving import start_generation, streaming_response, worker_header
from app.api.sse import DONE, sse_event
from app.generation import Generation
from app.prompting import completion_prompt_ids
from app.protocol.common import encode, make_usage
from app.protocol.completions import Completion, CompletionChoice, CompletionRequest
from core.errors import InvalidRequest, SluiceError

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, rt: RuntimeDep) -> Response:
    principal = await rt.accounts.authenticate(request.headers.get("authorization"))
    if body.n > rt.settings.frontend.max_n:
        raise InvalidRequest(f"n must be at most {rt.settings.frontend.max_n}", param="n")
    prompts = body.prompts()
    if len(prompts) != 1:
        raise InvalidRequest("exactly one prompt per request is supported", param="prompt")
    card = await rt.directory.card(body.model)
    prompt_ids = await completion_prompt_ids(card, prompts[0])
    gen = await start_generation(rt, request, body, card, principal, prompt_ids, body.max_tokens)
    echo = prompts[0] if body.echo and isinstance(prompts[0], str) else (
        card.decode(prompt_ids) if body.echo else "")
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return streaming_response(_stream(gen, body.model, include_usage, echo), gen)
    async with gen:
        text = "".join([piece async for piece in gen.text()])
    return Response(encode(Completion(
        id=f"cmpl-{gen.request_id}", created=int(time.time()), model=body.model,
        choices=[CompletionChoice(0, echo + text, gen.finish_reason)],
        usage=make_usage(gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens))),
        media_type="application/json", headers=worker_header(gen))


async def _stream(gen: Generation, model: str, include_usage: bool, echo: str):  # type: ignore[no-untyped-def]
    cid, created = f"cmpl-{gen.request_id}", int(time.time())

    def chunk(text: str, finish: str | None = None) -> bytes:
        return sse_event(encode(Completion(cid, created, model, [CompletionChoice(0, text, finish)])))

    head = chunk(echo) if echo else b""  # sent with the first text (one write), as in chat.py
    async with gen:
        try:
            async for text in gen.text():
                yield head + chunk(text)
                head = b""
            tail = head + chunk("", gen.finish_reason)
            if include_usage:
                tail += sse_event(encode(Completion(cid, created, model, [], usage=make_usage(
                    gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens))))
        except SluiceError as exc:
            tail = head + sse_event(error_payload(exc))
        yield tail + DONE
