"""``sluice start`` (sluice/launcher.py): honcho's process manager, whose SIGTERM goes to each
process alone (not to its children) and whose SIGKILL waits for the patience the drains need instead
of honcho's 5 s; a second Ctrl-C still kills at once.

Each test runs the launcher on a small Procfile of Python processes that say ``up`` once their
SIGTERM handler is in place, then take as long to exit as the test needs."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from honcho import manager as honcho_manager
from honcho.environ import parse_procfile

from bench.devstack import REPO, Processes, wait_until
from core.settings import Settings
from sluice.launcher import EXECS, EXIT_MARGIN_S, parse_concurrency, shutdown_patience_s
from tests.support.launched import Launched

#: A process that exits ``argv[1]`` seconds after SIGTERM (``never``: it ignores SIGTERM).
SLOW_EXIT = """\
import signal, sys, time
delay = sys.argv[1]
def on_term(signum, frame):
    if delay != "never":
        time.sleep(float(delay))
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("up", flush=True)
while True:
    signal.pause()
"""


#: A child in its parent's process group (as a vLLM worker's engine core is): asked, it says
#: whether a SIGTERM reached it.
CHILD = """\
import signal, sys
seen = []
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
print("child up", flush=True)
sys.stdin.readline()
print("child saw SIGTERM" if seen else "child saw no SIGTERM", flush=True)
"""
#: A process with such a child: on SIGTERM it asks the child, waits for its answer and exits.
WITH_CHILD = f"""\
import signal, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], stdin=subprocess.PIPE, text=True)
def on_term(signum, frame):
    child.communicate("report\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("up", flush=True)
while True:
    signal.pause()
"""

#: A process that dies of SIGTERM at once, leaving a child of its group that would run on (as a vLLM
#: worker stopped while its engine loads leaves the engine's processes).
LEAVES_A_CHILD = """\
import signal, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import signal; print('child up', flush=True); signal.pause()"])
print("up", flush=True)
while True:
    signal.pause()
"""


@pytest.fixture
def processes() -> Iterator[Processes]:
    p = Processes(prefix="sluice-launcher-")
    yield p
    p.stop()


def _launch(processes: Processes, tmp_path: Path, lines: dict[str, str], patience_s: float,
            kill_wait_s: float | None = None, program: str = SLOW_EXIT) -> Launched:
    """``sluice start`` on a Procfile of ``lines`` (name: ``program``'s argument), once every process
    is up; with ``kill_wait_s``, honcho's own KILL_WAIT shortened to it (no test outwaits 5 s)."""
    script = tmp_path / "program.py"
    script.write_text(program)
    procfile = tmp_path / "Procfile"
    procfile.write_text("".join(f"{name}: exec {sys.executable} {script} {arg}\n" for name, arg in lines.items()))
    patch = f"import honcho.manager; honcho.manager.KILL_WAIT = {kill_wait_s}; " if kill_wait_s is not None else ""
    code = f"{patch}import sys; from sluice.cli import main; sys.exit(main(sys.argv[1:]))"
    launched = Launched.start(processes, [sys.executable, "-c", code, "start", "-f", str(procfile),
                                          "--patience", str(patience_s)], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for name in lines:
            up = re.compile(rf"^\S+ {name}\.1\s+\| up$", re.M)
            wait_until(lambda up=up: bool(up.search(launched.output())) or not launched.proc.alive(), 30, f"{name} up")
    except BaseException:
        launched.stop()
        raise
    return launched


def test_sigterm_goes_to_the_process_and_not_to_its_children(processes: Processes, tmp_path: Path) -> None:
    launched = _launch(processes, tmp_path, {"parent": ""}, patience_s=120, program=WITH_CHILD)
    try:
        launched.wait_for_line("child up", 30)
        launched.interrupt()
        assert launched.wait_exit(60) == 130
        assert "child saw no SIGTERM" in launched.output(), launched.output()
        assert launched.stopped() == {"parent.1": 0}
    finally:
        launched.stop()


def test_what_is_left_of_a_group_whose_process_exited_gets_sigterm(processes: Processes, tmp_path: Path) -> None:
    launched = _launch(processes, tmp_path, {"leaver": ""}, patience_s=600, program=LEAVES_A_CHILD)
    try:
        launched.wait_for_line("child up", 30)
        launched.interrupt()
        assert launched.wait_exit(60) == 130  # not the 600 s of patience
        assert launched.stopped() == {"leaver.1": -signal.SIGTERM}, launched.output()
        assert "SIGKILL" not in launched.output()
    finally:
        launched.stop()


def test_a_process_still_draining_at_honchos_kill_wait_is_not_killed(processes: Processes, tmp_path: Path) -> None:
    # honcho would kill "drainer" 0.2 s after "quick" exited; it needs 1.5 s, well within the patience.
    launched = _launch(processes, tmp_path, {"quick": "0", "drainer": "1.5"}, patience_s=120, kill_wait_s=0.2)
    try:
        launched.interrupt()
        assert launched.wait_exit(60) == 130  # honcho's code for SIGINT
        assert launched.stopped() == {"quick.1": 0, "drainer.1": 0}, launched.output()
        assert "SIGKILL" not in launched.output()
    finally:
        launched.stop()


def test_a_process_still_running_when_the_patience_is_spent_is_killed(processes: Processes, tmp_path: Path) -> None:
    # It never exits by itself, so honcho's loop, which counts from the first exit, would wait for ever.
    launched = _launch(processes, tmp_path, {"stubborn": "never"}, patience_s=1)
    try:
        launched.interrupt()
        launched.wait_exit(60)
        assert launched.stopped() == {"stubborn.1": -signal.SIGKILL}, launched.output()
        assert "sending SIGKILL to stubborn.1" in launched.output()
    finally:
        launched.stop()


def test_a_second_ctrl_c_kills_at_once(processes: Processes, tmp_path: Path) -> None:
    launched = _launch(processes, tmp_path, {"stubborn": "never"}, patience_s=600)
    try:
        launched.interrupt()
        launched.wait_for_line("Ctrl-C again kills them now", 30)
        launched.interrupt()
        launched.wait_exit(60)  # not the 600 s
        assert launched.stopped() == {"stubborn.1": -signal.SIGKILL}, launched.output()
        assert "SIGINT received again" in launched.output()
    finally:
        launched.stop()


def test_the_patience_covers_the_longest_drain() -> None:
    settings = Settings()
    assert shutdown_patience_s(settings) == max(settings.worker.drain_timeout_s,
                                                settings.frontend.drain_timeout_s) + EXIT_MARGIN_S
    longer = settings.model_copy(update={"worker": settings.worker.model_copy(update={"drain_timeout_s": 300.0})})
    assert shutdown_patience_s(longer) == 300.0 + EXIT_MARGIN_S
    # Longer than honcho's own, which is what the launcher is for.
    assert shutdown_patience_s(settings) > honcho_manager.KILL_WAIT


def test_concurrency_reads_honchos_form() -> None:
    assert parse_concurrency("worker=2, prefill=1") == {"worker": 2, "prefill": 1}
    assert parse_concurrency(None) == {}


@pytest.mark.parametrize("procfile", ["Procfile", "Procfile.disagg"])
def test_each_line_of_make_runs_procfiles_execs_its_program(procfile: str) -> None:
    # Otherwise SIGTERM reaches the line's shell first, then the program's children with it (a vLLM
    # worker's engine would abort its running requests instead of finishing them).
    processes = parse_procfile((REPO / procfile).read_text()).processes
    assert processes and all(EXECS.match(command) for command in processes.values()), processes


def test_a_line_that_execs_is_told_from_one_that_does_not() -> None:
    assert EXECS.match("SLUICE_POOL=prefill SLUICE_WORKERS=2 exec scripts/worker.sh --name prefill-$PORT")
    assert not EXECS.match("scripts/worker.sh --name worker-$PORT")
    assert not EXECS.match("cd app && exec ./serve")
