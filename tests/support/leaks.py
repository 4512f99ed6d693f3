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

import signal
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from core import shm

RUN_TAG_VAR = "PYTEST_SLUICE_RUN"


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
        return cls(tag=tag, shm_before=frozenset(entry.name for entry in shm.entries()))


def tagged_processes(tag: str, exclude: set[int]) -> list[psutil.Process]:
    """Live processes (zombies aside) whose environment carries ``RUN_TAG_VAR=tag``."""
    return processes_with_env(RUN_TAG_VAR, tag, exclude)


def processes_with_env(var: str, value: str, exclude: set[int] | None = None) -> list[psutil.Process]:
    """Live processes (zombies aside) whose environment has ``var=value``, but those in ``exclude``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if exclude and proc.pid in exclude:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(var) == value:
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
    """``/dev/shm`` entries that appeared since ``before`` and that no live process maps or holds open."""
    new = [entry for entry in shm.entries() if entry.name not in before]
    if not new:
        return []
    held = shm.held_inodes()
    return sorted(shm.SHM / entry.name for entry in new if entry.inode not in held)
