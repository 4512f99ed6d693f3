"""What the chat and completions handlers share: from prompt ids to a started generation."""

from __future__ import annotations

from fastapi import Request

from app.accounts.service import Principal
from app.api.deps import router_overrides
from app.generation import Generation, GenerationSpec, resolve_max_tokens, sampling_from
from app.model_card import ModelCard
from app.protocol.common import SamplingFields
from app.runtime import FrontendRuntime


async def start_generation(rt: FrontendRuntime, request: Request, body: SamplingFields, card: ModelCard,
                           principal: Principal | None, prompt_ids: list[int],
                           requested_max_tokens: int | None) -> Generation:
    """Check limits and quotas, route and enqueue. Nothing leaks if this raises."""
    max_tokens = resolve_max_tokens(requested_max_tokens, len(prompt_ids), card.context_length,
                                    rt.settings.frontend.default_max_tokens)
    await rt.accounts.admit(principal, body.model, len(prompt_ids))
    ext = body.sluice.router.model_dump() if body.sluice and body.sluice.router else None
    spec = GenerationSpec(
        model=body.model, prompt_token_ids=prompt_ids, stops=tuple(body.stop_strings()),
        sampling=sampling_from(body.temperature, body.top_p, body.seed, max_tokens, body.stop_token_ids,
                               body.ignore_eos, body.min_tokens),
        overrides=router_overrides(request.headers.get("x-sluice-router"), ext))
    gen = Generation(rt, spec, card, principal)
    try:
        await gen.start()
    except BaseException:
        await gen.close()
        raise
    return gen
