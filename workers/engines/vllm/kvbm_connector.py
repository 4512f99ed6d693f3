"""Sluice's vLLM KV connector: vLLM's KV cache offloaded to, and onboarded from, Sluice's KV tiers
(workers.kvbm; docs/kvbm.md). vLLM loads it by module path (:func:`workers.engines.vllm.kv_transfer.kvbm_config`).

vLLM's own offloading does not run on its CPU build (docs/kvbm.md, "What was tried for vLLM on CPU"), so
this connector does the job with vLLM's connector interface (``KVConnectorBase_V1``):

* Offload. Every engine step, the scheduler side lists the blocks that step fills (prompt and output
  tokens alike) with their Sluice block hashes (router.hashing, chained from the request's token ids, so
  tier keys are the router's). After the forward (``wait_for_save``) the worker side copies each block's
  KV, all layers, into one payload and hands it to :meth:`KvTiers.offload`, which returns at once. A
  block is copied before the step ends, so vLLM may free or reuse it right after.
* Onboard. For a new request, the scheduler side asks the tiers how many blocks past vLLM's own prefix
  hit they hold (``get_num_new_matched_tokens``) and reports them as external tokens; vLLM allocates
  blocks for them, and the worker side reads them (``start_load_kv``, before the forward: a synchronous
  load) and writes them into those blocks. The prompt's last token is always left to compute.
* A short read (a block missing, corrupt, late, or a tier down) is never an error: the blocks past the
  run read are reported by ``get_block_ids_with_load_errors`` and vLLM (``kv_load_failure_policy=
  "recompute"``) computes them again from there; nothing that request computed in that step is offloaded
  (its KV attended to blocks that were not loaded).
* Cost. The time both sides spend in their hooks is counted (``TierStats.step_seconds``; the scheduler
  side's travels to the worker side with each step's metadata), and the offload thread's CPU time
  (``offload_cpu_seconds``): what the worker's metrics show as the tiers' cost to the engine.
* Tier events. The tiers' membership changes travel to the scheduler side with each step's worker
  metadata and leave as vLLM KV events whose ``medium`` is ``sluice:<tier>`` and whose block hashes are
  already Sluice's; workers.engines.vllm.kv_events passes them on with their tier.

Where the tiers live. On a CPU vLLM runs its scheduler (engine core) and its model worker in two
processes (the CPU platform forces the multiprocessing executor), and the host tier is process memory:
the tiers are opened once, in the worker process, which holds the KV. The scheduler side asks them over
a local socket (:class:`TierClient`; an abstract Unix socket named in the connector's config, with a key
of its own): a ``lookup`` per new request, answered by a thread of the worker process. The engine
adapter uses the same socket for what the tiers hold (a resync) and their counters. A scheduler that
gets no answer in time counts no tier hit: the prompt is computed.

One KV cache group (no hybrid models), no pipeline or tensor parallelism, no multimodal prompts or cache
salts (their blocks are neither offloaded nor onboarded): what Sluice's vLLM workers run.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from typing import TYPE_CHECKING, Any

import torch
import xxhash
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from core.settings import KvbmSettings
from router.hashing import block_hashes, root_hash
from workers.engines.vllm.kv_events import MEDIUM_PREFIX
from workers.kvbm.tiers import Block, KvTiers

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

#: How long the scheduler side waits for the worker's answer to a lookup before counting no hit.
_LOOKUP_TIMEOUT_S = 0.5
#: How long a client waits for the worker's socket to accept (it binds when the KV caches are registered).
_CONNECT_TIMEOUT_S = 5.0

# Keys of ``kv_connector_extra_config``.
EXTRA_MODEL = "model"
EXTRA_SETTINGS = "kvbm"
EXTRA_ADDRESS = "rpc_address"
EXTRA_KEY = "rpc_key"


# ---- messages between the two sides ---------------------------------------------------------------------
@dataclass(slots=True)
class _Load:
    req_id: str
    block_ids: list[int]
    hashes: list[int]
    parent: int | None = None  # the hash of the block before the first (None: the chain's root)


@dataclass(slots=True)
class _Save:
    req_id: str
    block_ids: list[int]
    hashes: list[int]
    parent: int | None = None  # the hash of the block before the first (None: the chain's root)


@dataclass
class KvbmMeta(KVConnectorMetadata):
    """One step's work for the worker side: blocks to onboard before the forward, blocks to offload after."""

    loads: list[_Load] = field(default_factory=list)
    saves: list[_Save] = field(default_factory=list)
    #: Seconds the scheduler side spent in the connector since the last step's metadata (counted by the
    #: worker side, whose stats the worker's metrics read).
    sched_seconds: float = 0.0


