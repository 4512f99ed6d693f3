"""vLLM's socket directory (workers/engines/vllm/ipc_dir.py): one per engine, swept when its worker died."""

from __future__ import annotations

import os
from pathlib import Path


def test_vllms_socket_directory_is_its_engines_and_a_dead_workers_is_swept(tmp_path: Path) -> None:
    import subprocess
    import sys

    from workers.engines.vllm.ipc_dir import IpcDir

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    left = tmp_path / f"{dead.stdout.strip()}-abcd"  # a killed worker's, with a socket file in it
    left.mkdir()
    (left / "sock").write_text("")
    mine = IpcDir.create(tmp_path)
    assert not left.exists() and mine.path.is_dir() and mine.path.name.startswith(f"{os.getpid()}-")
    other = IpcDir.create(tmp_path)  # a live process's directory stays
    assert mine.path.is_dir()
    mine.remove()
    other.remove()
    assert list(tmp_path.iterdir()) == []
