"""The choices of one request (``n``): one :class:`Generation` each, read together.

A request with ``n > 1`` is routed once: the first choice goes where the router sends it, and the
others are pinned to the same worker, so the choices share the prompt's KV there through the
engine's prefix cache (a choice the engine schedules after the first's prompt is computed finds
every full block of it cached). Each choice has
its own seed (the request's ``seed + i``, or its own random one) and its own wire id, stream and
migration. Streamed, the choices' text arrives interleaved, each chunk carrying its ``index``;
``usage`` counts the prompt once and the completions of all. The first failure ends the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from app.requests.generation import Generation
from core.errors import SluiceError
from core.messages import TokenLogprob

#: Seeds are signed 64-bit integers; the ``i``-th choice's wraps around.
_SEED_SPAN = 1 << 64
_SEED_MIN = -(1 << 63)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice ``index`` of a request seeded ``seed`` (None: each draws its own)."""
    if seed is None or index == 0:
        return seed
    return (seed + index - _SEED_MIN) % _SEED_SPAN + _SEED_MIN


@dataclass(frozen=True, slots=True)
class Piece:
    """Text of choice ``index``, or (``text`` None) its end, with the logprobs of the tokens
    received since its previous piece (when asked for)."""

    index: int
    text: str | None
    logprobs: list[tuple[int, TokenLogprob]] = field(default_factory=list)


class Choices:
    def __init__(self, generations: list[Generation]) -> None:
        self.generations = generations

    @property
    def first(self) -> Generation:
        return self.generations[0]

    async def close(self) -> None:
        for gen in self.generations:
            await gen.close()

    async def __aenter__(self) -> Choices:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def prompt_tokens(self) -> int:
        return self.first.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return self.first.cached_tokens

    @property
    def transferred_tokens(self) -> int:
        return self.first.transferred_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(g.completion_tokens for g in self.generations)

    async def pieces(self) -> AsyncIterator[Piece]:
        """Every choice's text as it arrives, then its end (:class:`Piece` with no text). One choice
        is read directly; several through a queue fed by a task each. Raises the first failure."""
        if len(self.generations) == 1:
            gen = self.first
            async for text in gen.text():
                yield Piece(0, text, gen.take_logprobs())
            yield Piece(0, None, gen.take_logprobs())
            return
        queue: asyncio.Queue[Piece | BaseException] = asyncio.Queue()

        async def read(index: int, gen: Generation) -> None:
            try:
                async for text in gen.text():
                    queue.put_nowait(Piece(index, text, gen.take_logprobs()))
                queue.put_nowait(Piece(index, None, gen.take_logprobs()))
            except (SluiceError, asyncio.CancelledError) as exc:
                queue.put_nowait(exc)
            except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
                queue.put_nowait(exc)

        tasks = [asyncio.create_task(read(i, g)) for i, g in enumerate(self.generations)]
        try:
            left = len(tasks)
            while left:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.text is None:
                    left -= 1
                yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def texts(self) -> list[tuple[str, list[tuple[int, TokenLogprob]]]]:
        """Each choice's whole text, and its tokens' logprobs (when asked for)."""
        parts: list[list[str]] = [[] for _ in self.generations]
        logprobs: list[list[tuple[int, TokenLogprob]]] = [[] for _ in self.generations]
        async for piece in self.pieces():
            logprobs[piece.index].extend(piece.logprobs)
            if piece.text is not None:
                parts[piece.index].append(piece.text)
        return [("".join(p), lp) for p, lp in zip(parts, logprobs, strict=True)]
