"""Session fixtures shared by every test package: a private Redis server and per-test namespaces;
and a terminal summary that says loudly which suites did not run and how to run them."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from sluice.devstack import RedisServer


@dataclass(frozen=True)
class OptionalSuite:
    """Tests under ``marker`` need what a plain ``pytest`` in .venv may lack; ``command`` runs them."""

    marker: str
    name: str
    command: str


OPTIONAL_SUITES = (
    OptionalSuite("vllm", "vLLM", "make test-vllm   (or: .venv-vllm/bin/python -m pytest -p no:cacheprovider -m vllm)"),
    OptionalSuite("postgres", "PostgreSQL",
                  "./scripts/ensure_postgres.sh && .venv/bin/pytest -p no:cacheprovider -m postgres   "
                  "(server: SLUICE_TEST_POSTGRES_URL, default postgresql+psycopg2://postgres@localhost:5432/test)"),
)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    """After a run in which vLLM or PostgreSQL tests were skipped, or deselected without the marker
    expression naming them (``make test`` names them: it runs each suite in its own environment),
    print how many, why, and the command that runs them. Silent when they all ran."""
    named = set(re.findall(r"\w+", config.getoption("markexpr") or ""))
    deliberate = any(suite.marker in named for suite in OPTIONAL_SUITES)
    skipped = terminalreporter.stats.get("skipped", [])
    deselected = terminalreporter.stats.get("deselected", [])
    for suite in OPTIONAL_SUITES:
        # A module skipped whole at collection gives a CollectReport, which has no keywords.
        ours = [r for r in skipped if suite.marker in getattr(r, "keywords", {})]
        reasons = sorted({_skip_reason(r) for r in ours})
        n_skipped = len(ours)
        n_deselected = 0 if deliberate else sum(1 for item in deselected if item.get_closest_marker(suite.marker))
        if not n_skipped and not n_deselected:
            continue
        counts = " and ".join(part for part in (f"{n_skipped} skipped" if n_skipped else "",
                                                 f"{n_deselected} deselected" if n_deselected else "") if part)
        terminalreporter.write_sep("!", f"{suite.name} tests did NOT run: {counts}", red=True, bold=True)
        for reason in reasons:
            terminalreporter.write_line(f"  skipped because: {reason}", yellow=True)
        terminalreporter.write_line(f"  run them with: {suite.command}", bold=True)


def _skip_reason(report: pytest.TestReport) -> str:
    """The reason pytest gives for a skip (``longrepr`` is ``(path, line, 'Skipped: reason')``)."""
    if isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    return str(report.longrepr)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def namespace() -> str:
    """A fresh namespace per test: every key the test makes lives under it."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_client(redis_server: RedisServer, namespace: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    for key in client.scan_iter(match=f"sluice:{namespace}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture(scope="session")
def tokenizer_dir():  # noqa: ANN201
    """The default model's tokenizer-only directory (prepared once into the user cache)."""
    from core.settings import Settings
    from workers.models.prepare import prepare_model

    return prepare_model("smollm2", Settings().models_dir, weights=False, progress=False)
