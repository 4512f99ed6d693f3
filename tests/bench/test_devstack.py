"""bench.devstack's cleanup promise: a launcher that ends in any way (SIGTERM or SIGINT to its
process group, an uncaught exception, a normal return) leaves no process and no temporary directory
behind, even without a ``finally`` of its own; one that is SIGKILLed leaves no process (its
temporary directories stay: nothing of it runs to remove them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bench.devstack import REPO, STOP_GRACE_S


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL", "exception", "return"])
def test_a_launcher_leaves_nothing_behind(how: str, tokenizer_dir: Path, tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    stderr = (tmp_path / "launcher.stderr").open("w+")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.stack_launcher", str(tokenizer_dir),
         "--then", "raise" if how == "exception" else "return"],
        cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=stderr, text=True, start_new_session=True)
    try:
        line = launcher.stdout.readline()
        assert line, f"the launcher did not start its stack:\n{stderr.seek(0) or stderr.read()}"
        dirs = [Path(d) for d in json.loads(line)["dirs"]]
        started = psutil.Process(launcher.pid).children(recursive=True)
        names = sorted(p.name() for p in started)
        assert len(started) >= 3 and any("redis-server" in n for n in names), names
        assert all(d.is_dir() and d.parent == tmp for d in dirs)

        if how in ("SIGTERM", "SIGINT", "SIGKILL"):
            os.killpg(launcher.pid, getattr(signal, how))  # as when `make` is interrupted
        else:
            launcher.stdin.write("go\n")
            launcher.stdin.flush()
        status = launcher.wait(60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)

    assert (status == 0) if how == "return" else (status != 0)
    # After SIGKILL the stack stops by itself (parent-death signal), as after SIGTERM: allow its grace.
    _, alive = psutil.wait_procs(started, timeout=STOP_GRACE_S + 15 if how == "SIGKILL" else 5)
    assert alive == [], f"left running: {[(p.pid, p.name()) for p in alive]}"
    if how == "SIGKILL":
        return
    assert not any(d.exists() for d in dirs)
    assert list(tmp.iterdir()) == []
