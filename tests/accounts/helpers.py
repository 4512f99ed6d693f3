"""What the accounts tests share: scratch PostgreSQL databases, a switchable database outage,
a bookkeeper worker subprocess, and usage record factories."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from bench.devstack import REPO, wait_until, with_parent_death_signal
from core.accounting import UsageRecord

#: The PostgreSQL server the tests use (trust auth); SLUICE_TEST_POSTGRES_URL points elsewhere.
PG_ADMIN_URL = os.environ.get("SLUICE_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@localhost:5432/test")


def postgres_unreachable_reason() -> str | None:
    """None when the test PostgreSQL server answers, else why not (shown as the skip reason)."""
    engine = sa.create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        return f"no PostgreSQL server reachable at {PG_ADMIN_URL}: {str(exc.orig).strip().splitlines()[0]}"
    finally:
        engine.dispose()
    return None


@dataclass
class ScratchPostgres:
    """A database of its own on the test server, created on enter and dropped (forcibly) on exit."""

    name: str = field(default_factory=lambda: f"sluice_t{uuid.uuid4().hex[:12]}")

    def __post_init__(self) -> None:
        self.admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")

    @property
    def url(self) -> str:
        return sa.make_url(PG_ADMIN_URL).set(database=self.name).render_as_string(hide_password=False)

    def create(self) -> ScratchPostgres:
        with self.admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        return self

    def drop(self) -> None:
        with self.admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()

    def refuse_connections(self) -> None:
        """Start an outage: the database refuses new connections and its open ones are cut."""
        with self.admin.connect() as connection:
            connection.execute(sa.text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false'))
            connection.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                       "WHERE datname = :name AND pid <> pg_backend_pid()"), {"name": self.name})

    def accept_connections(self) -> None:
        with self.admin.connect() as connection:
            connection.execute(sa.text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true'))

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        self.refuse_connections()
        try:
            yield
        finally:
            self.accept_connections()


def usage_record(i: int, *, key_id: str | None = "abcdefabcdef", model: str = "smollm2", run: str = "") -> UsageRecord:
    """The ``i``-th distinct record of a test run (``run`` keeps request ids unique across runs)."""
    return UsageRecord(
        request_id=f"req-{run}{i:06d}", model=model, key_id=key_id, pool="agg", worker_ids=[f"w{i % 3}"],
        prompt_tokens=10 + i, cached_tokens=i % 5, completion_tokens=20 + i, queue_time_s=0.001 * i,
        ttft_s=0.01 + 0.001 * i, total_s=0.5 + 0.01 * i, finish_reason="stop" if i % 7 else "length",
        error_type=None if i % 11 else "cancelled", created_at=time.time() - 60 + i * 0.001)


def count_rows(url: str, table: str = "usage_records") -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def request_ids(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.text("SELECT request_id FROM usage_records")).scalars())
    finally:
        engine.dispose()


@dataclass
class BookkeeperProcess:
    """A real ``celery worker`` consuming the bookkeeping queue, the way the Procfile runs it."""

    env: dict[str, str]
    queue: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BookkeeperProcess:
        command = [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-I", "workers.bookkeeping",
                   "-Q", self.queue, "--pool", "threads", "-c", "2", "-n", f"bookkeeper-{uuid.uuid4().hex[:6]}@%h",
                   "--without-gossip", "--without-mingle", "--loglevel", "INFO"]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(with_parent_death_signal(command), cwd=REPO, env={**os.environ, **self.env}, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        wait_until(lambda: " ready." in self.log() or self.proc.poll() is not None, 60, "the bookkeeper to start")
        if self.proc.poll() is not None:
            raise RuntimeError(f"the bookkeeper exited ({self.proc.returncode}):\n{self.log()[-3000:]}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it the way a supervisor does (SIGTERM: warm shutdown) and wait for it to exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None:
            self._log.close()
        self.proc = None
