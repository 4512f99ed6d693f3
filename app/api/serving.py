"""What the chat and completions handlers share: from prompt ids to a started generation, and the
``x-sluice-worker`` response header naming the worker that served the request."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from starlette.types import Receive, Scope, Send

from app.accounts.service import Principal
from app.api.deps import router_overrides
from app.api.sse import StreamingEvents
from app.generation import Generation, GenerationSpec, resolve_max_tokens, sampling_from
from app.model_card import ModelCard
from app.protocol.common import SamplingFields
from app.runtime import FrontendRuntime

WORKER_HEADER = "x-sluice-worker"


async def start_generation(rt: FrontendRuntime, request: Request, body: SamplingFields, card: ModelCard,
                           principal: Principal | None, prompt_ids: list[int],
                           requested_max_tokens: int | None) -> Generation:
    """Check limits, routing parameters and quotas, route and enqueue. Nothing leaks if this raises."""
    max_tokens = resolve_max_tokens(requested_max_tokens, len(prompt_ids), card.context_length,
                                    rt.settings.frontend.default_max_tokens)
    ext = body.sluice.router.model_dump() if body.sluice and body.sluice.router else None
    overrides = router_overrides(request.headers.get("x-sluice-router"), ext)
    if overrides.mode is not None:
        rt.policy(overrides.mode)  # an unknown mode is the client's mistake: 400 before any quota is spent
    sampling = sampling_from(body.temperature, body.top_p, body.seed, max_tokens, body.stop_token_ids,
                             body.ignore_eos, body.min_tokens)
    await rt.accounts.admit(principal, body.model, len(prompt_ids))
    spec = GenerationSpec(model=body.model, prompt_token_ids=prompt_ids, stops=tuple(body.stop_strings()),
                          sampling=sampling, overrides=overrides)
    gen = Generation(rt, spec, card, principal)
    try:
        await gen.start()
    except BaseException:
        await gen.close()
        raise
    return gen


def worker_header(gen: Generation) -> dict[str, str]:
    """``x-sluice-worker: <worker id>`` once the worker is known (pool mode learns it from the first delta)."""
    worker = gen.served_by
    return {WORKER_HEADER: worker} if worker else {}


class GenerationEvents(StreamingEvents):
    """The SSE response of a started generation. The events generator closes the generation when it
    ends; if the client leaves before the generator ever ran, the response closes it here, so the
    router's prediction and the stream registration never leak."""

    def __init__(self, events: AsyncIterator[bytes], gen: Generation) -> None:
        super().__init__(events)
        self.generation = gen
        self.headers.update(worker_header(gen))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.generation.close()


def streaming_response(events: AsyncIterator[bytes], gen: Generation) -> StreamingEvents:
    """The SSE response of a started generation, naming its worker in the headers."""
    return GenerationEvents(events, gen)
