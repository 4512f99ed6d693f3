"""Where vLLM's ZMQ sockets between the worker and its engine core live: a directory of the worker's own.

vLLM names them ``ipc://<VLLM_RPC_BASE_PATH>/<uuid>``, by default in the system's temporary directory, and
an engine that is killed, or that exits without closing every socket, leaves the socket files there for
good (hundreds after a day of tests). Each engine gets ``<cache>/vllm-ipc/<pid>-<token>`` instead, removed
when it shuts down; one left by a worker that was killed is removed by the next engine started on the
machine, once no process of that pid is alive.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class IpcDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, root: Path) -> IpcDir:
        """A fresh directory under ``root``, after removing those of dead processes."""
        root.mkdir(parents=True, exist_ok=True)
        for entry in root.iterdir():
            pid = entry.name.partition("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)
        path = root / f"{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir()
        return cls(path)

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(self.path)
