"""What the chat and completions endpoints share: everything but their own request, prompt and
response shapes.

An endpoint module defines an :class:`Endpoint` (how its prompt is built, how big a completion it
asked for, which objects its responses are made of) and hands it to :func:`serve`, which does the
rest in this order: the frontend's limits, the endpoint's own checks, the model card, the prompt,
admission and routing (:func:`start_generation`), then the response, streamed or whole. Every
response names its worker in ``x-sluice-worker``.
"""

from __future__ import annotations

import abc
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, TypeVar

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.accounts.service import Principal
from app.api.deps import router_overrides
from app.api.sse import DONE, StreamingEvents, sse_event
from app.generation import Generation, GenerationSpec, resolve_max_tokens, sampling_from
from app.metrics import error_type
from app.model_card import ModelCard
from app.protocol.common import SamplingFields, UsageInfo, encode, make_usage
from app.runtime import FrontendRuntime
from core.errors import InvalidRequest, RequestPlaneUnavailable, ShuttingDown, SluiceError
from core.http_errors import error_payload

WORKER_HEADER = "x-sluice-worker"
#: Disaggregated requests: the prefill worker that computed the prompt (absent: prefilled locally).
PREFILL_WORKER_HEADER = "x-sluice-prefill-worker"

Body = TypeVar("Body", bound=SamplingFields)


class Endpoint(abc.ABC):
    """One request to a generation endpoint, in what the endpoint does its own way. Made from the
    validated body once the frontend's limits are checked; its constructor makes the endpoint's own
    checks (those that need no model card)."""

    #: Responses are identified by this prefix and the request id.
    id_prefix: ClassVar[str]
    #: Makes a streamed chunk: ``(id, created, model, choices, usage=None)``.
    chunk: ClassVar[Callable[..., Any]]
    #: Makes a whole (not streamed) response: ``(id, created, model, choices, usage=...)``.
    response: ClassVar[Callable[..., Any]]

    @abc.abstractmethod
    async def prompt_ids(self, card: ModelCard) -> list[int]:
        """The prompt in the model's tokens; raises InvalidRequest for a prompt the model cannot take."""

    @property
    @abc.abstractmethod
    def max_tokens(self) -> int | None:
        """The completion length the request asked for (None: whatever fits)."""

    def opening(self) -> Any | None:
        """The choice streamed ahead of the first text, in the same write (None: nothing)."""
        return None

    @abc.abstractmethod
    def delta(self, text: str | None, finish_reason: str | None = None) -> Any:
        """A streamed choice: new ``text``, or (``None``) the end, with its ``finish_reason``."""

    @abc.abstractmethod
    def whole(self, text: str, finish_reason: str | None) -> Any:
        """The choice of a response that is not streamed."""


async def serve(rt: FrontendRuntime, request: Request, body: Body, principal: Principal | None,
                endpoint: Callable[[Body], Endpoint]) -> Response:
    """Serve one generation request of an endpoint, streamed (SSE) or whole (JSON)."""
    if body.n > rt.settings.frontend.max_n:
        raise InvalidRequest(f"n must be at most {rt.settings.frontend.max_n}", param="n")
    ep = endpoint(body)
    card = await rt.directory.card(body.model)
    prompt_ids = await ep.prompt_ids(card)
    gen = await start_generation(rt, request, body, card, principal, prompt_ids, ep.max_tokens)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return GenerationEvents(_events(gen, ep, body.model, include_usage), gen, rt.settings.frontend.sse_ping_s)
    async with gen:
        text = "".join([piece async for piece in gen.text()])
    return Response(encode(ep.response(f"{ep.id_prefix}{gen.request_id}", int(time.time()), body.model,
                                       [ep.whole(text, gen.finish_reason)], usage=_usage(gen))),
                    media_type="application/json", headers=worker_header(gen))


async def _events(gen: Generation, ep: Endpoint, model: str, include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE events of a started generation. Events that are ready together go out in one write
    (each write is a send on the socket): the opening with the first text, and the finish chunk,
    usage and ``[DONE]`` at the end. A failure ends the stream with an error event and ``[DONE]``."""
    rid, created = f"{ep.id_prefix}{gen.request_id}", int(time.time())

    def chunk(choices: list[Any], usage: UsageInfo | None = None) -> bytes:
        return sse_event(encode(ep.chunk(rid, created, model, choices, usage=usage)))

    opening = ep.opening()
    head = chunk([opening]) if opening is not None else b""
    async with gen:
        try:
            async for text in gen.text():
                yield head + chunk([ep.delta(text)])
                head = b""
            tail = head + chunk([ep.delta(None, gen.finish_reason)])
            if include_usage:
                tail += chunk([], _usage(gen))
        except SluiceError as exc:
            tail = head + sse_event(error_payload(exc))
        yield tail + DONE


def _usage(gen: Generation) -> UsageInfo:
    return make_usage(gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens)


async def start_generation(rt: FrontendRuntime, request: Request, body: SamplingFields, card: ModelCard,
                           principal: Principal | None, prompt_ids: list[int],
                           requested_max_tokens: int | None) -> Generation:
    """Check limits, routing parameters and quotas, route and enqueue. Nothing leaks if this raises."""
    if rt.drain.draining:
        raise ShuttingDown("the frontend is shutting down and takes no new request; retry on another")
    if not rt.hub.subscribed:
        raise RequestPlaneUnavailable("the request plane (Redis) is reconnecting; retry shortly")
    max_tokens = resolve_max_tokens(requested_max_tokens, len(prompt_ids), card.context_length,
                                    rt.settings.frontend.default_max_tokens,
                                    "messages" if hasattr(body, "messages") else "prompt")
    ext = body.sluice.router.model_dump() if body.sluice and body.sluice.router else None
    overrides = router_overrides(request.headers.get("x-sluice-router"), ext)
    if overrides.mode is not None:
        rt.policy(overrides.mode)  # an unknown mode is the client's mistake: 400 before any quota is spent
    sampling = sampling_from(body.temperature, body.top_p, body.seed, max_tokens, body.stop_token_ids,
                             body.ignore_eos, body.min_tokens)
    spec = GenerationSpec(model=body.model, prompt_token_ids=prompt_ids, stops=tuple(body.stop_strings()),
                          sampling=sampling, overrides=overrides)
    gen = Generation(rt, spec, card, principal)
    try:
        await rt.accounts.admit(principal, body.model, len(prompt_ids))
        await gen.start()
    except BaseException as exc:
        if isinstance(exc, Exception):
            rt.metrics.observe_refused(body.model, error_type(exc))
        await gen.close()
        raise
    return gen


def worker_header(gen: Generation) -> dict[str, str]:
    """``x-sluice-worker: <worker id>`` once the worker is known (pool mode learns it from the first delta)."""
    worker = gen.served_by
    headers = {WORKER_HEADER: worker} if worker else {}
    if gen.prefill_worker_id:
        headers[PREFILL_WORKER_HEADER] = gen.prefill_worker_id
    return headers


class GenerationEvents(StreamingEvents):
    """The SSE response of a started generation, naming its worker in the headers. The events generator closes the generation when it
    ends; if the client leaves before the generator ever ran, the response closes it here, so the
    router's prediction and the stream registration never leak."""

    def __init__(self, events: AsyncIterator[bytes], gen: Generation, ping_s: float = 0) -> None:
        super().__init__(events, ping_s=ping_s)
        self.generation = gen
        self.headers.update(worker_header(gen))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.generation.close()
