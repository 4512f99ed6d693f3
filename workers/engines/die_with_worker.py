"""Engine processes that die with their worker.

vLLM runs its engine core in a child process, started through ``multiprocessing``: spawned on a CPU (and
on a GPU once CUDA is initialised), forked otherwise. A worker killed with SIGKILL (the OOM killer, a
supervisor's last resort, ``kill -9``) runs no clean-up, and that child lives on: idle, holding its KV
cache (on a GPU most of the card's memory, so that the next engine on it cannot start).

The kernel can signal a process when the thread that started it dies (``PR_SET_PDEATHSIG``, kept
across ``exec``). :func:`children_die_with_this_thread` arms it for every process the block starts
through ``multiprocessing``:

* spawn: the interpreter ``multiprocessing`` runs is, for the block, a two-line wrapper
  (``setpriv --pdeathsig TERM -- python``), written once into the cache directory (a worker that dies
  in the milliseconds between the fork and ``setpriv``'s call, during the engine's start, is missed);
* fork: an at-fork hook in the child arms it with ``prctl``, for forks made by the arming thread only.

SIGTERM, not SIGKILL: vLLM's engine core exits cleanly on it, removing its shared-memory segments.
The "parent" is the thread that starts the process: arm from a thread that lives as long as the engine
(the worker's engine loop), never from a short-lived one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing.spawn
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.parent_death import arm_parent_death_signal

log = logging.getLogger(__name__)


@dataclass
class ForkArming:
    """Which thread of this process arms the children it forks (none: no child is armed). One per
    process: at-fork hooks are process-wide and cannot be removed."""

    thread_ident: int | None = None
    parent_pid: int = 0
    hooked: bool = False

    def after_fork_in_child(self) -> None:
        if self.thread_ident is not None and threading.get_ident() == self.thread_ident:
            self.thread_ident = None  # the child's own forks are its business
            arm_parent_death_signal(signal.SIGTERM, self.parent_pid)


FORK_ARMING = ForkArming()


def spawn_wrapper(cache_dir: Path, python: str = sys.executable) -> Path | None:
    """The interpreter wrapper that arms the parent-death signal (written once per interpreter); None
    where ``setpriv`` (util-linux) is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    digest = hashlib.sha256(f"{setpriv}\0{python}".encode()).hexdigest()[:16]
    path = cache_dir / "bin" / f"python-dies-with-parent-{digest}"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(f'#!/bin/sh\nexec {setpriv} --pdeathsig TERM -- "{python}" "$@"\n')
        partial.chmod(0o755)
        partial.replace(path)  # atomic: workers starting side by side share it
    return path


@contextlib.contextmanager
def children_die_with_this_thread(cache_dir: Path) -> Iterator[None]:
    """Processes started through ``multiprocessing`` inside the block, by this thread, get SIGTERM when
    this thread dies (see the module docstring). Not reentrant; one thread at a time."""
    wrapper = spawn_wrapper(cache_dir)
    if wrapper is None:
        log.warning("setpriv not found: the engine's processes will not end with a worker that is killed")
    if not FORK_ARMING.hooked:
        os.register_at_fork(after_in_child=FORK_ARMING.after_fork_in_child)
        FORK_ARMING.hooked = True
    previous = multiprocessing.spawn.get_executable()
    FORK_ARMING.thread_ident, FORK_ARMING.parent_pid = threading.get_ident(), os.getpid()
    if wrapper is not None:
        multiprocessing.spawn.set_executable(str(wrapper))
    try:
        yield
    finally:
        FORK_ARMING.thread_ident = None
        multiprocessing.spawn.set_executable(previous)
