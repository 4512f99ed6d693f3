"""The local-disk tier: one file per block under a directory, prefix-closed, under a byte budget.
Thread-safe.

A block's file is ``<hash>-<parent>.kv`` (``root`` for a chain's first block), so the directory says the
chains without a file being read. It outlives the worker: at start the tier lists what is there, drops
unfinished writes and blocks whose parent is gone, and serves the rest, oldest access first in its
eviction order, so a restarted worker comes back warm. Files are written to a temporary name and renamed,
so a crash mid-write leaves no half block under a block's name (and a damaged one fails its checksum on
read: a miss). Eviction takes the least recently used leaf (workers.kvbm.chains). The budget counts blocks
at the nominal ``frame_bytes`` (see workers.kvbm.host). ``scope`` names the model and KV layout; blocks of
another scope are never read, since their bytes would not fit this engine.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from workers.kvbm.chains import Chains

_SUFFIX = ".kv"
_MASK = (1 << 64) - 1


def _name(block_hash: int, parent: int | None) -> str:
    return f"{block_hash & _MASK:016x}-{'root' if parent is None else format(parent & _MASK, '016x')}{_SUFFIX}"


def _parse(name: str) -> tuple[int, int | None] | None:
    if not name.endswith(_SUFFIX):
        return None
    block, _, parent = name[: -len(_SUFFIX)].partition("-")
    try:
        return int(block, 16), None if parent == "root" else int(parent, 16)
    except ValueError:
        return None


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
        self._chains = Chains()
        self._load()

    def _load(self) -> None:
        found: dict[int, tuple[int | None, float]] = {}
        for entry in os.scandir(self.dir):
            parsed = _parse(entry.name)
            if entry.name.endswith(".tmp") or parsed is None:
                if entry.name.endswith(".tmp"):
                    os.unlink(entry.path)  # a write that never finished
                continue
            try:
                found[parsed[0]] = (parsed[1], entry.stat().st_mtime)
            except OSError:
                continue
        # Parents before children (a chain's order, whatever the access times), each at its access rank.
        rank = {b: i for i, b in enumerate(sorted(found, key=lambda b: found[b][1]))}
        children: dict[int | None, list[int]] = {}
        for b, (p, _mtime) in found.items():
            children.setdefault(p if p in found else (None if p is None else -1), []).append(b)
        todo = list(children.get(None, []))
        while todo:
            b = todo.pop()
            self._chains.add(b, found[b][0], stamp=rank[b])
            todo.extend(children.get(b, []))
        for b in children.get(-1, []):  # their parent's file is gone: they could never be read
            self._unlink(b, found[b][0])
            for gone in self._descendants(b, children):
                self._unlink(gone, found[gone][0])
        self._evict_over()

    @staticmethod
    def _descendants(block: int, children: dict[int | None, list[int]]) -> list[int]:
        out, todo = [], list(children.get(block, []))
        while todo:
            b = todo.pop()
            out.append(b)
            todo.extend(children.get(b, []))
        return out

    def _path(self, block_hash: int, parent: int | None) -> Path:
        return self.dir / _name(block_hash, parent)

    def _unlink(self, block_hash: int, parent: int | None) -> None:
        self._path(block_hash, parent).unlink(missing_ok=True)

    @property
    def used_bytes(self) -> int:
        return len(self._chains) * self.frame_bytes

    def __len__(self) -> int:
        return len(self._chains)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._chains

    def hashes(self) -> list[int]:
        with self._lock:
            return list(self._chains)

    def parent_of(self, block_hash: int) -> int | None:
        return self._chains.parent.get(block_hash)

    def get(self, block_hash: int) -> bytes | None:
        with self._lock:
            if block_hash not in self._chains:
                return None
            parent = self._chains.parent[block_hash]
            self._chains.use(block_hash)
        path = self._path(block_hash, parent)
        try:
            frame = path.read_bytes()
            os.utime(path)  # its place in the eviction order after a restart
        except OSError:
            self.discard(block_hash)
            return None
        return frame

    def put(self, block_hash: int, frame: bytes, parent: int | None = None) -> tuple[bool, list[int]]:
        """Write a frame (its chain's ``parent``); returns whether it was stored and the blocks evicted.
        Only the offload thread writes, so the room made before the write is still there after it."""
        with self._lock:
            if block_hash in self._chains:
                self._chains.use(block_hash)
                return True, []
            if not self._chains.can_hold(parent):
                return False, []
            evicted: list[int] = []
            if len(self._chains) >= self.capacity:
                victim = self._chains.victim()
                if victim is None or victim == parent:
                    return False, []
                evicted = self._remove(victim)
        path = self._path(block_hash, parent)
        tmp = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(frame)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False, evicted
        with self._lock:
            if not self._chains.can_hold(parent):  # its parent was dropped meanwhile (a failed read)
                path.unlink(missing_ok=True)
                return False, evicted
            self._chains.add(block_hash, parent)
        return True, evicted

    def _evict_over(self) -> list[int]:
        evicted: list[int] = []
        while len(self._chains) > self.capacity:
            victim = self._chains.victim()
            if victim is None:
                break
            evicted.extend(self._remove(victim))
        return evicted

    def _remove(self, block: int) -> list[int]:
        """Drop ``block`` and its descendants, files included (under the lock)."""
        parents = self._chains.subtree(block)
        gone = self._chains.remove(block)
        for b in gone:
            self._unlink(b, parents[b])
        return gone

    def discard(self, block_hash: int) -> list[int]:
        """Drop a block and its descendants (they would hang from nothing); returns them."""
        with self._lock:
            return self._remove(block_hash)

    def clear(self) -> list[int]:
        with self._lock:
            parents = dict(self._chains.parent)
            gone = self._chains.clear()
        for b in gone:
            self._unlink(b, parents[b])
        return gone
