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

The wire structs mirror the fields of vLLM's ``vllm.distributed.kv_events`` that Sluice reads;
unknown fields and unknown event kinds are ignored, so this module imports neither vLLM nor ZMQ
and is tested without them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from router.hashing import block_hashes, root_hash

log = logging.getLogger(__name__)

#: vLLM block hashes are 64-bit ints by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) or bytes.
VllmHash = int | bytes

#: The device tier whose blocks the engine computes with; offload tiers report other media.
_DEVICE_MEDIA = (None, "GPU")


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


def decode_batch(payload: bytes) -> list[WireEvent]:
    """The events of one published batch, skipping kinds this module does not know."""
    events: list[WireEvent] = []
    for raw in _batch_decoder.decode(payload).events:
        try:
            events.append(_event_decoder.decode(raw))
        except msgspec.ValidationError:
            log.debug("skipping an unknown vLLM KV event")
    return events


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

    def cached_hashes(self) -> list[int]:
        return list(self._sluice_refs)

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        """How many leading tokens of ``token_ids`` (whole blocks) the prefix cache holds now."""
        held = 0
        for block_hash in block_hashes(token_ids, self.block_size, root_hash(self.model)):
            if block_hash not in self._sluice_refs:
                break
            held += self.block_size
        return held

    def _stored(self, event: WireBlockStored) -> BlockStored | None:
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
                log.warning("ignoring a vLLM BlockStored whose parent block is unknown")
                return None
            parent = seed = entry.sluice_hash
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
