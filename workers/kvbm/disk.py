"""The local-disk tier: one file per block under a directory, LRU under a byte budget. Thread-safe.

The directory outlives the worker: at start the tier lists the files already there (oldest access first)
and serves them, so a restarted worker comes back warm. Files are written to a temporary name and
renamed, so a crash mid-write leaves no half block under a block's name (and a damaged one fails its
checksum on read: a miss). The budget counts blocks at the nominal ``frame_bytes`` (see
workers.kvbm.host). ``scope`` names the model and KV layout; blocks of another scope are never
read, since their bytes would not fit this engine.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

_SUFFIX = ".kv"


class DiskTier:
    name = "disk"

    def __init__(self, root: Path, scope: str, budget_bytes: int, frame_bytes: int) -> None:
        if budget_bytes < frame_bytes or frame_bytes <= 0:
            raise ValueError("the disk tier's budget must hold at least one block")
        self.budget_bytes = budget_bytes
        self.frame_bytes = frame_bytes
        self.capacity = budget_bytes // frame_bytes
        self.dir = root / scope
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._order: OrderedDict[int, None] = OrderedDict()
        self._load()

    def _load(self) -> None:
        found: list[tuple[float, int]] = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                os.unlink(entry.path)  # a write that never finished
                continue
            if not entry.name.endswith(_SUFFIX):
                continue
            try:
                block_hash = int(entry.name[: -len(_SUFFIX)], 16)
                stat = entry.stat()
            except (ValueError, OSError):
                continue
            found.append((stat.st_mtime, block_hash))
        for _mtime, block_hash in sorted(found):
            self._order[block_hash] = None
        self._evict_over()

    def _path(self, block_hash: int) -> Path:
        return self.dir / f"{block_hash & ((1 << 64) - 1):016x}{_SUFFIX}"

    @property
    def used_bytes(self) -> int:
        return len(self._order) * self.frame_bytes

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._order

    def hashes(self) -> list[int]:
        with self._lock:
            return list(self._order)

    def get(self, block_hash: int) -> bytes | None:
        with self._lock:
            if block_hash not in self._order:
                return None
            self._order.move_to_end(block_hash)
        path = self._path(block_hash)
        try:
            frame = path.read_bytes()
            os.utime(path)  # its place in the LRU order after a restart
        except OSError:
            self.discard(block_hash)
            return None
        return frame

    def put(self, block_hash: int, frame: bytes) -> tuple[bool, list[int]]:
        """Write a frame; returns whether it was stored and the blocks evicted to make room."""
        with self._lock:
            if block_hash in self._order:
                self._order.move_to_end(block_hash)
                return True, []
        path = self._path(block_hash)
        tmp = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(frame)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False, []
        with self._lock:
            if block_hash in self._order:
                return True, []
            self._order[block_hash] = None
            evicted = self._evict_over()
        return True, evicted

    def _evict_over(self) -> list[int]:
        evicted: list[int] = []
        while len(self._order) > self.capacity:
            block_hash, _ = self._order.popitem(last=False)
            self._path(block_hash).unlink(missing_ok=True)
            evicted.append(block_hash)
        return evicted

    def discard(self, block_hash: int) -> bool:
        with self._lock:
            if block_hash not in self._order:
                return False
            del self._order[block_hash]
        self._path(block_hash).unlink(missing_ok=True)
        return True

    def clear(self) -> list[int]:
        with self._lock:
            gone = list(self._order)
            self._order.clear()
        for block_hash in gone:
            self._path(block_hash).unlink(missing_ok=True)
        return gone
