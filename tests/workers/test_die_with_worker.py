"""A worker killed with SIGKILL takes the engine processes it started with it (workers/engines/
die_with_worker.py): real processes, started through multiprocessing as vLLM starts its engine core,
spawned and forked, from a thread other than the main one as the worker's engine loop is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from bench.devstack import wait_until, with_parent_death_signal

PARENT = textwrap.dedent("""
    import multiprocessing, sys, threading, time
    from pathlib import Path
    from workers.engines.die_with_worker import children_die_with_this_thread

    method, cache_dir, armed = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "armed"

    def start_engine():
        ctx = multiprocessing.get_context(method)
        if armed:
            with children_die_with_this_thread(cache_dir):
                child = ctx.Process(target=time.sleep, args=(3600,), daemon=False)
                child.start()
        else:
            child = ctx.Process(target=time.sleep, args=(3600,), daemon=False)
            child.start()
        print(child.pid, flush=True)
        time.sleep(3600)  # the engine loop runs as long as the worker

    threading.Thread(target=start_engine, name="engine-loop", daemon=True).start()
    time.sleep(3600)
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _start_parent(method: str, cache_dir: Path, armed: bool) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen(with_parent_death_signal([sys.executable, "-c", PARENT, method, str(cache_dir),
                                                        "armed" if armed else "bare"]),
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    line = parent.stdout.readline() if parent.stdout else ""
    assert line.strip().isdigit(), f"the parent printed {line!r}"
    child = int(line)
    # A spawned child is armed once the wrapper has run (setpriv, then Python in its place): the
    # worker it belongs to is alive for that instant in practice, and here it is waited for. A forked
    # child checks its parent once armed, and needs no wait.
    if method == "spawn":
        python = os.path.realpath(sys.executable)
        wait_until(lambda: psutil.Process(child).exe() == python, 20, "the child to run Python")
    return parent, child


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_the_engine_process_ends_with_its_killed_worker(method: str, tmp_path: Path) -> None:
    parent, child = _start_parent(method, tmp_path, armed=True)
    try:
        assert not _gone(child)
        parent.kill()
        parent.wait(10)
        wait_until(lambda: _gone(child), 20, f"the {method} child {child} to end with its killed parent")
    finally:
        parent.kill()
        parent.wait(10)
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_without_it_the_engine_process_outlives_its_killed_worker(tmp_path: Path) -> None:
    """What happens otherwise, which is what the test above would see if arming did nothing."""
    parent, child = _start_parent("spawn", tmp_path, armed=False)
    try:
        parent.kill()
        parent.wait(10)
        assert not _gone(child)
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)
            wait_until(lambda: _gone(child), 10, "the orphan to end")


def test_the_spawn_interpreter_is_restored_after_the_block(tmp_path: Path) -> None:
    import multiprocessing.spawn

    from workers.engines.die_with_worker import children_die_with_this_thread

    before = multiprocessing.spawn.get_executable()
    with children_die_with_this_thread(tmp_path):
        wrapper = os.fsdecode(multiprocessing.spawn.get_executable())
    assert multiprocessing.spawn.get_executable() == before
    assert os.access(wrapper, os.X_OK) and Path(wrapper).parent == tmp_path / "bin"
