"""``sluice start``: run a Procfile's processes together, as ``honcho start`` does, with the
patience their shutdown needs, and with SIGTERM sent where a container would send it.

Usage::

    sluice start -f Procfile -c worker=2
    sluice start -f Procfile.disagg

Why not ``honcho start``: on Ctrl-C (or when one process exits) honcho sends SIGTERM to every
process, then SIGKILL to those still running 5 s after the first one exited (``KILL_WAIT`` in
``honcho.manager``; its command line has no option for it). A worker whose requests are still
running gets ``SLUICE_WORKER__DRAIN_TIMEOUT_S`` (60 s) to finish them, a frontend with open streams
``SLUICE_FRONTEND__DRAIN_TIMEOUT_S`` (30 s): under honcho both drains were cut short at 5 s. And
honcho sends SIGTERM to each process's whole group: a vLLM worker's engine processes (its engine
core and the core's model worker) got it too, and vLLM's engine core aborts every running request
on SIGTERM, so a vLLM worker had nothing left to drain.

Here honcho serves as a library (its Procfile parser and :class:`honcho.manager.Manager`), and
:class:`PatientManager` changes two things. SIGTERM goes to each process alone, as ``docker stop``
and Kubernetes send it to a container's main process; a Sluice process stops its own children (a
vLLM worker shuts its engine down once its requests are done). SIGKILL waits until
:func:`shutdown_patience_s` has passed since the shutdown began (the longest drain and a margin for
what follows it), then goes to each whole group. A stack with nothing in flight still stops in a
few seconds: a worker with no running request and a frontend with no open stream exit at once. A
second Ctrl-C (or SIGTERM) kills at once.

SIGTERM must reach the program, not a shell around it: each Procfile line runs under ``sh -c``
(in a session of its own), so it ``exec``-s its program (Sluice's Procfiles do). For a line that
does not (the launcher warns at start), the shell gets SIGTERM and exits, and what is left of its
group then gets SIGTERM as under honcho (:class:`SignalTheProcess`), the program's children included.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TextIO

import psutil
from honcho.compat import ProcessManager
from honcho.environ import expand_processes, parse_procfile
from honcho.manager import SYSTEM_PRINTER_NAME, Manager
from honcho.printer import Message, Printer

from core.settings import Settings

#: Time given past the longest drain: the frontend's uvicorn backstop (5 s past its drain, see
#: ``sluice serve``), a worker's hand-over of what still ran and its engine's shutdown.
EXIT_MARGIN_S = 20.0
#: A Procfile command that replaces its shell by its program: ``[VAR=value ...] exec program ...``.
EXECS = re.compile(r"^\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*exec\s")
#: honcho's first ``$PORT`` (each process type gets the next hundred, each copy the next port).
BASE_PORT = 5000


def shutdown_patience_s(settings: Settings) -> float:
    """How long the processes may take to exit after SIGTERM before they are killed:
    ``max(worker.drain_timeout_s, frontend.drain_timeout_s) + EXIT_MARGIN_S`` (80 s by default)."""
    return max(settings.worker.drain_timeout_s, settings.frontend.drain_timeout_s) + EXIT_MARGIN_S


class SignalTheProcess(ProcessManager):
    """honcho's process signaller, with SIGTERM for the process alone (honcho's goes to its group);
    SIGKILL still goes to the whole group.

    A process that exits while members of its group live on (a vLLM worker killed by the signal
    while its engine was still loading leaves the engine's processes behind) would keep its line
    open until the patience is spent: once its leader has exited, what is left of a group that was
    sent SIGTERM gets SIGTERM too, as honcho would have sent it.
    """

    def __init__(self, poll_s: float = 0.2) -> None:
        self.poll_s = poll_s
        self._watched: set[int] = set()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def terminate(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return
        with self._lock:
            self._watched.add(pid)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="orphans", daemon=True)
                self._watcher.start()

    def _watch(self) -> None:
        while True:
            with self._lock:
                gone = {pid for pid in self._watched if not _running(pid)}
                self._watched -= gone
                if not self._watched and not gone:
                    self._watcher = None
                    return
            for pgid in gone:  # the leader is a zombie until honcho reaps it: its group id is not reused
                try:
                    os.killpg(pgid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(self.poll_s)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class PatientManager(Manager):
    """honcho's Manager, whose SIGTERM goes to each process alone and whose SIGKILL waits
    ``patience_s`` from the start of the shutdown.

    honcho's loop calls :meth:`terminate` at the first signal or the first process exit, and then,
    from ``KILL_WAIT`` after that exit on, :meth:`kill` on every turn. Here those calls kill nothing
    until the patience is spent; then a timer kills what still runs (it also fires when no process
    ever exits, where honcho's loop would wait for ever). A signal that arrives once the shutdown has
    begun kills at once.

    honcho signals through its Manager's ``_procmgr`` (a private attribute, replaced here; the
    check below and tests/sluice/test_launcher.py fail if honcho changes that).
    """

    def __init__(self, printer: Printer, patience_s: float) -> None:
        super().__init__(printer)
        if not isinstance(getattr(self, "_procmgr", None), ProcessManager):
            raise RuntimeError("honcho's Manager no longer signals through _procmgr: sluice.launcher needs updating")
        self._procmgr = SignalTheProcess()
        self.patience_s = patience_s
        self._system_printer = printer
        self._timer: threading.Timer | None = None
        self._out_of_patience = threading.Event()
        self._kill_lock = threading.Lock()
        self._killed = False

    def terminate(self) -> None:
        if self._timer is None:
            # The second signal's handler is in place before the line that invites it is printed.
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, self._on_second_signal)
            self._timer = threading.Timer(self.patience_s, self._lose_patience)
            self._timer.daemon = True
            self._timer.start()
            self.say(f"stopping: each process may take up to {self.patience_s:.0f} s to finish what it "
                      "runs; Ctrl-C again kills them now")
        super().terminate()

    def kill(self) -> None:
        if self._out_of_patience.is_set():
            self._kill_once()

    def stop_timer(self) -> None:
        """Every process has exited: no kill is pending."""
        if self._timer is not None:
            self._timer.cancel()

    def _on_second_signal(self, signum: int, frame: FrameType | None) -> None:
        self.say(f"{signal.Signals(signum).name} received again: killing what still runs")
        self._lose_patience()

    def _lose_patience(self) -> None:
        self._out_of_patience.set()
        self._kill_once()

    def _kill_once(self) -> None:
        with self._kill_lock:
            if self._killed:
                return
            self._killed = True
        super().kill()

    def say(self, text: str) -> None:
        """A line of the launcher's own, among honcho's ``system`` lines."""
        self._system_printer.write(Message(type="line", data=f"{text}\n", time=datetime.datetime.now(),
                                           name=SYSTEM_PRINTER_NAME, colour=None))


def parse_concurrency(text: str | None) -> dict[str, int]:
    """``worker=2,prefill=1`` (honcho's ``-c``) as a mapping; types not named run once."""
    if not text:
        return {}
    counts = {}
    for item in text.split(","):
        name, _, count = item.partition("=")
        counts[name.strip()] = int(count)
    return counts


def run(procfile: Path, patience_s: float, concurrency: dict[str, int] | None = None,
        port: int = BASE_PORT, output: TextIO = sys.stdout) -> int:
    """Start every process of ``procfile`` (in the current directory, with this environment plus
    honcho's ``PORT`` and ``HONCHO_PROCESS_NAME``); return once all have exited, with honcho's
    return code (130 after Ctrl-C, 143 after SIGTERM, else the first exit's code)."""
    processes = parse_procfile(procfile.read_text()).processes
    unknown = set(concurrency or {}) - set(processes)
    if unknown:
        raise ValueError(f"{procfile} has no process type {', '.join(sorted(unknown))}")
    manager = PatientManager(Printer(output), patience_s)
    for name, command in processes.items():
        if not EXECS.match(command):
            manager.say(f"warning: {procfile}'s {name} line does not exec its program: at Ctrl-C its shell gets "
                        "SIGTERM, then the program and its children together")
    for p in expand_processes(processes, concurrency=concurrency, port=port):
        manager.add_process(p.name, p.cmd, quiet=p.quiet, env={**os.environ, **p.env})
    try:
        manager.loop()
    finally:
        manager.stop_timer()
    return int(manager.returncode or 0)

