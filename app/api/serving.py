"""What the chat and completions endpoints share: everything but their own request, prompt and
response shapes.

An endpoint module defines an :class:`Endpoint` (how its prompt is built, how big a completion it
asked for, which objects its responses are made of) and hands it to :func:`serve`, which does the
rest in this order: the frontend's limits, the endpoint's own checks, the model card, the prompt,
admission and routing of each of its ``n`` choices (:func:`start_choices`), then the response,
streamed or whole. Every
response names its worker in ``x-sluice-worker``.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, ClassVar, TypeVar

import msgspec
from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.accounts.service import Principal
from app.api.deps import router_overrides
from app.api.sse import DONE, StreamingEvents, sse_event
from app.metrics import error_type
from app.model_card import ModelCard
from app.output.logprobs import Entries, PromptEntries
from app.output.structured import check_engines, constraint_param, structured_from
from app.protocol.common import SamplingFields, UsageInfo, encode, make_usage
from app.requests.choices import Choices, choice_seed
from app.requests.generation import Generation, GenerationSpec, resolve_max_tokens, sampling_from
from app.runtime import FrontendRuntime
from core.errors import InvalidRequest, RequestPlaneUnavailable, ShuttingDown, SluiceError
from core.http_errors import error_payload
from core.settings import FrontendSettings

WORKER_HEADER = "x-sluice-worker"
#: Disaggregated requests: the prefill worker that computed the prompt (absent: prefilled locally).
PREFILL_WORKER_HEADER = "x-sluice-prefill-worker"
#: Why the prompt was or was not computed on a prefill worker (router.disagg; only where a prefill pool serves the model).
DISAGG_REASON_HEADER = "x-sluice-disagg-reason"

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

    @property
    def logprobs(self) -> int | None:
        """How many top logprobs per token the request asked for (None: no logprobs)."""
        return None

    def format_logprobs(self, card: ModelCard, entries: Entries, offset: int) -> Any | None:
        """``entries`` in the endpoint's logprobs shape (``offset``: where their text starts in the choice)."""
        return None

    @property
    def prompt_logprobs(self) -> int | None:
        """How many top logprobs per prompt token the request asked for (None: none; a completion's
        ``echo`` with ``logprobs``)."""
        return None

    def format_prompt_logprobs(self, card: ModelCard, entries: PromptEntries) -> Any | None:
        """The prompt's logprobs in the endpoint's shape (they precede the choice's own)."""
        return None

    def prepare(self, card: ModelCard, frontend: FrontendSettings) -> None:
        """What the endpoint decides from the model card before the prompt is built (nothing by default)."""
        return None

    def stream_text(self, index: int, text: str, logprobs: Any | None) -> list[Any]:
        """The streamed choices ``text`` of choice ``index`` makes (one delta unless the endpoint
        shapes its text: then maybe none yet, or several)."""
        return [self.delta(text, index=index, logprobs=logprobs)]

    def stream_end(self, index: int, finish_reason: str | None, logprobs: Any | None) -> list[Any]:
        """The streamed choices that end choice ``index``: what the endpoint still held, then the finish."""
        return [self.delta(None, finish_reason, index, logprobs)]

    def opening(self, index: int = 0, logprobs: Any | None = None) -> Any | None:
        """Choice ``index`` streamed ahead of its first text, in the same write (None: nothing),
        with the prompt's ``logprobs`` (app.api.serving.Endpoint.format_prompt_logprobs) when asked."""
        return None

    def opening_text(self) -> str:
        """The text every choice starts with before the generated text (a completion's echo)."""
        return ""

    @abc.abstractmethod
    def delta(self, text: str | None, finish_reason: str | None = None, index: int = 0,
              logprobs: Any | None = None) -> Any:
        """Streamed choice ``index``: new ``text``, or (``None``) its end, with its ``finish_reason``."""

    @abc.abstractmethod
    def whole(self, text: str, finish_reason: str | None, index: int = 0, logprobs: Any | None = None) -> Any:
        """Choice ``index`` of a response that is not streamed."""


