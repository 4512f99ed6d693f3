"""Session fixtures shared by every test package: a private Redis server and per-test namespaces;
a terminal summary that says loudly which suites did not run and how to run them; and a check at
the end of the run that nothing it started is left behind (tests/support/leaks.py)."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
import redis

from bench.devstack import RedisServer, stop_everything
from tests.support.leaks import RUN_TAG_VAR, RunSnapshot, describe, end_processes, orphaned_shm, tagged_processes

_RUN = pytest.StashKey[RunSnapshot]()


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


def pytest_configure(config: pytest.Config) -> None:
    """Tag every process this run starts (through the environment it inherits) and note /dev/shm."""
    tag = uuid.uuid4().hex
    os.environ[RUN_TAG_VAR] = tag
    config.stash[_RUN] = RunSnapshot.take(tag)


#: The timeout of a vLLM test without its own: the first test of a module also pays its module fixture,
#: which starts vLLM engines (2-4 minutes on a loaded 2-core machine, before the test's own requests).
VLLM_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """vLLM tests get :data:`VLLM_TEST_TIMEOUT_S` in place of the suite's 300 s, unless they set their own."""
    for item in items:
        if item.get_closest_marker("vllm") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(VLLM_TEST_TIMEOUT_S))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a process it started still runs, or a /dev/shm entry it made is held by
    nothing, after every test and fixture ended (and after what the stack launcher would stop at
    exit); then end and remove them, so that the machine is as before even then."""
    snapshot = session.config.stash.get(_RUN, None)
    if snapshot is None:
        return
    stop_everything()
    # Under pytest-xdist each worker checks the processes it started (they carry its own tag), and
    # the controller, once the workers are gone, checks /dev/shm for the whole run.
    xdist_controller = session.config.pluginmanager.get_plugin("dsession") is not None
    xdist_worker = hasattr(session.config, "workerinput")
    found: list[str] = []
    if not xdist_controller:
        me = psutil.Process()
        own_helpers = {p.pid for p in me.children() if "multiprocessing.resource_tracker" in " ".join(_cmdline(p))}
        procs = tagged_processes(snapshot.tag, exclude={me.pid, *own_helpers})
        found = [str(d) for d in map(describe, procs) if d is not None]
        end_processes(procs)
    shm = [] if xdist_worker else orphaned_shm(snapshot.shm_before)
    for path in shm:
        path.unlink(missing_ok=True)
    if not found and not shm:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("!", "the run left things behind (now ended and removed)", red=True, bold=True)
        for line in [*(f"process: {f}" for f in found), *(f"/dev/shm entry: {p.name}" for p in shm)]:
            reporter.write_line(f"  {line}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


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
