"""A decision's candidates as columns: the per-worker facts the deciding script reads, packed once per
candidate list (router.kv_policy).

Usage::

    tables = TableBuilder(settings, inflight)
    table = tables.table(model, workers)   # the same object while ``workers`` holds the same objects

Built in two parts, because of how the lists change. The frontend's worker directory hands out a new
list of new worker objects at every registry refresh (four times a second), but a worker's
registration object is reused for as long as its registration is unchanged (router.registry). A
table's rows are in worker-id order whatever the list's, and what depends on the registrations alone
(a :class:`Roster`: ids, queues, slots, block sizes, owner tags, approximate-mode caps, the script's
keys, cold columns and slot lookup) is kept while the rows hold the same registrations, so a refresh
re-reads only the loads (active blocks and the ``time`` cost's step model, KV size, running requests
and cached blocks). At 1,000 workers a whole build took about 3 ms, spent in the decision right after
each refresh; the loads alone take about 0.4 ms.

Every table has an id of its own (this builder's random token and a counter): the deciding script
stores the packed columns under it the first time they are used, and later decisions send the id
instead of the columns (router.inflight). A table that replaces another for the same model and
candidate pool names that one, so the script drops it when it stores the new one.
"""

from __future__ import annotations

import dataclasses
import operator
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.settings import RouterSettings
from core.timing import TimingModel
from router.inflight import Candidates, InflightStore, PackedRoster
from router.prefix_index import owner_tag
from router.registry import KV_TIERS, LiveWorker, WorkerLoad, WorkerRecord, parse_tier_credit
from router.time_cost import DEFAULT_TIMING, timing_matrix

#: Parsed step models, by the text a heartbeat carries (a worker's fit changes rarely; many share one).
_COEFFICIENTS_CACHE_SIZE = 65536


@dataclass(frozen=True, slots=True)
class Roster:
    """What a candidate table takes from the registrations alone, aligned with the list. ``indexed``: the
    candidates with a slot; ``tags``: their expected owner tags; ``approx_cap`` > 0: approximate mode,
    at most that many guesses."""

    records: tuple[WorkerRecord, ...]
    ids: list[str]
    slots: np.ndarray
    sizes: np.ndarray
    block_sizes: list[int]
    chain_no: np.ndarray
    indexed: np.ndarray
    tags: np.ndarray
    approx_cap: np.ndarray
    position: dict[str, int]
    budgets: np.ndarray
    kv_blocks: np.ndarray
    packed: PackedRoster

    def same_records(self, workers: Sequence[LiveWorker]) -> bool:
        return len(workers) == len(self.records) and all(
            map(operator.is_, (w.record for w in workers), self.records))


@dataclass(frozen=True, slots=True)
class WorkerTable:
    """The per-worker columns of one candidate list, reused while the caller passes the same list (the same
    worker objects in the same order), so a decision does no per-worker Python work. Rows are in the
    table's own order, by worker id (``workers``): a registry listing comes in lease order, which every
    heartbeat changes, and the registrations part is kept only while the rows stay the same."""

    #: The candidates, one per row.
    workers: tuple[LiveWorker, ...]
    #: The list as the caller gave it.
    given: tuple[LiveWorker, ...]
    roster: Roster
    active: np.ndarray
    #: The ``time`` cost's columns (router.time_cost.COLUMNS), one row per candidate.
    timing: np.ndarray
    #: Each candidate's step model as its load carries it, and its coefficients (defaults filled in).
    step_models: list[str]
    coefficients: np.ndarray
    candidates: Candidates
    #: Each candidate's KV tier credits (host, disk, shared), or None when no candidate has tiers.
    tier_credit: np.ndarray | None = None

    def same_workers(self, workers: Sequence[LiveWorker]) -> bool:
        return len(workers) == len(self.given) and all(map(operator.is_, workers, self.given))


_worker_id = operator.attrgetter("record.worker_id")
_load = operator.attrgetter("load")
_step_model = operator.attrgetter("timing")


def publishes_kv_events(record: WorkerRecord) -> bool:
    """Whether the worker's engine reports its cache (False: approximate mode, the routers guess)."""
    return record.kv_events


def tier_credits(loads: Sequence[WorkerLoad], scale: float = 1.0) -> np.ndarray | None:
    """The candidates' KV tier credits times ``scale``, one row of host, disk and shared each
    (router.registry.parse_tier_credit), or None when no candidate publishes any or ``scale`` is 0: the
    common case costs nothing."""
    if scale <= 0 or not any(load.tier_credit for load in loads):
        return None
    return scale * np.array([[parsed.get(t, 0.0) for t in KV_TIERS] for parsed in map(_parsed_credit, loads)])


def _parsed_credit(load: WorkerLoad) -> dict[str, float]:
    return parse_tier_credit(load.tier_credit)


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is None and b is None or a is not None and b is not None and np.array_equal(a, b)


