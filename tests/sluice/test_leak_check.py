"""The end-of-run leak check (tests/support/leaks.py) finds what a run leaves behind: an orphaned
process started with the run's tag, wherever it was reparented, and a /dev/shm segment nothing holds
any more; and not what is still in use or was there before."""

from __future__ import annotations

import os
import subprocess
import uuid
from multiprocessing import shared_memory

import psutil

from bench.devstack import wait_until
from tests.support.leaks import RUN_TAG_VAR, RunSnapshot, end_processes, orphaned_shm, tagged_processes


def test_an_orphan_with_the_tag_is_found_and_ended() -> None:
    tag = uuid.uuid4().hex
    env = {**os.environ, RUN_TAG_VAR: tag}
    # The shell exits at once: its sleep is an orphan, reparented away from this process.
    subprocess.run(["sh", "-c", "sleep 120 >/dev/null 2>&1 &"], env=env, check=True)
    untagged = subprocess.Popen(["sleep", "120"])
    try:
        found: list[psutil.Process] = []

        def one_found() -> bool:
            found[:] = tagged_processes(tag, exclude={os.getpid()})
            return len(found) == 1

        wait_until(one_found, 10, "the orphaned sleep")
        assert found[0].name() == "sleep" and found[0].ppid() != os.getpid()
        end_processes(found)
        assert tagged_processes(tag, exclude={os.getpid()}) == []
    finally:
        untagged.kill()
        untagged.wait()


def test_a_shm_segment_nothing_holds_is_found_and_one_in_use_is_not() -> None:
    snapshot = RunSnapshot.take(uuid.uuid4().hex)
    held = shared_memory.SharedMemory(create=True, size=4096)
    dropped = shared_memory.SharedMemory(create=True, size=4096)
    try:
        dropped.close()  # unmapped and never unlinked: what a SIGKILLed process leaves
        names = {p.name for p in orphaned_shm(snapshot.shm_before)}
        assert dropped.name in names
        assert held.name not in names
    finally:
        held.close()
        held.unlink()
        dropped.unlink()
    assert not {p.name for p in orphaned_shm(snapshot.shm_before)} & {held.name, dropped.name}
