"""docker/flower.sh (the image's ``sluice-flower``): Flower starts without a password only when
it is published on loopback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.checks import FLOWER_SCRIPT


def run_flower(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The script with a stand-in ``sluice`` that prints its arguments and whether it got a password."""
    stub = tmp_path / "sluice"
    stub.write_text('#!/bin/sh\necho "sluice $* auth=${FLOWER_BASIC_AUTH-unset}"\n')
    stub.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if k not in ("FLOWER_BASIC_AUTH", "PUBLISHED_ON")}
    return subprocess.run(["sh", str(FLOWER_SCRIPT)], env={**clean, **env, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("published", ["127.0.0.1:5555", "localhost:5555", "[::1]:5555"])
def test_loopback_needs_no_password(tmp_path: Path, published: str) -> None:
    run = run_flower(tmp_path, {"PUBLISHED_ON": published, "FLOWER_BASIC_AUTH": ""})
    assert run.returncode == 0, run.stderr
    # An empty FLOWER_BASIC_AUTH would make Flower ask for a password nobody has: it is dropped.
    assert run.stdout.strip() == "sluice flower --port 5555 --address 0.0.0.0 auth=unset"


@pytest.mark.parametrize("env", [{}, {"PUBLISHED_ON": "5555"}, {"PUBLISHED_ON": "0.0.0.0:5555"},
                                 {"PUBLISHED_ON": "10.0.0.2:5555", "FLOWER_BASIC_AUTH": ""}])
def test_published_further_refuses_to_start_without_a_password(tmp_path: Path, env: dict[str, str]) -> None:
    run = run_flower(tmp_path, env)
    assert run.returncode == 2 and run.stdout == ""
    assert "set FLOWER_BASIC_AUTH=user:password" in run.stderr


def test_published_further_with_a_password(tmp_path: Path) -> None:
    run = run_flower(tmp_path, {"PUBLISHED_ON": "5555", "FLOWER_BASIC_AUTH": "ops:s3cret"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "sluice flower --port 5555 --address 0.0.0.0 auth=ops:s3cret"
