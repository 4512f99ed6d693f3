"""vLLM's KV cache events, translated into Sluice block hashes.

vLLM names cached blocks with its own chained hashes and publishes ``BlockStored`` /
``BlockRemoved`` / ``AllBlocksCleared`` over ZMQ (one msgpack ``KVEventBatch`` per engine step,
in order). The router only knows Sluice hashes (``router.hashing``), so every stored block is
re-hashed here from the token ids the event carries, chained from its parent's Sluice hash, and
the vLLM -> Sluice mapping is kept so that a later ``BlockRemoved`` (which carries only vLLM
hashes) can be translated too.

Invariants:

* ``cached_hashes()`` is the set a router replaying every event returned by ``apply``/``clear``
  holds.
* vLLM may cache the same content in two physical blocks (two requests computing the same prefix
  at once): it then reports two stores and, later, two removals of one hash. Entries are counted,
  and a Sluice ``BlockRemoved`` is emitted only when the last copy goes. Re-announcing a stored
  hash is harmless (a router's index is a set), so stores are always forwarded whole, keeping
  their chain order and parent.

* Lost reports (:class:`KvEventFeed`): vLLM's publisher numbers its batches and drops some when its
  subscriber falls behind; a batch may also be unreadable. Either way the translator can no longer
  vouch for any block it knows (a lost ``BlockRemoved`` may concern any of them), and vLLM cannot be
  asked what it caches: the translator forgets everything and the sink gets a
  :class:`workers.engines.base.KvTrackLost`, on which the host rebuilds the index from
  ``cached_hashes()``. From then on the index lists a subset of vLLM's cache, never a block vLLM
  dropped: blocks cached before the loss (and blocks stored on top of them) are left out until vLLM
  computes them again.

The wire structs mirror the fields of vLLM's ``vllm.distributed.kv_events`` that Sluice reads;
unknown fields and unknown event kinds are ignored, so this module imports neither vLLM nor ZMQ
and is tested without them (the ZMQ socket is workers.engines.vllm.kv_subscriber).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, KvTier
from router.hashing import BlockHash, block_hashes, root_hash
from workers.engines.base import KvEventSink, KvLossReason, KvTrackLost, emit_kv_events

log = logging.getLogger(__name__)

#: vLLM block hashes are 64-bit ints by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) or bytes.
VllmHash = int | bytes

#: The device tier whose blocks the engine computes with; offload tiers report other media.
_DEVICE_MEDIA = (None, "GPU")
#: The ``medium`` of the events of Sluice's own KV connector (workers.engines.vllm.kvbm_connector):
#: ``sluice:host``, ``sluice:disk``, ``sluice:shared``. Their block hashes are Sluice's already.
MEDIUM_PREFIX = "sluice:"
_TIERS: dict[str, KvTier] = {MEDIUM_PREFIX + "host": "host", MEDIUM_PREFIX + "disk": "disk",
                              MEDIUM_PREFIX + "shared": "shared"}


class WireBlockStored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[VllmHash]
    parent_block_hash: VllmHash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_name: str | None = None
    medium: str | None = None


class WireBlockRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[VllmHash]
    medium: str | None = None


class WireAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


WireEvent = WireBlockStored | WireBlockRemoved | WireAllBlocksCleared


class _WireBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_batch_decoder = msgspec.msgpack.Decoder(_WireBatch)
_event_decoder = msgspec.msgpack.Decoder(WireEvent)
_KNOWN_KINDS = frozenset(cls.__struct_config__.tag for cls in (WireBlockStored, WireBlockRemoved, WireAllBlocksCleared))


class UndecodableBatch(ValueError):
    """A published batch, or an event in it of a kind this module knows, could not be read."""


def decode_batch(payload: bytes) -> list[WireEvent]:
    """The events of one published batch, skipping kinds this module does not know (a newer vLLM's).
    Raises :class:`UndecodableBatch` when the batch cannot be read, or an event of a known kind: what
    it reported is lost."""
    try:
        raw_events = _batch_decoder.decode(payload).events
    except msgspec.DecodeError as exc:
        raise UndecodableBatch(f"a batch of {len(payload)} bytes could not be read: {exc}") from exc
    events: list[WireEvent] = []
    for raw in raw_events:
        try:
            events.append(_event_decoder.decode(raw))
        except msgspec.DecodeError as exc:
            kind = _kind(raw)
            if kind is None or kind in _KNOWN_KINDS:
                raise UndecodableBatch(f"a {kind or 'untagged'} event could not be read: {exc}") from exc
            log.debug("skipping a vLLM KV event of unknown kind %r", kind)
    return events


def _kind(raw: msgspec.Raw) -> str | None:
    """The ``type`` tag of an encoded event, if it has one."""
    try:
        value = msgspec.msgpack.decode(raw)
    except msgspec.DecodeError:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None


def sequence_gap(expected: int, seq: int) -> str | None:
    """What was lost before batch ``seq`` when batch ``expected`` was due (None: nothing).

    The publisher numbers its batches from 0 and drops what its subscriber does not take in time: a
    number past ``expected`` means the batches in between were lost. A number before it means a
    publisher that counts afresh: what the earlier batches described cannot be followed either."""
    if seq == expected:
        return None
    if seq > expected:
        return f"batches {expected}..{seq - 1} were lost" if seq > expected + 1 else f"batch {expected} was lost"
    return f"the batch numbering went back from {expected} to {seq}"


@dataclass(slots=True)
class _Entry:
    sluice_hash: int
    copies: int


class KvEventTranslator:
    """Turns vLLM KV events into Sluice KV events for one engine (one model, one block size)."""

    def __init__(self, model: str, block_size: int) -> None:
        self.model = model
        self.block_size = block_size
        self._by_vllm: dict[VllmHash, _Entry] = {}
        self._sluice_refs: dict[int, int] = {}
        self._lost_track = False

    def apply(self, events: Iterable[WireEvent]) -> list[KvEvent]:
        out: list[KvEvent] = []
        for event in events:
            if isinstance(event, WireBlockStored):
                stored = self._stored(event)
                if stored is not None:
                    out.append(stored)
            elif isinstance(event, WireBlockRemoved):
                removed = self._removed(event)
                if removed is not None:
                    out.append(removed)
            else:
                out.extend(self.clear())
        return out

    def clear(self) -> list[KvEvent]:
        """Forget every block (the engine's prefix cache was reset)."""
        self._by_vllm.clear()
        self._sluice_refs.clear()
        return [AllBlocksCleared()]

    def forget(self) -> None:
        """Forget every block because reports were lost (vLLM's cache was not reset): from now on a
        stored block whose parent is unknown is expected (its parent was cached before the loss)."""
        self.clear()
        self._lost_track = True

    def cached_hashes(self) -> list[int]:
        return list(self._sluice_refs)

    @property
    def cached_count(self) -> int:
        return len(self._sluice_refs)

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        """How many leading tokens of ``token_ids`` (whole blocks) the prefix cache holds now."""
        held = 0
        for block_hash in block_hashes(token_ids, self.block_size, root_hash(self.model)):
            if block_hash not in self._sluice_refs:
                break
            held += self.block_size
        return held

    def _stored(self, event: WireBlockStored) -> BlockStored | None:
        tier = _TIERS.get(event.medium or "")
        if tier is not None:  # a KV tier's: hashes already Sluice's, chains not contiguous
            return BlockStored(block_hashes=[int(h) for h in event.block_hashes], tier=tier) if event.block_hashes else None
        if event.medium not in _DEVICE_MEDIA or not event.block_hashes:
            return None
        n = len(event.block_hashes)
        if event.block_size != self.block_size or len(event.token_ids) != n * self.block_size:
            log.warning(
                "ignoring a vLLM BlockStored of %d blocks with block size %d and %d tokens (engine block size %d)",
                n, event.block_size, len(event.token_ids), self.block_size,
            )  # fmt: skip
            return None
        if event.parent_block_hash is None:
            parent: int | None = None
            seed = root_hash(self.model, event.lora_name)
        else:
            entry = self._by_vllm.get(event.parent_block_hash)
            if entry is None:
                log.log(logging.DEBUG if self._lost_track else logging.WARNING,
                        "ignoring a vLLM BlockStored whose parent block is unknown")
                return None
            parent = seed = BlockHash(entry.sluice_hash)
        # The chain continues from the parent: with ``root`` set to the parent's hash, the first
        # block hashes as H(tokens, parent), exactly as it would inside the whole prompt.
        hashes = block_hashes(event.token_ids, self.block_size, seed)
        for vllm_hash, sluice_hash in zip(event.block_hashes, hashes, strict=True):
            entry = self._by_vllm.get(vllm_hash)
            if entry is None:
                self._by_vllm[vllm_hash] = _Entry(sluice_hash, 1)
                self._sluice_refs[sluice_hash] = self._sluice_refs.get(sluice_hash, 0) + 1
            else:
                entry.copies += 1
        return BlockStored(block_hashes=list(hashes), parent_hash=parent)

    def _removed(self, event: WireBlockRemoved) -> BlockRemoved | None:
        tier = _TIERS.get(event.medium or "")
        if tier is not None:
            return BlockRemoved(block_hashes=[int(h) for h in event.block_hashes], tier=tier) if event.block_hashes else None
        if event.medium not in _DEVICE_MEDIA:
            return None
        gone: list[int] = []
        for vllm_hash in event.block_hashes:
            entry = self._by_vllm.get(vllm_hash)
            if entry is None:
                continue
            entry.copies -= 1
            if entry.copies > 0:
                continue
            del self._by_vllm[vllm_hash]
            refs = self._sluice_refs[entry.sluice_hash] - 1
            if refs:
                self._sluice_refs[entry.sluice_hash] = refs
            else:
                del self._sluice_refs[entry.sluice_hash]
                gone.append(entry.sluice_hash)
        return BlockRemoved(block_hashes=gone) if gone else None


class KvEventFeed:
    """Turns the messages of vLLM's KV event publisher into the engine's KV reports, in order.

    A message is the frames ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian batch number, the
    payload one msgpack batch. A gap in the numbering (:func:`sequence_gap`), a malformed message or an
    unreadable batch (:func:`decode_batch`) makes the translator forget what it knew and hands the sink
    a :class:`KvTrackLost` (module docstring); the batch that revealed a gap is applied after it."""

    def __init__(self, translator: KvEventTranslator, sink: KvEventSink) -> None:
        self.translator = translator
        self.sink = sink
        self.next_seq = 0

    def receive(self, frames: Sequence[bytes]) -> None:
        if len(frames) != 3:
            self._lose_track("undecodable", f"a message of {len(frames)} frames instead of 3")
            return
        _, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        gap = sequence_gap(self.next_seq, seq)
        self.next_seq = seq + 1
        if gap is not None:
            self._lose_track("gap", gap)
        try:
            events = self.translator.apply(decode_batch(payload))
        except UndecodableBatch as exc:
            self._lose_track("undecodable", f"batch {seq}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - the translator may be half-way through the batch
            log.exception("could not translate vLLM KV event batch %d", seq)
            self._lose_track("undecodable", f"batch {seq} could not be translated: {type(exc).__name__}: {exc}")
            return
        emit_kv_events(self.sink, events)

    def _lose_track(self, reason: KvLossReason, detail: str) -> None:
        log.warning("vLLM KV events: %s; forgetting the cache they described, the index will be rebuilt", detail)
        self.translator.forget()
        emit_kv_events(self.sink, [KvTrackLost(reason, detail)])
