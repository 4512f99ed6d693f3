"""One request as the mocker tracks it, shared by its scheduler, its KV transfer and its engine API.

The scheduler (:mod:`workers.engines.mocker.scheduler`) moves a :class:`Request` between its
states and computes it; the transfer (:mod:`workers.engines.mocker.transfer`) holds a finished
export's blocks or delays a decode until its prompt's KV has arrived; the engine
(:mod:`workers.engines.mocker.engine`) hands its tokens to the caller's stream. What each step
produced for a request travels from the scheduler to the stream as a :class:`Delivery`.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from core.messages import FinishReason, SamplingParams, TokenLogprob
from router.hashing import BlockHash
from workers.engines.mocker.script import Scripted


class RequestState(enum.Enum):
    WAITING = "waiting"  # queued for admission, or reading its prompt's KV from a prefill worker
    RUNNING = "running"
    DONE = "done"  # finished computing, or aborted: holds no blocks (unless held for a transfer)


@dataclass(slots=True, eq=False)
class Request:
    """One request: what the scheduler computes, and what its output stream has handed out.

    Invariant while running: the request holds the cached blocks ``chain[:num_computed // B]``
    plus ``uncached`` blocks, together covering its first ``num_computed`` tokens and the
    chunk scheduled next. Waiting and done requests hold no blocks, except a done ``export``
    whose blocks the transfer holds for the decode worker.
    """

    request_id: str
    sampling: SamplingParams
    tokens: list[int]  # the prompt, then every generated token
    prompt_len: int
    key: int  # the token stream (mocker_tokens.stream_key)
    root: int  # the block-hash chain's seed (model, LoRA)
    chain: list[BlockHash]  # hashes of the full blocks of ``tokens`` known so far
    state: RequestState = RequestState.WAITING
    num_computed: int = 0  # tokens whose KV is in the cache
    uncached: int = 0
    cached_tokens: int | None = None  # set at first admission
    # the output stream
    pending: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    emitted: int = 0
    finish: FinishReason | None = None
    error: Exception | None = None
    waiter: asyncio.Future[None] | None = None
    # disaggregation
    carried: int = 0  # generated tokens at the end of ``tokens`` from the start (the prefill worker's)
    export: bool = False  # a prefill for a decode worker: hold the blocks at the end
    remote_tokens: int = 0  # prompt tokens whose KV is read from the prefill worker
    pulled: bool = False  # the read is done (the simulated transfer time has passed)
    onboarded: bool = False  # ``remote_tokens`` came from this worker's KV tiers, not a prefill worker
    script: Scripted | None = None  # a scripted output (workers.engines.mocker.script)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # handed out with the first output
    transferred_tokens: int = 0

    @property
    def closed(self) -> bool:
        """The stream has ended (finished, aborted or failed); it may still hold pending tokens."""
        return self.finish is not None or self.error is not None

    def wake(self) -> None:
        """Let the stream's consumer, if it waits, take what is pending."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class Delivery(NamedTuple):
    """A token a step produced for a request, handed out only once the step's time has passed;
    ``finish`` is set when it was the request's last token."""

    request: Request
    token: int
    finish: FinishReason | None
    logprob: TokenLogprob | None
