"""Shared-memory entries (``/dev/shm``: POSIX shared memory segments and named semaphores) and who
holds them, for cleaning up after processes that cannot clean up after themselves.

vLLM's engine processes talk through message queues in ``/dev/shm`` segments (``psm_*``, one of
160-250 MB each on CPU), which the process that made them removes when it shuts down cleanly, and
which Python's resource tracker of the worker removes when the worker exits. A process group that
is SIGKILLed whole (the tracker with it) leaves them behind, holding memory until the machine
restarts: the stack launcher (``bench.devstack``) notes what a group holds before it kills it
(:meth:`ShmEntries.held_by`) and removes what nothing holds afterwards
(:meth:`ShmEntries.remove_orphans`); the test run's leak check (tests/support/leaks.py) lists what
is left.

Entries are known by inode as well as by name: a name may be reused by a new entry, and a POSIX
semaphore is created under a temporary name and then linked to its own, so the mappings of a
process may show either name. Linux only (``/proc``); elsewhere every set is empty.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

SHM = Path("/dev/shm")


@dataclass(frozen=True)
class ShmEntry:
    name: str
    inode: int


@dataclass(frozen=True)
class ShmEntries:
    entries: frozenset[ShmEntry]

    @classmethod
    def held_by_descendants(cls, pid: int | None = None) -> ShmEntries:
        """The entries that the descendants of ``pid`` (default: this process) map or hold open."""
        return cls.held_by(descendants(os.getpid() if pid is None else pid))

    @classmethod
    def held_by(cls, pids: list[int]) -> ShmEntries:
        """The entries that any of ``pids`` maps or holds open."""
        inodes: set[int] = set()
        for pid in pids:
            inodes |= held_inodes(pid)
        return cls(frozenset(e for e in entries() if e.inode in inodes))

    def remove_orphans(self) -> list[str]:
        """Remove those of these entries that still exist (same name, same inode) and that no process
        maps or holds open any more; returns the names removed."""
        if not self.entries:
            return []
        held = held_inodes()
        removed = []
        for entry in self.entries:
            path = SHM / entry.name
            try:
                if path.stat().st_ino != entry.inode or entry.inode in held:
                    continue
                path.unlink()
            except OSError:
                continue
            removed.append(entry.name)
        return sorted(removed)

    async def release(self, timeout_s: float) -> None:
        """Remove these entries as their holders let go of them, for up to ``timeout_s`` seconds: after an
        engine's shutdown, its killed processes' segments are left to a resource tracker that lasts as long
        as the process that started them."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.remove_orphans()
            if not any((SHM / e.name).exists() for e in self.entries) or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.2)


def entries() -> list[ShmEntry]:
    """Every entry of /dev/shm now."""
    found = []
    try:
        with os.scandir(SHM) as it:
            for entry in it:
                try:
                    found.append(ShmEntry(entry.name, entry.inode()))
                except OSError:
                    continue
    except OSError:
        pass
    return found


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgid: int


def process_table() -> list[ProcStat]:
    """Every process now, from ``/proc/PID/stat`` (``pid (comm) state ppid pgrp ...``: comm may hold
    spaces and parentheses, so the fields are split after its last ")")."""
    table = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            table.append(ProcStat(int(stat.parent.name), fields[0], int(fields[1]), int(fields[2])))
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s children, their children, and so on."""
    children: dict[int, list[int]] = {}
    for proc in process_table():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def held_inodes(pid: int | None = None) -> set[int]:
    """Inodes of /dev/shm's file system that process ``pid`` (default: every process) maps
    (``/proc/PID/maps``) or holds open (``/proc/PID/fd``)."""
    try:
        shm_dev = os.stat(SHM).st_dev
    except OSError:
        return set()
    dev_field = f"{os.major(shm_dev):02x}:{os.minor(shm_dev):02x}"
    pid_dirs = [Path(f"/proc/{pid}")] if pid is not None else [
        d for d in Path("/proc").iterdir() if d.name.isdigit()]
    held: set[int] = set()
    for pid_dir in pid_dirs:
        try:
            for line in (pid_dir / "maps").read_text(errors="replace").splitlines():
                parts = line.split(maxsplit=5)  # address perms offset dev inode [path]
                if len(parts) >= 5 and parts[3] == dev_field:
                    held.add(int(parts[4]))
            for fd in (pid_dir / "fd").iterdir():
                try:
                    st = os.stat(fd)
                except OSError:
                    continue
                if st.st_dev == shm_dev:
                    held.add(st.st_ino)
        except OSError:
            continue
    return held
