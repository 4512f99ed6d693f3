"""``POST /tokenize`` and ``/detokenize`` (vLLM's, with the served model's own tokenizer and chat
template: the ids a generation request would be given) and ``GET /version``."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter
from starlette.responses import Response

from app.api.deps import CallerDep, RuntimeDep
from app.api.openapi import error_responses
from app.model_card import ModelCard
from app.output.parser_choice import tool_parser_name
from app.prompts.rendering import chat_prompt_ids, check_chars, check_tokens
from app.protocol.common import encode
from app.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    VersionResponse,
)
from app.runtime import FrontendRuntime
from core.errors import InvalidRequest

router = APIRouter()


async def _card(rt: FrontendRuntime, model: str | None) -> ModelCard:
    """The named model's card; with no name, the one model served (vLLM's servers serve one)."""
    if model is None:
        served = sorted(rt.directory.served_models())
        if len(served) != 1:
            raise InvalidRequest(f"name the model: {len(served)} are served ({', '.join(served) or 'none'})",
                                 param="model")
        model = served[0]
    return await rt.directory.card(model)


def _json(body: object) -> Response:
    return Response(encode(body), media_type="application/json")


@router.post("/tokenize", responses=error_responses(400, 401, 404, 413, 503))
async def tokenize(body: TokenizeCompletionRequest | TokenizeChatRequest, rt: RuntimeDep, _: CallerDep) -> Response:
    card = await _card(rt, body.model)
    if isinstance(body, TokenizeChatRequest):
        ids = await chat_prompt_ids(card, body, tool_parser_name(card, rt.settings.frontend))
    else:
        check_chars(card, len(body.prompt), "prompt")
        ids = await card.off_loop(card.encode, body.prompt, add_special_tokens=body.add_special_tokens)
        check_tokens(card, len(ids), "prompt")
    strs = [card.tokenizer.id_to_token(i) or "" for i in ids] if body.return_token_strs else None
    return _json(TokenizeResponse(count=len(ids), max_model_len=card.context_length, tokens=ids, token_strs=strs))


@router.post("/detokenize", responses=error_responses(400, 401, 404, 413, 503))
async def detokenize(body: DetokenizeRequest, rt: RuntimeDep, _: CallerDep) -> Response:
    card = await _card(rt, body.model)
    vocab = card.tokenizer.get_vocab_size(with_added_tokens=True)
    if any(t >= vocab for t in body.tokens):
        raise InvalidRequest(f"token ids must be below the vocabulary size {vocab}", param="tokens")
    return _json(DetokenizeResponse(prompt=card.decode(body.tokens)))


@router.get("/version")
async def sluice_version() -> Response:
    try:
        found = version("sluice")
    except PackageNotFoundError:
        found = "unknown"
    return _json(VersionResponse(version=found))
