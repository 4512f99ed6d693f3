"""An engine's KV tiers: host memory, local disk and the shared Redis, composed (docs/kvbm.md).

Offload is write-through and asynchronous: an engine hands over each block as it becomes full
(:meth:`KvTiers.offload` returns at once) and a background thread seals it with its checksum and writes it
to every tier that is on. So the tiers hold a superset of the device cache, and a block the device evicts
is already below it.

Onboard reads a prompt's leading run in chain order, each block from the fastest tier that holds it (host,
then disk, then shared, the shared tier's blocks in one round trip), checks every frame, and stops at the
first block that is missing, corrupt or late: the engine recomputes from there. Blocks read from disk or
the shared tier are offered to the host tier, so the next hit is faster.

Tier membership changes come out as :class:`TierEvent` (:meth:`KvTiers.take_events`) for the router's
prefix index; the shared tier's are model-wide (any worker can onboard them).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core.settings import KvbmSettings
from workers.kvbm.credit import configured_onboard_s
from workers.kvbm.disk import DiskTier
from workers.kvbm.frame import frame_size, seal, unseal
from workers.kvbm.host import HostTier
from workers.kvbm.shared import SharedTier, TierDown
from workers.kvbm.stats import TierStats

log = logging.getLogger(__name__)

#: Blocks the offload thread takes from its queue per pass (one shared-tier round trip).
_OFFLOAD_BATCH = 256


@dataclass(frozen=True, slots=True)
class TierEvent:
    """Blocks entered (``stored``) or left a tier."""

    tier: str
    stored: bool
    block_hashes: list[int]
    #: Of stored blocks: each one's parent (None at a chain's root), aligned with ``block_hashes``.
    parents: list[int | None] | None = None


@dataclass(slots=True)
class TierRead:
    """An onboard: the leading run's payloads in chain order and the tier each came from; ``stopped`` says
    why the run ended before the asked blocks did (None: it did not)."""

    payloads: list[bytes] = field(default_factory=list)
    tiers: list[str] = field(default_factory=list)
    stopped: str | None = None

    def __len__(self) -> int:
        return len(self.payloads)


@dataclass(frozen=True, slots=True)
class TierReport:
    """What an engine's tiers hold and did, as of one moment: what the worker's metrics, load record and
    credits read (``Engine.tier_report``). ``held``: blocks and bytes per local tier; ``prior_onboard_s``:
    each tier's configured seconds per block, for credits before any onboard was measured."""

    names: list[str]
    held: dict[str, tuple[int, int]]
    stats: TierStats
    prior_onboard_s: dict[str, float]


#: A block handed to the tiers: its hash, its KV bytes and its chain's parent (None at a chain's root).
Block = tuple[int, bytes, int | None]


class LocalTier(Protocol):
    name: str

    def __contains__(self, block_hash: int) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def used_bytes(self) -> int: ...
    def get(self, block_hash: int) -> bytes | None: ...
    def put(self, block_hash: int, frame: bytes, parent: int | None = None) -> tuple[bool, list[int]]: ...
    def discard(self, block_hash: int) -> list[int]: ...
    def parent_of(self, block_hash: int) -> int | None: ...
    def hashes(self) -> list[int]: ...
    def clear(self) -> list[int]: ...


