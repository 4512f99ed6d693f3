"""What the planner reads (planner.observe): the frontends' counters differenced per interval, and each
pool's state from the workers' leases and the queues."""

from __future__ import annotations

import pytest

from core.pools import Pool
from planner.connectors.base import PoolRef
from planner.observe import TrafficMeter, pool_states
from router.cluster import ClusterSnapshot
from router.frontends import FrontendRecord, LiveFrontend, LoadCounters, decode_context_tokens
from router.registry import LiveWorker, WorkerLoad, WorkerRecord


def frontend(fid: str, started_at: float, **counters: float) -> LiveFrontend:
    load = LoadCounters(**counters)  # type: ignore[arg-type]
    return LiveFrontend(FrontendRecord(frontend_id=fid, url="u", metrics_url="m", router_mode="kv",
                                       started_at=started_at, load={"m": load.as_list()}), 0.0)


def test_counters_round_trip_and_an_older_writers_short_list_reads() -> None:
    c = LoadCounters(arrived=3, finished=2, input_tokens=10, output_tokens=4, ttft_s=0.5, ttft_n=2, decode_s=1.0, gaps=2,
                     context_tokens=24.0)
    assert LoadCounters.from_list(c.as_list()) == c
    assert LoadCounters.from_list([5, 4]) == LoadCounters(arrived=5, finished=4)


def test_the_first_reading_is_a_baseline_and_the_next_ones_are_differences() -> None:
    meter = TrafficMeter()
    assert meter.read([frontend("a", 0.0, arrived=100, finished=90)], now=10.0) is None
    traffic = meter.read([frontend("a", 0.0, arrived=120, finished=110, input_tokens=2000, output_tokens=400,
                                   ttft_s=4.0, ttft_n=20, decode_s=3.0, gaps=300)], now=20.0)
    assert traffic is not None
    s = traffic["m"]
    assert (s.arrived, s.finished, s.rate) == (20, 20, 2.0)
    # The baseline had no tokens: all of them came in this interval.
    assert (s.isl, s.osl, s.ttft_s, s.itl_s) == (100.0, 20.0, 0.2, 0.01)
    assert s.context is None  # this frontend does not count the decode's context


def test_the_decodes_context_is_weighted_by_the_tokens_generated() -> None:
    # A mix: 1 request of 2,000 prompt tokens and 32 generated, 9 of 512 and 128.
    long, chat = decode_context_tokens(2000, 32), decode_context_tokens(512, 128)
    assert (long, chat) == (32 * 2016, 128 * 576)
    meter = TrafficMeter()
    meter.read([frontend("a", 0.0)], now=0.0)
    traffic = meter.read([frontend("a", 0.0, arrived=10, finished=10, input_tokens=2000 + 9 * 512,
                                   output_tokens=32 + 9 * 128, context_tokens=long + 9 * chat)], now=10.0)
    assert traffic is not None
    s = traffic["m"]
    assert s.context == pytest.approx((32 * 2016 + 9 * 128 * 576) / (32 + 9 * 128))
    # Less than the mean lengths' prompt and half answer: the long prompts generated few of the tokens.
    assert s.isl is not None and s.osl is not None and s.context < s.isl + s.osl / 2 - 50


def test_a_peek_reads_the_interval_so_far_and_keeps_the_baseline() -> None:
    meter = TrafficMeter()
    assert meter.peek([frontend("f1", 0.0, arrived=10)], 0.0) is None  # no baseline yet
    meter.read([frontend("f1", 0.0, arrived=10)], 0.0)
    so_far = meter.peek([frontend("f1", 0.0, arrived=30)], 10.0)
    assert so_far is not None and (so_far["m"].arrived, so_far["m"].duration_s) == (20, 10.0)
    whole = meter.read([frontend("f1", 0.0, arrived=50)], 20.0)
    assert whole is not None and (whole["m"].arrived, whole["m"].duration_s) == (40, 20.0)


def test_a_new_frontend_counts_whole_a_gone_one_drops_and_an_unseen_old_one_waits_for_its_baseline() -> None:
    meter = TrafficMeter()
    meter.read([frontend("a", 0.0, arrived=10)], now=10.0)
    traffic = meter.read([frontend("b", 15.0, arrived=4), frontend("c", 1.0, arrived=500)], now=20.0)
    assert traffic is not None and traffic["m"].arrived == 4  # a went, c was there all along but unseen
    traffic = meter.read([frontend("b", 15.0, arrived=6), frontend("c", 1.0, arrived=503)], now=30.0)
    assert traffic is not None and traffic["m"].arrived == 5


def test_an_interval_without_finished_requests_has_no_means() -> None:
    meter = TrafficMeter()
    meter.read([frontend("a", 0.0)], now=0.0)
    traffic = meter.read([frontend("a", 0.0, arrived=3)], now=2.0)
    assert traffic is not None
    s = traffic["m"]
    assert s.rate == 1.5 and s.isl is None and s.ttft_s is None and s.itl_s is None


def worker(wid: str, pool: Pool, *, running: int = 0, waiting: int = 0, active: int = 0, draining: bool = False,
           timing: str = "") -> LiveWorker:
    record = WorkerRecord(worker_id=wid, model="m", model_path="/m", pool=pool, queue=f"q.{wid}",
                          pool_queue=f"pool.{pool.value}", engine="mocker", block_size=16, kv_blocks=100,
                          max_num_seqs=8, context_length=4096, started_at=0.0)
    load = WorkerLoad(running=running, waiting=waiting, active_blocks=active, total_blocks=100, draining=draining,
                      timing=timing)
    return LiveWorker(record, load, 0.0)


def test_pool_states_from_the_leases_and_the_queues() -> None:
    snap = ClusterSnapshot("ns", 0.0, [
        worker("a1", Pool.AGG, running=3, waiting=1, active=50, timing="1,2,3,4,5,6"),
        worker("a2", Pool.AGG, running=1, active=10),
        worker("a3", Pool.AGG, running=9, active=90, draining=True),
        worker("d1", Pool.DECODE, running=2, active=20),
    ], [], {"q.a1": 2, "q.a3": 7, "pool.agg": 99}, {})
    agg, prefill = PoolRef("m", Pool.AGG), PoolRef("m", Pool.PREFILL)
    states = pool_states(snap, {agg: 5, prefill: 4})
    assert set(states) == {agg, prefill}  # the decode pool is not asked for
    s = states[agg]
    # The draining worker counts apart, its load and queue with it; the pool queue's depth is read apart.
    assert (s.workers, s.draining, s.running, s.waiting, s.queued) == (2, 1, 4, 1, 5 + 2)
    assert s.kv_usage == pytest.approx(0.3) and s.pending == 8 and len(s.timings) == 1
    assert (states[prefill].workers, states[prefill].queued) == (0, 4)