@dataclass
class KvbmWorkerMeta(KVConnectorWorkerMetadata):
    """Tier membership changes, as ``(tier, stored, hashes)``, from the worker to the scheduler."""

    events: list[tuple[str, bool, list[int]]] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, KvbmWorkerMeta)
        return KvbmWorkerMeta(self.events + other.events)


# ---- the tiers' socket ------------------------------------------------------------------------------------
class TierClient:
    """Asks the worker process's tiers (``lookup``, ``snapshot``, ``report``, ``flush``) over its socket.

    Thread-safe; a call that fails or times out drops the connection (the next call connects again) and
    raises :class:`TimeoutError` or :class:`OSError`."""

    def __init__(self, address: str, key: str) -> None:
        self.address = address
        self._key = key.encode()
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    def call(self, op: str, *args: Any, timeout_s: float = _LOOKUP_TIMEOUT_S) -> Any:
        with self._lock:
            try:
                conn = self._connect(timeout_s)
                conn.send((op, args))
                if not conn.poll(timeout_s):
                    raise TimeoutError(f"the KV tiers did not answer {op!r} in {timeout_s} s")
                ok, value = conn.recv()
            except EOFError as exc:
                self._close()
                raise OSError(f"the KV tiers' socket closed during {op!r}") from exc
            except (OSError, TimeoutError):
                self._close()
                raise
            if not ok:
                raise RuntimeError(value)
            return value

    def _connect(self, timeout_s: float) -> Connection:
        if self._conn is None:
            deadline = time.monotonic() + max(timeout_s, _CONNECT_TIMEOUT_S)
            while True:
                try:
                    self._conn = Client(self.address, family="AF_UNIX", authkey=self._key)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._close()


