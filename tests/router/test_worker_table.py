"""Candidate tables (router.worker_table): built in part from the registrations, kept across refreshes
that change only the loads, equal to a table built from nothing. No Redis: packing only."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import redis.asyncio as aioredis

from core.keys import Keys
from core.settings import RouterSettings
from core.timing import TimingModel
from router.inflight import InflightStore
from router.registry import LiveWorker
from router.time_cost import timing_columns
from router.worker_table import TableBuilder, WorkerTable
from tests.router.factories import make_worker


def builder(**settings) -> TableBuilder:  # type: ignore[no-untyped-def]
    return TableBuilder(RouterSettings(**settings), InflightStore(aioredis.Redis(), Keys("t"), 600.0))


def refreshed(workers: list[LiveWorker], rng: random.Random) -> list[LiveWorker]:
    """A registry refresh: new worker objects with new loads, the same registration objects, lease order."""
    out = [dataclasses.replace(w, load=dataclasses.replace(
        w.load, active_blocks=rng.randrange(50), running=rng.randrange(8), total_blocks=rng.choice([0, 500]),
        cached_blocks=rng.randrange(500),
        timing=rng.choice(["", "bad", TimingModel((10.0, 0.01, 1e-7), (5.0, 40.0, -20.0)).encode()])))
        for w in workers]
    rng.shuffle(out)
    return out


def columns(table: WorkerTable) -> tuple:
    """What a table's decisions read, apart from its id."""
    c = table.candidates
    return ([w.record.worker_id for w in table.workers], table.active.tolist(), table.timing.tolist(),
            c.table, c.packed_shape, c.n_keys, table.roster.ids, table.roster.slots.tolist(), table.roster.tags.tolist(),
            table.roster.position)


def test_the_same_list_gives_the_same_table() -> None:
    tables = builder()
    workers = [make_worker(f"w{i}", i) for i in range(5)]
    assert tables.table("m", workers) is tables.table("m", list(workers))


def test_a_refresh_that_changes_no_column_keeps_the_table() -> None:
    """An idle fleet's refresh (new objects, the same loads) keeps the stored table, over the new objects:
    nothing to store again."""
    tables = builder()
    workers = [make_worker(f"w{i}", i, active_blocks=i) for i in range(5)]
    first = tables.table("m", workers)
    again = [dataclasses.replace(w, load=dataclasses.replace(w.load)) for w in reversed(workers)]
    table = tables.table("m", again)
    assert table.candidates is first.candidates and table.given == tuple(again)
    assert [w.record.worker_id for w in table.workers] == [f"w{i}" for i in range(5)]
    assert all(a is b for a, b in zip(table.workers, reversed(again), strict=True))
    busier = [dataclasses.replace(w, load=dataclasses.replace(w.load, active_blocks=9)) if w.record.worker_id == "w2"
              else w for w in again]
    assert tables.table("m", busier).candidates.table_id != first.candidates.table_id


def test_a_refresh_keeps_the_registrations_part_and_equals_a_fresh_build() -> None:
    rng = random.Random(3)
    tables = builder()
    workers = [make_worker(f"w{i:02d}", i, block_size=rng.choice([4, 8])) for i in range(40)]
    first = tables.table("m", workers)
    for _ in range(5):
        workers = refreshed(workers, rng)
        table = tables.table("m", workers)
        assert table.roster is first.roster  # only the loads were read again
        assert columns(table) == columns(builder().table("m", workers))


def test_rows_are_in_worker_id_order_whatever_the_listing_order() -> None:
    workers = [make_worker(f"w{i}", i) for i in (3, 1, 2, 0)]
    table = builder().table("m", workers)
    assert [w.record.worker_id for w in table.workers] == ["w0", "w1", "w2", "w3"]
    assert table.given == tuple(workers)
    assert table.roster.position == {"w0": 0, "w1": 1, "w2": 2, "w3": 3}


def test_a_changed_registration_rebuilds_the_registrations_part() -> None:
    tables = builder()
    workers = [make_worker(f"w{i}", i) for i in range(4)]
    first = tables.table("m", workers)
    moved = [*workers[:3], make_worker("w3", 9)]  # registered again, under another slot
    table = tables.table("m", moved)
    assert table.roster is not first.roster
    assert table.roster.slots.tolist() == [0, 1, 2, 9]
    assert columns(table) == columns(builder().table("m", moved))


def test_each_table_has_its_own_id_and_names_the_one_it_replaces() -> None:
    tables = builder()
    rng = random.Random(1)
    workers = [make_worker(f"w{i}", i) for i in range(3)]
    first = tables.table("m", workers)
    second = tables.table("m", refreshed(workers, rng))
    assert first.candidates.replaces is None
    assert second.candidates.table_id != first.candidates.table_id
    assert second.candidates.replaces == first.candidates.table_id
    other = builder().table("m", workers)
    assert other.candidates.table_id not in (first.candidates.table_id, second.candidates.table_id)


def test_pools_keep_a_table_each() -> None:
    tables = builder()
    agg = [make_worker(f"w{i}", i) for i in range(3)]
    prefill = [dataclasses.replace(w, record=dataclasses.replace(w.record, worker_id=f"p{i}", pool="prefill", slot=10 + i))
               for i, w in enumerate(agg)]
    a, p = tables.table("m", agg), tables.table("m", prefill)
    assert tables.table("m", agg) is a and tables.table("m", prefill) is p
    assert p.candidates.replaces is None


def test_timing_columns_equal_the_reference_packing() -> None:
    """The table's ``time`` columns come from cached step models and arrays; router.time_cost's
    ``timing_columns`` from each worker's own values: the same numbers, to the last bit."""
    rng = random.Random(5)
    workers = refreshed([make_worker(f"w{i}", i, kv_blocks=rng.choice([0, 300]), max_batched_tokens=rng.choice([0, 64]))
                         for i in range(30)], rng)
    table = builder().table("m", workers)
    rows = table.workers
    models = [TimingModel.decode_text(w.load.timing) for w in rows]
    expected = timing_columns([m.coefficients if m is not None else None for m in models],
                              [w.record.max_batched_tokens for w in rows],
                              [w.load.total_blocks or w.record.kv_blocks for w in rows],
                              [w.load.running for w in rows], [w.record.block_size for w in rows],
                              [w.load.cached_blocks for w in rows])
    assert np.array_equal(table.timing, expected)
