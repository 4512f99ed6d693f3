"""The engine interface every Sluice engine implements (mocker, vLLM, ...).

An engine lives in one worker process, runs on that process's engine event loop (one asyncio
loop in a dedicated thread, owned by ``workers.host.EngineHost``) and serves every concurrent
request of the worker, batching them itself (continuous batching).

Contract (checked by tests/engines/test_conformance.py, which every engine must pass):

* ``start(kv_sink)`` loads the model; afterwards ``info`` is final. It raises
  :class:`EngineStartError` with a clear message when the model cannot be loaded.
* ``generate(request)`` is an async iterator of :class:`EngineOutput`. Each output carries the
  token ids generated since the previous one (possibly several, possibly none on the last one).
  The last output, and only it, has ``finish_reason`` set (``stop``: a stop token id or EOS was
  generated, and it is included in ``token_ids``; ``length``: ``max_tokens`` reached; ``abort``:
  aborted) and ``usage`` with exact prompt, cached (prefix-cache hit) and completion token counts.
  Bad requests (empty prompt, too long for the context or the whole KV cache, an adapter the
  engine does not serve) and engine failures surface as a :class:`core.errors.SluiceError`
  subclass raised by the iterator (``InvalidRequest``/``ContextLengthExceeded``/``UpstreamError``),
  before or between outputs: never a bare exception, which the client would see as a server error.
  The engine not running (not started, shut down, dead) is an ``UpstreamError``.
* Request ids are unique among live requests: a request whose id is already live is refused with
  ``InvalidRequest`` (at the iterator's first step) and the live one goes on undisturbed.
* Closing the iterator before its last output (``aclose()``: leaving ``contextlib.aclosing``, or a
  consumer cancelled inside it) aborts the request as ``abort`` does: its blocks are free when
  ``aclose`` returns. An iterator dropped without closing is closed later by the event loop's
  async-generator finalizer, with the same effect.
* ``abort(request_id)`` makes that request's iterator end promptly with ``finish_reason="abort"``
  and frees its KV blocks before it returns (blocks already in the prefix cache may stay cached).
  Aborting an unknown or finished request is a no-op.
* KV events: every change to the set of cached full blocks is reported, in order, through the
  ``kv_sink`` given to ``start`` as Sluice block hashes (``router.hashing`` with
  ``root_hash(info.model, lora)``), from the engine loop thread; the sink never blocks. An engine
  whose :attr:`Engine.publishes_kv_events` is False never calls the sink (routers then guess its
  cache from their own decisions: approximate mode).
* An engine that learns its cache from elsewhere (vLLM's published events) and loses track of it
  (reports that never came, or that it cannot read) tells the sink with a :class:`KvTrackLost`, in
  order with its events: every block it reported before may be gone, and from then on
  ``cached_block_hashes()`` lists only what it can vouch for. The host then rebuilds the index from
  it (workers.kv_relay).
* ``cached_block_hashes()`` lists every block hash currently in the prefix cache (for resync).
* ``clear_kv_cache()`` drops from the prefix cache every block no running request holds, and it
  never refuses because requests are running. Blocks that running requests hold may be
  dropped too (vLLM preempts its running requests, which recompute their KV; the mocker keeps
  them); either way running requests go on and their outputs are unchanged. It reports
  ``AllBlocksCleared`` and then ``BlockStored`` for whatever is cached afterwards, so a router
  replaying the events holds ``cached_block_hashes()``. It raises ``UpstreamError`` only when the
  engine fails.
* ``load()`` is cheap and thread-safe enough to call from the heartbeat; it leaves ``updated_at`` 0
  (the heartbeat stamps it).
* Step statistics: an engine that can see its steps (forward passes) hands each one's
  :class:`StepStats` to ``on_step`` (set by the host before ``start``; None: nobody listens), with
  :func:`emit_step`, from the engine loop thread; the observer never blocks. Preemptions are
  reported with the step that made them.
* Disaggregation (an engine whose spec, ``workers.engines.spec``, declares the pools that move KV,
  built for such a pool): a ``kv_export`` request holds its prompt's blocks after it ends, until
  ``release_transfer`` or the hold's lease, and its last output carries ``kv_handle``; a request
  with ``kv_handle`` reads the prompt's KV it does not hold from the prefill worker (blocks it holds
  are not moved), computes only the rest, and counts the tokens read in
  ``usage.transferred_tokens``. A read that fails falls back to computing.
* ``shutdown()`` ends every live request (each iterator ends with ``finish_reason="abort"`` or
  raises a ``SluiceError``; none is left waiting), refuses new ones, and releases the engine's
  resources.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from core.errors import InvalidRequest
from core.messages import FinishReason, KvEvent, SamplingParams, TokenLogprob, Usage
from router.registry import WorkerLoad

if TYPE_CHECKING:
    from workers.kvbm.tiers import TierReport

log = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """The engine could not start (model missing, out of memory, bad configuration)."""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    model: str
    engine: str
    block_size: int
    kv_blocks: int
    max_num_seqs: int
    context_length: int
    vocab_size: int
    #: What the engine can do beyond plain generation (core.messages.Feature); the frontend refuses, with
    #: a 400 naming the engine, a request that needs what the model's workers lack.
    features: frozenset[str] = frozenset()
    #: The most prompt tokens one step computes (0: unknown).
    max_batched_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """``kv_export``: a prefill for a decode worker (the host sends ``max_tokens`` 1): the engine
    keeps the prompt's blocks after the request ends, for the decode worker to read, and its last
    output carries the transfer handle. ``kv_handle``: a decode whose prompt's KV is read from the
    prefill worker the handle names. ``carried_tokens``: ``token_ids`` ends with that many tokens
    generated elsewhere (the prefill worker's first token): they count as output, not prompt, in
    ``usage`` and ``sampling`` (``max_tokens`` includes them)."""

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams
    lora: str | None = None
    kv_export: bool = False
    kv_handle: dict[str, Any] | None = None
    carried_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineOutput:
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    #: On the last output of a ``kv_export`` request: what a decode worker needs to read the KV.
    kv_handle: dict[str, Any] | None = None
    #: With ``sampling.logprobs``: one per token of ``token_ids``.
    logprobs: list[TokenLogprob] | None = None
    #: With ``sampling.prompt_logprobs``, on the first output: one per prompt token (the first None).
    prompt_logprobs: list[TokenLogprob | None] | None = None


#: Why an engine lost track of its cache: reports were lost on the way (a ``gap`` in their numbering)
#: or came ``undecodable``.
KvLossReason = Literal["gap", "undecodable"]


@dataclass(frozen=True, slots=True)
class KvTrackLost:
    """Not a change of the cache: the engine lost track of it (see the contract). ``detail`` says what
    was lost, for the logs."""

    reason: KvLossReason
    detail: str


#: What an engine hands its KV sink: the changes of its cache, in order, and where it lost track.
EngineKvEvent = KvEvent | KvTrackLost


class KvEventSink(Protocol):
    def __call__(self, events: Sequence[EngineKvEvent]) -> None: ...


#: A step that computed any prompt tokens is a ``prefill`` step (chunked prefills share steps with
#: decoding requests), the others ``decode`` steps.
StepPhase = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class StepStats:
    """One engine step as its engine measured it. ``duration_s``: how long the step computed (None: the
    engine learned of preemptions apart from any timed step); ``prefill_tokens``: prompt tokens it
    computed; ``decode_tokens``: tokens it computed for decoding requests; ``preemptions``: running
    requests it sent back to wait, their KV blocks freed (they recompute them)."""

    duration_s: float | None
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions: int = 0
    #: KV usage (active / total blocks) while the step ran (None: the engine did not say).
    kv_usage: float | None = None

    @property
    def phase(self) -> StepPhase:
        return "prefill" if self.prefill_tokens else "decode"


class StepObserver(Protocol):
    def __call__(self, step: StepStats) -> None: ...


def discard_kv_events(events: Sequence[EngineKvEvent]) -> None:
    """A sink that drops events (for tests and engines run without a router)."""


def emit_kv_events(sink: KvEventSink, events: Sequence[EngineKvEvent]) -> None:
    """Hand ``events`` to the host's sink (nothing when empty). A failing sink is logged, not
    raised: the sink belongs to the host, and a broken one must not stop generation."""
    if not events:
        return
    try:
        sink(events)
    except Exception:  # noqa: BLE001 - see the docstring
        log.exception("KV event sink failed")


def emit_step(observer: StepObserver | None, step: StepStats) -> None:
    """Hand ``step`` to the host's observer, if any; a failing observer is logged, not raised (as
    :func:`emit_kv_events`)."""
    if observer is None:
        return
    try:
        observer(step)
    except Exception:  # noqa: BLE001 - the observer belongs to the host; generation goes on
        log.exception("engine step observer failed")


class Engine(abc.ABC):
    """Base class; see the module docstring for the contract. ``info`` is set by ``start``."""

    info: EngineInfo
    #: Where the engine reports its steps (see the contract); the host sets it before ``start``.
    on_step: StepObserver | None = None
    #: Whether the engine reports its cache through the ``kv_sink`` (see the contract). The host
    #: registers the worker with it, and relays events and ``cached_block_hashes()`` only if True.
    publishes_kv_events: bool = True

    @abc.abstractmethod
    async def start(self, kv_sink: KvEventSink = discard_kv_events) -> None: ...

    @abc.abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]: ...

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None: ...

    @abc.abstractmethod
    def load(self) -> WorkerLoad: ...

    @abc.abstractmethod
    async def clear_kv_cache(self) -> None: ...

    @abc.abstractmethod
    def cached_block_hashes(self) -> list[int]: ...

    @abc.abstractmethod
    async def shutdown(self) -> None: ...

    def tier_report(self) -> TierReport | None:
        """What the engine's KV tiers (workers.kvbm) hold and did, as last known (None without tiers): the
        worker's metrics, load record and credits read it, on any thread. Never blocks."""
        return None

    def tier_block_hashes(self) -> dict[str, list[int]]:
        """What each of the worker's own KV tiers holds (workers.kvbm), for a resync of the prefix index;
        {} for an engine without tiers."""
        return {}

    def cached_block_count(self) -> int:
        """How many blocks hold cached content (what :meth:`cached_block_hashes` lists, counted)."""
        return len(self.cached_block_hashes())

    async def load_lora(self, name: str, path: str) -> None:
        """Load the LoRA adapter in directory ``path`` as ``name`` (engines with the ``lora``
        feature); InvalidRequest when it cannot be loaded."""
        raise InvalidRequest(f"engine {self.info.engine} serves no LoRA adapters", code="lora_not_supported")

    async def unload_lora(self, name: str) -> None:
        """Drop the adapter ``name``; InvalidRequest when it is not loaded."""
        raise InvalidRequest(f"engine {self.info.engine} serves no LoRA adapters", code="lora_not_supported")

    def loras(self) -> list[str]:
        """The adapters loaded, in load order."""
        return []

    async def release_transfer(self, request_id: str) -> None:  # noqa: B027 - optional, no-op by default
        """The decode worker read (or gave up on) the blocks held for ``request_id``'s handle: free
        them now instead of at the hold's end. Unknown ids are a no-op."""
