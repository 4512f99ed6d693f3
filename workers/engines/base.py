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
  Request ids are unique among running requests.
  Bad requests (empty prompt, too long for the context or the whole KV cache, duplicate id) and
  engine failures surface as a :class:`core.errors.SluiceError` subclass raised by the iterator
  (``InvalidRequest``/``ContextLengthExceeded``/``UpstreamError``), before or between outputs.
* ``abort(request_id)`` makes that request's iterator end promptly with ``finish_reason="abort"``
  and frees its KV blocks before it returns (blocks already in the prefix cache may stay cached).
  Aborting an unknown or finished request is a no-op.
* KV events: every change to the set of cached full blocks is reported, in order, through the
  ``kv_sink`` given to ``start`` as Sluice block hashes (``router.hashing`` with
  ``root_hash(info.model, lora)``), from the engine loop thread; the sink never blocks.
* ``cached_block_hashes()`` lists every block hash currently in the prefix cache (for resync).
* ``load()`` is cheap and thread-safe enough to call from the heartbeat; it leaves ``updated_at`` 0
  (the heartbeat stamps it).
* ``shutdown()`` aborts everything and releases the engine's resources.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from core.messages import FinishReason, KvEvent, SamplingParams, Usage
from router.registry import WorkerLoad


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


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    token_ids: list[int]
    sampling: SamplingParams
    lora: str | None = None


@dataclass(frozen=True, slots=True)
class EngineOutput:
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    usage: Usage | None = None


class KvEventSink(Protocol):
    def __call__(self, events: Sequence[KvEvent]) -> None: ...


def discard_kv_events(events: Sequence[KvEvent]) -> None:
    """A sink that drops events (for tests and engines run without a router)."""


class Engine(abc.ABC):
    """Base class; see the module docstring for the contract. ``info`` is set by ``start``."""

    info: EngineInfo

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
