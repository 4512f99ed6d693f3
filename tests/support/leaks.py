"""What a test run leaves behind: processes it started that still run, and shared-memory entries
(``/dev/shm``) it made that nothing holds any more. ``tests/conftest.py`` takes a snapshot when the
run starts, and when it ends ends the leftovers and fails the run if there were any.

Processes are told apart by a tag in their environment (:data:`RUN_TAG_VAR`), set in the test
process's own environment at start and inherited by everything started from it, however far down
and whoever its parent is now (an orphan's parent is init). The variable's name does not start with
``SLUICE_``: the stack launcher passes a process none of the test process's ``SLUICE_`` variables.

A ``/dev/shm`` entry is left behind when it appeared during the run and no live process maps it or
holds it open (a ``psm_*`` segment of vLLM's message queues, a ``sem.mp-*`` semaphore, after a
process was SIGKILLed); entries other processes on the machine use at the time stay out of it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RUN_TAG_VAR = "PYTEST_SLUICE_RUN"
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class Leftover:
    pid: int
    name: str
    cmdline: str
    ports: tuple[int, ...]

    def __str__(self) -> str:
        ports = f" listening on {', '.join(map(str, self.ports))}" if self.ports else ""
        return f"pid {self.pid} {self.cmdline[:160]}{ports}"


@dataclass
class RunSnapshot:
    """The run's tag and the ``/dev/shm`` entries that existed before it."""

    tag: str
    shm_before: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def take(cls, tag: str) -> RunSnapshot:
        return cls(tag=tag, shm_before=frozenset(_shm_entries()))


def tagged_processes(tag: str, exclude: set[int]) -> list[psutil.Process]:
    """Live processes (zombies aside) whose environment carries ``RUN_TAG_VAR=tag``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in exclude:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(RUN_TAG_VAR) == tag:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def describe(proc: psutil.Process) -> Leftover | None:
    try:
        ports = tuple(sorted({c.laddr.port for c in proc.net_connections(kind="inet")
                              if c.status == psutil.CONN_LISTEN}))
        return Leftover(proc.pid, proc.name(), " ".join(proc.cmdline()), ports)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def end_processes(procs: list[psutil.Process], grace_s: float = 10.0) -> None:
    """SIGTERM to each, then SIGKILL to what is still running after ``grace_s``."""
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def orphaned_shm(before: frozenset[str]) -> list[Path]:
    """``/dev/shm`` entries that appeared since ``before`` and that no live process maps or holds open.

    Entries are matched by inode, not by name: a POSIX semaphore is created under a temporary name and
    then linked to its own, so its mappings may show either name."""
    new = set(_shm_entries()) - before
    if not new:
        return []
    held = _held_shm_inodes()
    orphans = []
    for name in sorted(new):
        try:
            if os.stat(SHM / name).st_ino not in held:
                orphans.append(SHM / name)
        except OSError:
            continue  # removed meanwhile
    return orphans


def _shm_entries() -> list[str]:
    try:
        return [entry.name for entry in os.scandir(SHM)]
    except OSError:
        return []


def _held_shm_inodes() -> set[int]:
    """Inodes of /dev/shm's file system mapped (``/proc/PID/maps``) or open (``/proc/PID/fd``) by any process."""
    try:
        shm_dev = os.stat(SHM).st_dev
    except OSError:
        return set()
    dev_field = f"{os.major(shm_dev):02x}:{os.minor(shm_dev):02x}"
    held: set[int] = set()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
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
