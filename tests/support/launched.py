"""A Procfile launcher (``honcho start`` or ``sluice start``) that a test runs as a subprocess, and
that ends with everything it started, whatever happens to the test.

Usage::

    launched = Launched.start(processes, argv, env)
    try:
        launched.wait_for_line("web.1 started", 30)
        launched.interrupt()                       # Ctrl-C, as a terminal sends it
        launched.wait_exit(60)
    finally:
        launched.stop()

Why a helper: the launcher starts each process in a session of its own (honcho's ``Popen``), so the
signal that ends a launcher's process group does not reach them, and a launcher killed before its
children leaves them running. :meth:`Launched.stop` kills the launcher's group, then the group of
every process the launcher said it started (its ``NAME started (pid=N)`` lines), then any process
still carrying the environment marker this launch gave them all (one that started while the
launcher was being killed).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.devstack import REPO, Proc, Processes, wait_until
from tests.support.leaks import processes_with_env

#: The environment variable each launched process carries, with a value of its launch's own (not
#: ``SLUICE_``-prefixed: that namespace is the settings').
MARKER = "PYTEST_SLUICE_LAUNCH"
_STARTED = re.compile(r"^\S+ system\s+\| (\S+) started \(pid=(\d+)\)", re.M)
_STOPPED = re.compile(r"^\S+ system\s+\| (\S+) stopped \(rc=(-?\d+)\)", re.M)


@dataclass
class Launched:
    proc: Proc
    processes: Processes
    marker: str

    @classmethod
    def start(cls, processes: Processes, argv: list[str], env: dict[str, str], cwd: Path = REPO,
              name: str = "launcher") -> Launched:
        marker = uuid.uuid4().hex
        proc = processes.spawn(name, argv, {**env, MARKER: marker}, cwd=cwd)
        return cls(proc, processes, marker)

    def output(self) -> str:
        try:
            return self.proc.log.read_text(errors="replace")
        except OSError:
            return ""

    def started(self) -> dict[str, int]:
        """Each process the launcher started, and its pid (the leader of its process group)."""
        return {name: int(pid) for name, pid in _STARTED.findall(self.output())}

    def stopped(self) -> dict[str, int]:
        """Each process the launcher saw exit, and its return code (-9: killed by SIGKILL)."""
        return {name: int(rc) for name, rc in _STOPPED.findall(self.output())}

    def wait_for_line(self, text: str, timeout: float) -> None:
        """Until the launcher's output holds ``text``; fails at once if the launcher exited."""
        def seen() -> bool:
            if text in self.output():
                return True
            if not self.proc.alive():
                raise RuntimeError(f"the launcher exited ({self.proc.popen.returncode}):\n{self.proc.tail()}")
            return False

        wait_until(seen, timeout, f"{text!r} in the launcher's output")

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        """Signal the launcher's process group, as Ctrl-C in its terminal would."""
        self.processes.signal(self.proc.name, sig)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.popen.wait(timeout)

    def stop(self) -> None:
        """Kill whatever of this launch still runs (module docstring); the Processes' own ``stop``
        then removes its work directory."""
        self.processes.signal(self.proc.name, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.popen.wait(10)
        for pid in self.started().values():
            _kill_group(pid)
        for pid in self._marked():
            _kill_group(pid)
            _kill(pid)

    def _marked(self) -> list[int]:
        """Processes whose environment carries this launch's marker."""
        return [p.pid for p in processes_with_env(MARKER, self.marker)]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