async def serve(rt: FrontendRuntime, request: Request, body: Body, principal: Principal | None,
                endpoint: Callable[[Body], Endpoint]) -> Response:
    """Serve one generation request of an endpoint, streamed (SSE) or whole (JSON)."""
    if body.n > rt.settings.frontend.max_n:
        raise InvalidRequest(f"n must be at most {rt.settings.frontend.max_n}", param="n")
    ep = endpoint(body)
    model, lora = rt.directory.resolve(body.model)
    card = await rt.directory.card(model)
    ep.prepare(card, rt.settings.frontend)
    prompt_ids = await ep.prompt_ids(card)
    choices = await start_choices(rt, request, body, card, principal, prompt_ids, ep.max_tokens, ep.logprobs,
                                  model=model, lora=lora, prompt_logprobs=ep.prompt_logprobs)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return GenerationEvents(_events(choices, ep, card, body.model, include_usage), choices,
                                rt.settings.frontend.sse_ping_s)
    async with choices:
        texts = await choices.texts()
    start = len(ep.opening_text())
    whole = [ep.whole(text, gen.finish_reason, i, _joined(ep.format_prompt_logprobs(card, _prompt_entries(gen)),
                                                          ep.format_logprobs(card, lps, start) if lps else None))
             for i, ((text, lps), gen) in enumerate(zip(texts, choices.generations, strict=True))]
    return Response(encode(ep.response(f"{ep.id_prefix}{choices.first.request_id}", int(time.time()), body.model,
                                       whole, usage=_usage(choices))),
                    media_type="application/json", headers=worker_header(choices.first))


async def _events(choices: Choices, ep: Endpoint, card: ModelCard, model: str,
                  include_usage: bool) -> AsyncGenerator[bytes, None]:
    """The SSE events of a request's started choices. Events that are ready together go out in one
    write (each write is a send on the socket): a choice's opening with its first text, and the last
    finish chunk, usage and ``[DONE]`` at the end. A failure ends the stream with an error event and
    ``[DONE]``."""
    rid, created = f"{ep.id_prefix}{choices.first.request_id}", int(time.time())

    def chunk(choices: list[Any], usage: UsageInfo | None = None) -> bytes:
        return sse_event(encode(ep.chunk(rid, created, model, choices, usage=usage)))

    def opening(index: int) -> bytes:
        """Built when the choice's first piece comes: the prompt's logprobs come with the first token."""
        gen = choices.generations[index]
        choice = ep.opening(index, ep.format_prompt_logprobs(card, _prompt_entries(gen)))
        return chunk([choice]) if choice is not None else b""

    unopened = set(range(len(choices.generations)))
    offsets = dict.fromkeys(range(len(choices.generations)), len(ep.opening_text()))
    tail = b""
    async with choices:
        try:
            async for piece in choices.pieces():
                head = b""
                if piece.index in unopened:
                    unopened.discard(piece.index)
                    head = opening(piece.index)
                lps = ep.format_logprobs(card, piece.logprobs, offsets[piece.index]) if piece.logprobs else None
                if piece.text is not None:
                    offsets[piece.index] += len(piece.text)
                    parts = ep.stream_text(piece.index, piece.text, lps)
                    yield tail + head + b"".join(chunk([p]) for p in parts)
                    tail = b""
                else:  # the choice's end: held back to go out with what follows it
                    gen = choices.generations[piece.index]
                    parts = ep.stream_end(piece.index, gen.finish_reason, lps)
                    tail += head + b"".join(chunk([p]) for p in parts)
            if include_usage:
                tail += chunk([], _usage(choices))
        except SluiceError as exc:
            tail += b"".join(opening(i) for i in sorted(unopened)) + sse_event(error_payload(exc))
        yield tail + DONE


def _prompt_entries(gen: Generation) -> PromptEntries:
    lps = gen.prompt_logprobs
    return list(zip(gen.spec.prompt_token_ids, lps, strict=False)) if lps else []


def _joined(prompt: Any | None, own: Any | None) -> Any | None:
    """The prompt's logprobs, then the choice's."""
    if prompt is None or own is None:
        return prompt if own is None else own
    return prompt + own


def _usage(choices: Choices) -> UsageInfo:
    return make_usage(choices.prompt_tokens, choices.completion_tokens, choices.cached_tokens,
                      choices.transferred_tokens)