class KvTiers:
    def __init__(self, settings: KvbmSettings, *, scope: str, block_bytes: int, inline: bool = False) -> None:
        """``inline``: offload in the caller, no thread (simulations on a virtual clock need every effect
        to happen at a known instant; bench.kvbm_bench)."""
        self.settings = settings
        self.block_bytes = block_bytes
        self.frame_bytes = frame_size(block_bytes)
        self.stats = TierStats()
        self.host = HostTier(settings.host_bytes, self.frame_bytes) if settings.host_bytes > 0 else None
        self.disk = (DiskTier(settings.disk_dir, scope, settings.disk_bytes, self.frame_bytes)
                     if settings.disk_on and settings.disk_dir is not None else None)
        self.shared = (SharedTier(settings.redis_url, scope, ttl_s=settings.shared_ttl_s,
                                  timeout_s=settings.timeout_ms / 1000.0, down_backoff_s=settings.down_backoff_s)
                       if settings.redis_url else None)
        self.local: list[LocalTier] = [t for t in (self.host, self.disk) if t is not None]
        self._events: list[TierEvent] = []
        self._events_lock = threading.Lock()
        self._pending: queue.Queue[Block | None] = queue.Queue(settings.offload_queue_blocks)
        self.inline = inline
        self._thread = threading.Thread(target=self._offload_loop, name="kvbm-offload", daemon=True)
        if not inline:
            self._thread.start()
        if self.disk is not None and len(self.disk):
            held = self.disk.hashes()
            self._event("disk", True, held, [self.disk.parent_of(h) for h in held])

    @classmethod
    def open(cls, settings: KvbmSettings, *, scope: str, block_bytes: int) -> KvTiers | None:
        """The tiers the settings turn on, or None when none is."""
        return cls(settings, scope=scope, block_bytes=block_bytes) if settings.enabled else None

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.local] + (["shared"] if self.shared is not None else [])

    # ---- offload ----------------------------------------------------------------------------------
    def offload(self, blocks: Sequence[Block]) -> None:
        """Hand full blocks (hash, payload, parent), each chain in order, to the offload thread; never waits
        (a full queue drops them, and a block whose parent a tier does not hold is not taken there)."""
        if self.inline:
            self._write(list(blocks))
            return
        dropped = 0
        for block in blocks:
            try:
                self._pending.put_nowait(block)
            except queue.Full:
                dropped += 1
        if dropped:
            self.stats.dropped(dropped)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every block handed over so far is written (tests and shutdown)."""
        deadline = time.monotonic() + timeout_s
        done = self._pending.all_tasks_done
        with done:
            while self._pending.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                done.wait(left)
        return True

    def _offload_loop(self) -> None:
        while True:
            item = self._pending.get()
            batch: list[Block] = []
            stop = item is None
            if item is not None:
                batch.append(item)
            while not stop and len(batch) < _OFFLOAD_BATCH:
                try:
                    more = self._pending.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    batch.append(more)
            cpu = time.thread_time()
            try:
                self._write(batch)
            except Exception:  # noqa: BLE001 - an offload that fails costs a later recompute, never the engine
                log.exception("KV offload failed")
            finally:
                self.stats.offload_cpu(time.thread_time() - cpu)
                for _ in range(len(batch) + (1 if stop else 0)):
                    self._pending.task_done()
            if stop:
                return

    def _write(self, batch: list[Block]) -> None:
        frames = [(h, seal(h, payload), parent) for h, payload, parent in batch]
        for tier in self.local:
            stored: list[int] = []
            evicted: list[int] = []
            for h, frame, parent in frames:
                if h in tier:
                    if tier is self.host:
                        self.touch([h])  # a repeat offer counts as a use for the frequency filter
                    continue
                taken, gone = tier.put(h, frame, parent)
                if taken:
                    stored.append(h)
                    self.stats.offloaded(tier.name, self.frame_bytes)
                evicted.extend(gone)
            self._stored_and_evicted(tier, stored, evicted)
        if self.shared is not None and frames:
            try:
                self.shared.put_many([(h, frame) for h, frame, _parent in frames])
            except TierDown:
                return
            for _h, frame, _parent in frames:
                self.stats.offloaded("shared", len(frame))
            self._event("shared", True, [h for h, _frame, _parent in frames])

    def _stored_and_evicted(self, tier: LocalTier, stored: list[int], evicted: list[int]) -> None:
        """One batch's changes as events: a block both stored and evicted in it was never announced."""
        new, gone = set(stored), set(evicted)
        self._event(tier.name, False, [h for h in evicted if h not in new])
        kept = [h for h in stored if h not in gone]
        self._event(tier.name, True, kept, [tier.parent_of(h) for h in kept])

    def touch(self, block_hashes: Sequence[int]) -> None:
        """A request reused these blocks from the engine's cache: they are hot (the host tier's filter)."""
        if self.host is not None and block_hashes:
            self.host.touch(list(block_hashes))

    # ---- onboard ----------------------------------------------------------------------------------
    def lookup(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of a chain some tier holds (the shared tier asked in one bounded
        round trip; a down shared tier counts as holding nothing)."""
        return len(self.locate(block_hashes))

    def locate(self, block_hashes: Sequence[int], tiers: Collection[str] | None = None) -> list[str]:
        """The tier an onboard would read each block of the chain's leading run from, reading nothing
        (``tiers``: only these, as in :meth:`onboard`; a down shared tier counts as holding nothing)."""
        local = self.local if tiers is None else [t for t in self.local if t.name in tiers]
        shared = self.shared if tiers is None or "shared" in tiers else None
        found: list[str] = []
        for h in block_hashes:
            tier = next((t for t in local if h in t), None)
            if tier is None:
                break
            found.append(tier.name)
        if len(found) == len(block_hashes) or shared is None:
            return found
        try:
            held = shared.exists_many(list(block_hashes[len(found):]))
        except TierDown:
            return found
        found.extend("shared" for _ in itertools.takewhile(bool, held))
        return found

    def onboard(self, block_hashes: Sequence[int], parent: int | None = None,
                tiers: Collection[str] | None = None) -> TierRead:
        """Read the leading run of ``block_hashes`` the tiers hold, verified, within ``timeout_ms``.
        ``parent``: the block before the first one (None: the first starts its chain), so that what is read
        from disk or the shared tier can join the host tier. ``tiers``: read only these (an engine leaves
        out a tier slower than recomputing); None: all."""
        start = time.monotonic()
        local = self.local if tiers is None else [t for t in self.local if t.name in tiers]
        shared = self.shared if tiers is None or "shared" in tiers else None
        deadline = start + self.settings.timeout_ms / 1000.0
        read = TierRead()
        per_tier: dict[str, float] = {}
        i = 0
        while i < len(block_hashes):
            h = block_hashes[i]
            tier = next((t for t in local if h in t), None)
            if tier is None:
                break
            t0 = time.monotonic()
            payload = unseal(h, tier.get(h))
            per_tier[tier.name] = per_tier.get(tier.name, 0.0) + time.monotonic() - t0
            if payload is None:
                self._event(tier.name, False, tier.discard(h))
                self.stats.recomputed("corrupt")
                read.stopped = "corrupt"
                break
            read.payloads.append(payload)
            read.tiers.append(tier.name)
            i += 1
            if time.monotonic() > deadline:
                read.stopped = "timeout"
                break
        if read.stopped is None and i < len(block_hashes) and shared is not None:
            self._onboard_shared(block_hashes[i:], read, per_tier)
        elif read.stopped is None and i < len(block_hashes):
            read.stopped = "miss"
        for tier_name, seconds in per_tier.items():
            blocks = read.tiers.count(tier_name)
            if blocks:
                self.stats.hit(tier_name, blocks, blocks * self.block_bytes)
                self.stats.onboard_took(tier_name, seconds)
        if read.stopped in ("timeout", "down"):
            self.stats.recomputed(read.stopped, len(block_hashes) - len(read))
        if self.host is not None and read.payloads:
            parents = [parent, *block_hashes[: len(read) - 1]]
            promote = [(h, p, up) for h, p, t, up in zip(block_hashes, read.payloads, read.tiers, parents, strict=False)
                       if t != "host"]
            if promote:
                self.offload(promote)
        return read

    def _onboard_shared(self, rest: Sequence[int], read: TierRead, per_tier: dict[str, float]) -> None:
        assert self.shared is not None
        t0 = time.monotonic()
        try:
            frames = self.shared.get_many(list(rest))
        except TierDown:
            read.stopped = "down"
            return
        finally:
            per_tier["shared"] = time.monotonic() - t0
        for h, frame in zip(rest, frames, strict=True):
            if frame is None:
                read.stopped = "miss"
                return
            payload = unseal(h, frame)
            if payload is None:
                self.stats.recomputed("corrupt")
                read.stopped = "corrupt"
                return
            read.payloads.append(payload)
            read.tiers.append("shared")

    # ---- state ------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, list[int]]:
        """What each local tier holds (a resync's content; the shared tier is model-wide, not this worker's)."""
        return {t.name: t.hashes() for t in self.local}

    def clear(self) -> None:
        """Empty the host tier (the engine's cache was reset); disk and shared content stay valid."""
        if self.host is not None:
            gone = self.host.clear()
            if gone:
                self._event("host", False, gone)

    def take_events(self) -> list[TierEvent]:
        with self._events_lock:
            events, self._events = self._events, []
            return events

    def _event(self, tier: str, stored: bool, block_hashes: list[int],
               parents: list[int | None] | None = None) -> None:
        if not block_hashes:
            return
        with self._events_lock:
            self._events.append(TierEvent(tier, stored, block_hashes, parents))

    def held(self) -> dict[str, tuple[int, int]]:
        """Per local tier: blocks held and their bytes."""
        return {t.name: (len(t), t.used_bytes) for t in self.local}

    def report(self) -> TierReport:
        return TierReport(self.names, self.held(), self.stats.snapshot(),
                          {t: configured_onboard_s(self.settings, t, self.block_bytes) for t in self.names})

    def close(self) -> None:
        if not self.inline:
            self._pending.put(None)
            self._thread.join(timeout=10)
        if self.shared is not None:
            self.shared.close()
