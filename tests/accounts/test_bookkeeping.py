"""The bookkeeper as deployed: a real ``celery worker`` subprocess consuming the bookkeeping queue of the
session's private Redis, fed by a real Accounts service, writing to SQLite and PostgreSQL; and, on
PostgreSQL, a database outage in the middle of traffic (with a bookkeeper restart during it) that
loses no usage row and counts none twice."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
import sqlalchemy as sa
from kombu.transport.redis import Channel

from app.accounts.service import Accounts
from bench.devstack import wait_until
from core.db.migrate import upgrade
from core.keys import Keys
from tests.accounts.conftest import BACKENDS, make_settings
from tests.accounts.helpers import BookkeeperProcess, ScratchPostgres, count_rows, request_ids, usage_record


def bookkeeper(tmp_path: Path, redis_server, namespace: str, url: str, tokenizer_dir: Path) -> BookkeeperProcess:  # noqa: ANN001
    env = {"SLUICE_REDIS_URL": redis_server.url, "SLUICE_NAMESPACE": namespace, "SLUICE_DATABASE_URL": url,
           "SLUICE_ACCOUNTS__USAGE_RETRY_BACKOFF_MAX_S": "1", "SLUICE_ENGINE": "mocker",
           # Until workers.signals leaves bookkeepers alone, the worker also starts an engine: give it a tokenizer.
           "SLUICE_MODEL_PATH": str(tokenizer_dir), "PYTHONUNBUFFERED": "1"}
    return BookkeeperProcess(env=env, queue=Keys(namespace).bookkeeping_queue, log_path=tmp_path / f"bookkeeper-{uuid.uuid4().hex[:6]}.log")


def held_by_bookkeepers(client: redis.Redis, keys: Keys) -> int:
    """Messages taken from the bookkeeping queue and not acknowledged yet. The bookkeeper keeps kombu's
    ack emulation: each delivered message waits in the ``unacked`` hash (``[message, exchange, routing
    key]``; under the namespace's broker prefix) until the row insert has committed and the task acks it."""
    unacked = keys.broker_prefix + Channel.unacked_key
    return sum(1 for raw in client.hvals(unacked) if json.loads(raw)[2] == keys.bookkeeping_queue)


def queued(client: redis.Redis, keys: Keys) -> int:
    """Messages waiting in the bookkeeping queue."""
    return client.llen(keys.broker_queue_list(keys.bookkeeping_queue))


async def settled(client: redis.Redis, keys: Keys, timeout_s: float = 30) -> None:
    """Wait (without blocking the event loop) until every message of the bookkeeping queue was taken and
    acknowledged: from then on no row can land, so counts are final."""
    await asyncio.to_thread(
        wait_until, lambda: queued(client, keys) == 0 and held_by_bookkeepers(client, keys) == 0, timeout_s,
        "the bookkeepers to take and acknowledge every message")


@pytest.fixture
def stop_later() -> Iterator[list[BookkeeperProcess]]:
    started: list[BookkeeperProcess] = []
    yield started
    for process in started:
        process.stop()


async def ship(accounts: Accounts, records: list) -> None:  # noqa: ANN001
    for record in records:
        accounts.finish(None, record)
    await accounts.usage.flush()


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
async def test_the_bookkeeper_writes_every_row(tmp_path: Path, redis_server, namespace: str,  # noqa: ANN001
                                               aredis: aioredis.Redis, redis_client: redis.Redis,
                                               clean_queue: str, db_url: str, tokenizer_dir: Path,
                                               stop_later: list[BookkeeperProcess]) -> None:
    upgrade(db_url)
    stop_later.append(bookkeeper(tmp_path, redis_server, namespace, db_url, tokenizer_dir).start())
    accounts = Accounts(make_settings(db_url, redis_server.url, namespace, usage_batch_max=50), aredis,
                        Keys(namespace))
    records = [usage_record(i, key_id="0123456789ab" if i % 2 else None) for i in range(120)]
    await ship(accounts, records)
    await asyncio.to_thread(wait_until, lambda: count_rows(db_url) == 120, 60, "120 usage rows")
    await ship(accounts, records[:50])  # delivered again: counted once
    await settled(redis_client, Keys(namespace))
    assert count_rows(db_url) == 120
    engine = sa.create_engine(db_url)
    with engine.connect() as connection:
        row = connection.execute(sa.text("SELECT * FROM usage_records WHERE request_id = :r"),
                                 {"r": records[77].request_id}).mappings().one()
    engine.dispose()
    r = records[77]
    assert (row["key_id"], row["model"], row["pool"], row["prompt_tokens"], row["cached_tokens"],
            row["completion_tokens"], row["finish_reason"], row["error_type"]) == (
        r.key_id, r.model, r.pool, r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.finish_reason,
        r.error_type)
    assert row["ttft_s"] == pytest.approx(r.ttft_s) and row["total_s"] == pytest.approx(r.total_s)
    assert row["queue_time_s"] == pytest.approx(r.queue_time_s)
    assert row["worker_ids"] in (r.worker_ids, f'["{r.worker_ids[0]}"]')


def count_rows_or_none(url: str) -> int | None:
    try:
        return count_rows(url)
    except sa.exc.OperationalError:
        return None


@pytest.mark.postgres
async def test_a_database_outage_during_traffic_loses_no_usage_row(
        tmp_path: Path, redis_server, namespace: str, aredis: aioredis.Redis,  # noqa: ANN001
        redis_client: redis.Redis, clean_queue: str, pg_db: ScratchPostgres, tokenizer_dir: Path,
        stop_later: list[BookkeeperProcess]) -> None:
    """Deterministic outage: the database refuses connections (ALLOW_CONNECTIONS false, sessions cut)
    while frontends keep finishing requests; the bookkeeper retries with backoff, is restarted
    mid-outage (warm shutdown puts its held messages back on the queue), and once the database
    accepts connections again every row is there exactly once."""
    upgrade(pg_db.url)
    first = bookkeeper(tmp_path, redis_server, namespace, pg_db.url, tokenizer_dir).start()
    stop_later.append(first)
    accounts = Accounts(make_settings(pg_db.url, redis_server.url, namespace, usage_batch_max=20), aredis,
                        Keys(namespace))
    records = [usage_record(i, run="outage") for i in range(201)]
    await ship(accounts, records[:1])
    await asyncio.to_thread(wait_until, lambda: count_rows(pg_db.url) == 1, 60, "the first row")

    pg_db.refuse_connections()
    try:
        for start in range(1, 201, 40):  # traffic keeps coming while the database is down
            await ship(accounts, records[start:start + 40])
            await asyncio.sleep(0.1)
        await asyncio.to_thread(wait_until, lambda: first.log().count("Retry in") >= 10, 60,
                                "the bookkeeper to hit the outage and retry")
        first.stop()  # a restart (deploy, crash-loop) in the middle of the outage
        held = queued(redis_client, Keys(namespace))
        assert held > 0, "the stopped bookkeeper's messages must be back on the queue"
        second = bookkeeper(tmp_path, redis_server, namespace, pg_db.url, tokenizer_dir).start()
        stop_later.append(second)
        await asyncio.to_thread(wait_until, lambda: "Retry in" in second.log(), 60, "the new bookkeeper to retry too")
        # A retry publishes its copy and then acks the original, so for a moment between that ack and the
        # worker taking the copy back (to hold it through its countdown) nothing is unacked: wait for it.
        await asyncio.to_thread(wait_until, lambda: held_by_bookkeepers(redis_client, Keys(namespace)) > 0, 30,
                                "the retrying bookkeeper to hold its retry copies unacked")
        assert count_rows_or_none(pg_db.url) is None
    finally:
        pg_db.accept_connections()

    await asyncio.to_thread(wait_until, lambda: count_rows(pg_db.url) == 201, 90, "all 201 rows after the outage")
    await settled(redis_client, Keys(namespace))  # a duplicate still in flight would land before this returns
    ids = request_ids(pg_db.url)
    assert len(ids) == 201 and set(ids) == {r.request_id for r in records}