async def start_choices(rt: FrontendRuntime, request: Request, body: SamplingFields, card: ModelCard,
                        principal: Principal | None, prompt_ids: list[int],
                        requested_max_tokens: int | None, logprobs: int | None = None, *,
                        model: str | None = None, lora: str | None = None,
                        prompt_logprobs: int | None = None) -> Choices:
    """Check limits, routing parameters and quotas, then route and enqueue each of the request's
    ``n`` choices (app.requests.choices) to ``model`` (the request's own by default), with its LoRA adapter
    ``lora``. Nothing leaks if this raises."""
    model = model or body.model
    if rt.drain.draining:
        raise ShuttingDown("the frontend is shutting down and takes no new request; retry on another")
    if not rt.hub.subscribed:
        raise RequestPlaneUnavailable("the request plane (Redis) is reconnecting; retry shortly")
    chat = hasattr(body, "messages")
    f = rt.settings.frontend
    max_tokens = resolve_max_tokens(requested_max_tokens, len(prompt_ids), card.context_length,
                                    f.default_max_tokens if chat else f.default_completion_max_tokens,
                                    "messages" if chat else "prompt")
    ext = body.sluice.router.model_dump() if body.sluice and body.sluice.router else None
    overrides = router_overrides(request.headers.get("x-sluice-router"), ext)
    if overrides.mode is not None:
        rt.policy(overrides.mode)  # an unknown mode is the client's mistake: 400 before any quota is spent
    structured = structured_from(body)
    if structured is not None:
        check_engines(structured, rt.directory.workers_for(model, lora), constraint_param(body))
    sampling = sampling_from(body, sampling_defaults(card, rt.settings.frontend), max_tokens, card.vocab_size,
                             logprobs, structured, prompt_logprobs)
    gens: list[Generation] = []
    try:
        await rt.accounts.admit(principal, model, len(prompt_ids))
        for i in range(body.n):
            first = gens[0] if gens else None
            routed = first.attempt.routed_to if first is not None and first.attempt is not None else None
            pinned = overrides if routed is None else dataclasses.replace(overrides, worker_id=routed)
            spec = GenerationSpec(
                model=model, lora=lora, prompt_token_ids=prompt_ids, stops=tuple(body.stop_strings()),
                sampling=msgspec.structs.replace(sampling, seed=choice_seed(sampling.seed, i)),
                overrides=pinned, user=body.user, charge_prompt=first is None)
            gen = Generation(rt, spec, card, principal)
            gens.append(gen)
            await gen.start()
    except BaseException as exc:
        if isinstance(exc, Exception):
            rt.metrics.observe_refused(model, error_type(exc))
        for gen in gens:
            await gen.close()
        raise
    return Choices(gens)


def sampling_defaults(card: ModelCard, frontend: FrontendSettings) -> dict[str, float]:
    """What a request that leaves a sampling field out gets: the model's recommendation (with
    ``generation_config=auto``) under the deployment's own ``sampling_defaults``."""
    base = card.sampling_defaults if frontend.generation_config == "auto" else {}
    merged: dict[str, float] = dict(base)
    for name, value in frontend.sampling_defaults.items():
        merged[name] = value
    return merged


def worker_header(gen: Generation) -> dict[str, str]:
    """``x-sluice-worker: <worker id>`` once the worker is known (pool mode learns it from the first delta)."""
    worker = gen.served_by
    headers = {WORKER_HEADER: worker} if worker else {}
    if gen.prefill_worker_id:
        headers[PREFILL_WORKER_HEADER] = gen.prefill_worker_id
    if gen.plan is not None:
        headers[DISAGG_REASON_HEADER] = gen.plan.reason
    return headers


class GenerationEvents(StreamingEvents):
    """The SSE response of a started generation, naming its worker in the headers. The events generator closes the generation when it
    ends; if the client leaves before the generator ever ran, the response closes it here, so the
    router's prediction and the stream registration never leak."""

    def __init__(self, events: AsyncGenerator[bytes, None], choices: Choices, ping_s: float = 0) -> None:
        super().__init__(events, ping_s=ping_s)
        self.choices = choices
        self.headers.update(worker_header(choices.first))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.choices.close()