class TableBuilder:
    """Candidate tables for one routing policy: the latest per model and candidate pool (a disaggregated
    request is routed over the decode workers and over the prefill workers, and each list keeps its own)."""

    def __init__(self, settings: RouterSettings, inflight: InflightStore) -> None:
        self.settings = settings
        self.inflight = inflight
        self._token = secrets.token_hex(6)
        self._built = 0
        self._tables: dict[tuple[str, str], WorkerTable] = {}
        self._coefficients: dict[str, tuple[float, ...]] = {}

    def table(self, model: str, workers: Sequence[LiveWorker]) -> WorkerTable:
        key = (model, workers[0].record.pool if workers else "")
        last = self._tables.get(key)
        if last is not None and last.same_workers(workers):
            return last
        ordered = sorted(workers, key=_worker_id)
        roster = last.roster if last is not None and last.roster.same_records(ordered) else self._roster(model, ordered)
        loads = list(map(_load, ordered))
        n = len(loads)

        def column(name: str) -> np.ndarray:
            return np.fromiter(map(operator.attrgetter(name), loads), dtype=np.int64, count=n)

        active, total = column("active_blocks"), column("total_blocks")
        step_models = list(map(_step_model, loads))
        if last is not None and last.roster is roster and last.step_models == step_models:
            coefficients = last.coefficients  # workers refit their step model seldom
        else:
            coefficients = np.array(list(map(self._coefficients_of, step_models)), dtype=np.float64).reshape(
                n, len(DEFAULT_TIMING))
        timing = timing_matrix(coefficients, roster.budgets,
                               np.where(total != 0, total, roster.kv_blocks),  # a load that does not say: its registration's
                               column("running"), roster.sizes, column("cached_blocks"))
        credits = tier_credits(loads, self.settings.tier_credit_scale)
        if last is not None and last.roster is roster and np.array_equal(last.active, active) \
                and np.array_equal(last.timing, timing) and _same(last.tier_credit, credits):
            # The same columns (an idle fleet between heartbeats that changed nothing): the same
            # table, already stored, over the new list's objects.
            table = dataclasses.replace(last, workers=tuple(ordered), given=tuple(workers))
            self._tables[key] = table
            return table
        self._built += 1
        table_id = f"{self._token}-{self._built}"
        table = WorkerTable(
            workers=tuple(ordered), given=tuple(workers), roster=roster, active=active, timing=timing,
            step_models=step_models, coefficients=coefficients, tier_credit=credits,
            candidates=self.inflight.candidates(model, roster.packed, active, timing, table_id,
                                                replaces=last.candidates.table_id if last is not None else None,
                                                tier_credit=credits))
        self._tables[key] = table
        return table

    def _coefficients_of(self, text: str) -> tuple[float, ...]:
        found = self._coefficients.get(text)
        if found is None:
            model = TimingModel.decode_text(text)
            found = model.coefficients if model is not None else DEFAULT_TIMING
            if len(self._coefficients) >= _COEFFICIENTS_CACHE_SIZE:
                self._coefficients.clear()
            self._coefficients[text] = found
        return found

    def _approximate(self, record: WorkerRecord) -> bool:
        return self.settings.approximate or not publishes_kv_events(record)

    def _roster(self, model: str, workers: Sequence[LiveWorker]) -> Roster:
        n = len(workers)
        records = tuple(w.record for w in workers)
        slots = np.fromiter((r.slot for r in records), dtype=np.int64, count=n)
        sizes = np.fromiter((r.block_size for r in records), dtype=np.int64, count=n)
        block_sizes = sorted(set(sizes.tolist()))
        indexed = np.flatnonzero(slots >= 0)
        cap_limit = self.settings.approx_max_blocks
        caps = np.array([min(cap_limit, r.kv_blocks or cap_limit) if self._approximate(r) else 0 for r in records],
                        dtype=np.int64)
        caps[slots < 0] = 0
        ids = [r.worker_id for r in records]
        tags = np.fromiter((owner_tag(wid) for wid in ids), dtype=np.int64, count=n)
        chain_no = np.searchsorted(block_sizes, sizes)
        return Roster(
            records=records, ids=ids, slots=slots, sizes=sizes, block_sizes=block_sizes, chain_no=chain_no,
            indexed=indexed, tags=tags[indexed], approx_cap=caps,
            position={wid: i for i, wid in reversed(list(enumerate(ids)))},
            budgets=np.fromiter((r.max_batched_tokens for r in records), dtype=np.int64, count=n),
            kv_blocks=np.fromiter((r.kv_blocks for r in records), dtype=np.int64, count=n),
            packed=self.inflight.roster(model, ids, [r.queue for r in records], slots, sizes / sizes.min(), chain_no,
                                        caps, tags))
