"""core.shm: the /dev/shm entries a process's descendants hold are found, and removed once the
descendant that held them is killed; an entry another process still maps stays."""

from __future__ import annotations

import signal
import subprocess
import sys
from multiprocessing import shared_memory

from core import shm

# A child that makes a segment, keeps it mapped and leaves it to nobody (no resource tracker), as
# vLLM's engine processes do with their message queues.
_CHILD = """
import sys, time
from multiprocessing import resource_tracker, shared_memory
seg = shared_memory.SharedMemory(create=True, size=4096)
resource_tracker.unregister(seg._name, "shared_memory")
print(seg.name, flush=True)
time.sleep(120)
"""


def test_a_killed_childs_segment_is_noted_then_removed_and_a_held_one_stays() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    mine = shared_memory.SharedMemory(create=True, size=4096)
    try:
        name = child.stdout.readline().strip()
        noted = shm.ShmEntries.held_by_descendants()
        assert name in {e.name for e in noted.entries}
        assert noted.remove_orphans() == []  # the child still maps it
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert noted.remove_orphans() == [name]
        assert not (shm.SHM / name).exists()
        assert (shm.SHM / mine.name).exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        mine.close()
        mine.unlink()