class _TierServer:
    """Answers :class:`TierClient` calls from the worker process's tiers, a thread per connection."""

    def __init__(self, tiers: KvTiers, address: str, key: str) -> None:
        self.tiers = tiers
        self._listener = Listener(address, family="AF_UNIX", authkey=key.encode())
        threading.Thread(target=self._accept, name="kvbm-rpc", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:
                return  # closed
            except Exception:  # noqa: BLE001 - a client with the wrong key; keep serving the others
                log.warning("refused a KV tier client", exc_info=True)
                continue
            threading.Thread(target=self._serve, args=(conn,), name="kvbm-rpc-conn", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    op, args = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    conn.send((True, self._answer(op, args)))
                except Exception as exc:  # noqa: BLE001 - the caller gets the reason, the server goes on
                    conn.send((False, f"{type(exc).__name__}: {exc}"))

    def _answer(self, op: str, args: tuple[Any, ...]) -> Any:
        if op == "lookup":
            return self.tiers.lookup(args[0])
        if op == "snapshot":
            return self.tiers.snapshot()
        if op == "report":
            return self.tiers.report()
        if op == "flush":
            return self.tiers.flush(args[0])
        raise ValueError(f"unknown KV tier call {op!r}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()


# ---- block <-> bytes -----------------------------------------------------------------------------------------
class _BlockCopier:
    """Copies one block of every layer's KV cache to one payload and back.

    A layer's cache is a tensor with one dimension of ``num_blocks`` (its position depends on the attention
    backend's layout: found, not assumed); a block is that dimension's slice in every layer, in the order
    vLLM registered the layers. The payload is those slices' bytes, concatenated."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int) -> None:
        self.layers: list[tuple[torch.Tensor, int]] = []
        for name, tensor in kv_caches.items():
            dims = [d for d, size in enumerate(tensor.shape) if size == num_blocks]
            if not dims:
                raise ValueError(f"layer {name}: no dimension of {num_blocks} blocks in shape {tuple(tensor.shape)}")
            self.layers.append((tensor, dims[0]))
        first, dim = self.layers[0]
        self.block_bytes = sum(t.select(d, 0).numel() * t.element_size() for t, d in self.layers)
        self.describe = (f"{len(self.layers)}x{tuple(first.select(dim, 0).shape)}:{first.dtype}:"
                         f"{self.block_bytes}")

    def read(self, block_id: int) -> bytes:
        parts = [t.select(d, block_id).reshape(-1).view(torch.uint8) for t, d in self.layers]
        return torch.cat(parts).numpy().tobytes()

    def write(self, block_id: int, payload: bytes) -> None:
        if len(payload) != self.block_bytes:
            raise ValueError(f"a payload of {len(payload)} bytes for blocks of {self.block_bytes}")
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        offset = 0
        for tensor, dim in self.layers:
            target = tensor.select(dim, block_id)
            n = target.numel() * tensor.element_size()
            target.copy_(data[offset:offset + n].view(tensor.dtype).view(target.shape))
            offset += n


# ---- the connector ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Request:
    """The scheduler side's view of a live request."""

    request: Request
    root: int
    #: Sluice hashes of the request's full blocks so far, extended as it grows.
    hashes: list[int] = field(default_factory=list)
    #: Blocks below this index are in vLLM's cache from before, onboarded, or offloaded already.
    saved_upto: int = 0
    #: The last tier match offered: (first block, blocks).
    offer: tuple[int, int] = (0, 0)
    #: An onboard to do in the request's next step: (first block, blocks).
    load: tuple[int, int] | None = None


class SluiceKvbmConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.model: str = extra[EXTRA_MODEL]
        self.settings = KvbmSettings.model_validate(extra[EXTRA_SETTINGS])
        self.block_size = vllm_config.cache_config.block_size
        self._address: str = extra[EXTRA_ADDRESS]
        self._key: str = extra[EXTRA_KEY]
        self._num_blocks = kv_cache_config.num_blocks
        self._scope_base = f"{self.model}|{vllm_config.model_config.dtype}|block{self.block_size}"
        # Scheduler side.
        self._requests: dict[str, _Request] = {}
        self._client: TierClient | None = None
        self._events: list[KVCacheEvent] = []
        #: Seconds spent in the scheduler side's hooks since the last step's metadata.
        self._sched_seconds = 0.0
        # Worker side.
        self.tiers: KvTiers | None = None
        self._server: _TierServer | None = None
        self._copier: _BlockCopier | None = None
        self._load_errors: set[int] = set()
        #: Requests whose onboard fell short in this step: nothing they computed in it is offloaded.
        self._failed_reqs: set[str] = set()
        if role == KVConnectorRole.SCHEDULER:
            self._client = TierClient(self._address, self._key)

    # ==== worker side ================================================================================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._copier = _BlockCopier(kv_caches, self._num_blocks)
        # Names the tiers' content (a disk directory, a shared key prefix): equal exactly when the KV
        # layout is, so that every worker of the model shares it and no other reads it.
        layout = xxhash.xxh3_64_hexdigest(f"{self._scope_base}|{self._copier.describe}".encode())
        scope = f"{self.model}-{layout}"
        self.tiers = KvTiers.open(self.settings, scope=scope, block_bytes=self._copier.block_bytes)
        if self.tiers is not None:
            self._server = _TierServer(self.tiers, self._address, self._key)
        log.info("Sluice KV tiers %s for %s (blocks of %d bytes)",
                 self.tiers.names if self.tiers else "off", scope, self._copier.block_bytes)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        start = time.perf_counter()
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvbmMeta)
        for load in meta.loads:
            read_n = self._onboard(load)
            if read_n < len(load.block_ids):
                self._load_errors.update(load.block_ids[read_n:])
                self._failed_reqs.add(load.req_id)
        if self.tiers is not None:
            self.tiers.stats.in_step(meta.sched_seconds + time.perf_counter() - start)

    def _onboard(self, load: _Load) -> int:
        if self.tiers is None or self._copier is None:
            return 0
        try:
            read = self.tiers.onboard(load.hashes, load.parent)
            for block_id, payload in zip(load.block_ids, read.payloads, strict=False):
                self._copier.write(block_id, payload)
        except Exception:  # noqa: BLE001 - an onboard that fails is a recompute, never the request's error
            log.exception("onboarding %d blocks failed; they are recomputed", len(load.block_ids))
            return 0
        if len(read) < len(load.hashes):
            log.info("onboarded %d of %d blocks (%s); the rest are recomputed", len(read), len(load.hashes),
                     read.stopped)
        return len(read)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are whole before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
                      **kwargs: Any) -> None:
        return  # saved whole in wait_for_save, once every layer is written

    def wait_for_save(self) -> None:
        start = time.perf_counter()
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvbmMeta)
        failed, self._failed_reqs = self._failed_reqs, set()
        if self.tiers is None or self._copier is None or not meta.saves:
            return
        blocks: list[Block] = []
        for save in meta.saves:
            if save.req_id in failed:
                continue  # its KV attended to blocks that were not loaded
            parents = [save.parent, *save.hashes[:-1]]
            blocks.extend((h, self._copier.read(b), up)
                          for b, h, up in zip(save.block_ids, save.hashes, parents, strict=True))
        if blocks:
            self.tiers.offload(blocks)
        self.tiers.stats.in_step(time.perf_counter() - start)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self) -> KvbmWorkerMeta | None:
        if self.tiers is None:
            return None
        start = time.perf_counter()
        events = [(e.tier, e.stored, list(e.block_hashes)) for e in self.tiers.take_events()]
        self.tiers.stats.in_step(time.perf_counter() - start)
        return KvbmWorkerMeta(events) if events else None

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        if self.tiers is not None:
            self.tiers.flush(5.0)
            self.tiers.close()
            self.tiers = None

    # ==== scheduler side =============================================================================
    def _state(self, request: Request) -> _Request | None:
        state = self._requests.get(request.request_id)
        if state is None:
            if request.mm_features or getattr(request, "cache_salt", None):
                return None  # their blocks' names need the router's extra salt: not tiered
            lora = request.lora_request.lora_name if request.lora_request else None
            state = self._requests[request.request_id] = _Request(request, root_hash(self.model, lora))
        return state

    def _hashes(self, state: _Request, n_blocks: int) -> list[int]:
        known = len(state.hashes)
        if n_blocks > known:
            tokens = state.request.all_token_ids[: n_blocks * self.block_size]
            parent = state.hashes[-1] if known else None
            state.hashes.extend(block_hashes(list(tokens), self.block_size, state.root, start_block=known,
                                             parent=parent))
        return state.hashes[:n_blocks]

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        start = time.perf_counter()
        try:
            return self._matched(request, num_computed_tokens)
        finally:
            self._sched_seconds += time.perf_counter() - start

    def _matched(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        state = self._state(request)
        if state is None or self._client is None:
            return 0, False
        first = num_computed_tokens // self.block_size
        last = (request.num_tokens - 1) // self.block_size  # the last token is always computed
        if last <= first:
            return 0, False
        wanted = self._hashes(state, last)[first:]
        try:
            held = int(self._client.call("lookup", wanted))
        except Exception as exc:  # noqa: BLE001 - no answer: no tier hit, the prompt is computed
            log.warning("KV tier lookup failed (%s: %s); computing the prompt", type(exc).__name__, exc)
            held = 0
        state.offer = (first, held)
        return held * self.block_size, False

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        return {CacheHitSource.HOST: num_external_tokens} if num_external_tokens else {}

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        state = self._requests.get(request.request_id)
        if state is None or num_external_tokens <= 0:
            return
        first, _ = state.offer
        state.load = (first, num_external_tokens // self.block_size)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvbmMeta:
        start = time.perf_counter()
        meta = KvbmMeta()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            self._plan(meta, new.req_id, new.block_ids[0], new.num_computed_tokens, scheduled[new.req_id], True)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            resumed = req_id in cached.resumed_req_ids
            self._plan(meta, req_id, None, cached.num_computed_tokens[i], scheduled[req_id], resumed)
        meta.sched_seconds, self._sched_seconds = self._sched_seconds + time.perf_counter() - start, 0.0
        return meta

    def _plan(self, meta: KvbmMeta, req_id: str, block_ids: list[int] | None, computed: int, scheduled: int,
              fresh: bool) -> None:
        state = self._requests.get(req_id)
        if state is None:
            return
        if block_ids is None:
            if self._kv_cache_manager is None:
                return
            block_ids = self._kv_cache_manager.get_block_ids(req_id)[0]
        b = self.block_size
        if state.load is not None:
            first, n = state.load
            state.load = None
            hashes = self._hashes(state, first + n)
            meta.loads.append(_Load(req_id, block_ids[first:first + n], hashes[first:], hashes[first - 1] if first else None))
        if fresh:
            state.saved_upto = computed // b  # vLLM's hit and what this step onboards are not offloaded again
        start = min(state.saved_upto, computed // b)  # a recompute after a failed load lowers ``computed``
        end = min(computed + scheduled, len(state.request.all_token_ids)) // b
        if end <= start:
            return
        hashes = self._hashes(state, end)
        meta.saves.append(_Save(req_id, block_ids[start:end], hashes[start:end], hashes[start - 1] if start else None))
        state.saved_upto = end

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._requests.pop(request.request_id, None)
        return False, None

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if not isinstance(meta, KvbmWorkerMeta):
            return
        start = time.perf_counter()
        for tier, stored, hashes in meta.events:
            medium = MEDIUM_PREFIX + tier
            if stored:
                self._events.append(BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=[],
                                                block_size=self.block_size, lora_id=None, medium=medium,
                                                lora_name=None))
            else:
                self._events.append(BlockRemoved(block_hashes=hashes, medium=medium))
        self._sched_seconds += time.perf_counter() - start

    def take_events(self) -> Iterable[KVCacheEvent]:
        events, self._events = self._events, []
        return events

    def reset_cache(self) -> bool | None:
        """vLLM's prefix-cache reset leaves the tiers as they are: they hold valid KV below the cache."""
        return True

    def shutdown_scheduler(self) -> None:
        if self._client is not None:
            self._client.close()
