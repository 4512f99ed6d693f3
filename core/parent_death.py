"""A process that dies with its parent: Linux's ``PR_SET_PDEATHSIG``.

A parent killed with SIGKILL runs no clean-up; children that asked the kernel for a signal on their
parent's death get it and end too (the engine core of a vLLM worker, the processes of a frontend that
serves with several). The "parent" is the thread that started the process.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def arm_parent_death_signal(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> None:
    """Ask the kernel for ``sig`` when this process's parent thread dies; if the parent already died
    (``parent_pid`` given and no longer the parent), the signal comes at once."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
