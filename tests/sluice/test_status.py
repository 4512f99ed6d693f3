"""``sluice status`` (sluice/status.py): the machine-readable form and the screen, from a snapshot."""

from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from router.cluster import ClusterSnapshot
from router.frontends import FrontendRecord, LiveFrontend
from router.registry import LiveWorker, WorkerLoad
from sluice import cli
from sluice.status import fmt_kv, fmt_seconds, render, status_json
from tests.router.factories import make_record

NOW = 1_000_000.0


def worker(wid: str, pool: str = "agg", model: str = "m", **load: object) -> LiveWorker:
    record = dataclasses.replace(make_record(wid, 0, model=model), pool=pool, pool_queue=f"q.{model}.{pool}",
                                 started_at=NOW - 120, metrics_url=f"http://127.0.0.1:91{len(wid)}/metrics")
    return LiveWorker(record=record, load=WorkerLoad(**{"total_blocks": 1000, "updated_at": NOW - 0.5, **load}),
                      lease_expires_at=NOW + 2.5)


def snapshot() -> ClusterSnapshot:
    return ClusterSnapshot(
        namespace="prod", taken_at=NOW,
        workers=[worker("w1", running=3, waiting=1, active_blocks=250, cached_blocks=300, tokens_per_s=41.26),
                 worker("w2", draining=True), worker("p1", pool="prefill")],
        frontends=[LiveFrontend(FrontendRecord(frontend_id="f1", url="http://fe:8000", metrics_url="http://fe:8000/metrics",
                                               router_mode="kv", started_at=NOW - 7200, in_flight=4,
                                               updated_at=NOW - 0.2), lease_expires_at=NOW + 4.8)],
        queue_messages={"q.m.agg": 5, "q.w1": 2, "q.w2": 0, "q.m.prefill": 1, "q.p1": 0},
        index_blocks={"w1": 120, "w2": 7, "p1": 30})


def test_the_json_form_lists_models_pools_workers_and_frontends() -> None:
    status = status_json(snapshot())
    assert status["namespace"] == "prod" and status["router_modes"] == ["kv"] and status["in_flight"] == 4
    assert status["models"] == [{"model": "m", "workers": 3, "running": 3, "waiting": 1, "queued": 8,
                                 "index_blocks": 157,
                                 "pools": {"agg": {"workers": 2, "queue_messages": 5},
                                           "prefill": {"workers": 1, "queue_messages": 1}}}]
    w1 = status["workers"][0]
    assert w1 == {
        "worker_id": "w1", "model": "m", "pool": "agg", "engine": "mocker", "state": "live",
        "metrics_url": "http://127.0.0.1:912/metrics", "queue": "q.w1", "slot": 0, "running": 3, "waiting": 1,
        "kv_blocks_used": 250, "kv_blocks_cached": 300, "kv_blocks_total": 1000, "kv_usage": 0.25, "index_blocks": 120, "queue_messages": 2,
        "tokens_per_s": 41.26, "kv_resyncs": 0, "heartbeat_age_s": 0.5, "lease_expires_in_s": 2.5, "uptime_s": 120.0,
        "kv_tiers": {}, "kv_tier_credit": {}}
    assert [w["state"] for w in status["workers"]] == ["live", "draining", "live"]
    assert status["frontends"] == [{"frontend_id": "f1", "url": "http://fe:8000", "metrics_url": "http://fe:8000/metrics",
                                    "router_mode": "kv", "in_flight": 4, "heartbeat_age_s": 0.2,
                                    "lease_expires_in_s": 4.8, "uptime_s": 7200.0}]


def test_an_empty_namespace() -> None:
    status = status_json(ClusterSnapshot("ns", NOW, [], [], {}, {}))
    assert status == {"namespace": "ns", "taken_at": NOW, "router_modes": [], "in_flight": 0, "models": [],
                      "workers": [], "frontends": [], "planner": None}
    text = screen(status, 100)
    assert "No live worker." in text and "No live frontend." in text


def screen(status: dict, width: int, wide: bool = False) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(render(status, wide=wide))
    return console.export_text()


def test_the_screen_fits_an_80_column_terminal_and_says_what_matters() -> None:
    text = screen(status_json(snapshot()), 80)
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "Sluice prod at " in text and "frontends 1 | workers 3 | in flight 4 | routing kv" in text
    w1 = next(line for line in text.splitlines() if line.lstrip().startswith("w1"))
    assert w1.split() == ["w1", "agg", "live", "3", "1", "250/300", "30%", "120", "2", "41.3", "0.5s"]
    assert "draining" in text and "agg:2 prefill:1" in text
    assert "http://fe:8000" in text and "2.0h" in text
    assert "127.0.0.1:912" not in text  # the metrics URLs need a wide terminal


def test_a_wide_screen_shows_the_metrics_urls_and_several_models_a_model_column() -> None:
    snap = snapshot()
    snap = dataclasses.replace(snap, workers=[*snap.workers, worker("x1", model="other")])
    text = screen(status_json(snap), 160, wide=True)
    assert "http://127.0.0.1:912/metrics" in text
    x1 = next(line for line in text.splitlines() if line.lstrip().startswith("x1"))
    assert x1.split()[:3] == ["x1", "other", "agg"]


def test_an_idle_worker_shows_its_cache_next_to_the_index() -> None:
    """An idle worker's requests hold no block (0 used), while its cache still holds what the index
    lists for it: the screen shows both (once it showed only the first, ``0 0%`` beside ``index 285``)."""
    snap = dataclasses.replace(snapshot(), workers=[worker("v1", active_blocks=0, cached_blocks=285)],
                               index_blocks={"v1": 285})
    status = status_json(snap)
    (v1,) = status["workers"]
    assert (v1["kv_blocks_used"], v1["kv_blocks_cached"], v1["index_blocks"]) == (0, 285, 285)
    text = screen(status, 80)
    line = next(line for line in text.splitlines() if line.lstrip().startswith("v1"))
    assert line.split()[5:8] == ["0/285", "28%", "285"] and "KV used/cached" in text


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (0.25, "0.2s"), (59.9, "59.9s"), (90, "2m"), (7200, "2.0h")])
def test_fmt_seconds(seconds: float | None, text: str) -> None:
    assert fmt_seconds(seconds) == text


def test_fmt_kv() -> None:
    assert fmt_kv(250, 300, 1000) == "250/300 30%"
    assert fmt_kv(0, 285, 1000) == "0/285 28%"
    assert fmt_kv(3, 5, 0) == "3/5"


def test_watch_takes_an_optional_positive_interval() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["status"]).watch is None
    assert parser.parse_args(["status", "--watch"]).watch == 2.0
    assert parser.parse_args(["status", "--watch", "0.5", "--json"]).watch == 0.5
    with pytest.raises(SystemExit):
        parser.parse_args(["status", "--watch", "0"])
    assert parser.parse_args(["prometheus-targets", "--watch"]).watch == 15.0


def test_a_worker_with_kv_tiers_shows_what_each_holds_and_its_credits() -> None:
    snap = dataclasses.replace(snapshot(), workers=[
        worker("t1", tier_blocks="host=120,disk=3000", tier_credit="host=0.700,disk=0.100"), worker("t2")])
    status = status_json(snap)
    t1, t2 = status["workers"]
    assert t1["kv_tiers"] == {"host": 120, "disk": 3000} and t1["kv_tier_credit"] == {"host": 0.7, "disk": 0.1}
    assert t2["kv_tiers"] == {} and t2["kv_tier_credit"] == {}
    text = screen(status, 140)
    assert "KV tiers" in text and "host 120 · disk 3000" in text
    assert "KV tiers" not in screen(status_json(snapshot()), 140)  # no column where no worker has tiers


def test_the_screen_shows_the_planners_last_decision_and_why() -> None:
    import msgspec

    from planner.decision import Decision, PoolDecision

    decision = Decision(at=NOW - 12, kind="interval", mode="sla", connector="local", tick=7, models=[], pools=[
        PoolDecision(model="m", pool="agg", live=2, draining=0, requested=2, wanted=3, target=3, action="up",
                     reason="up: predicted 4.2 req/s", kv_usage=0.71, pending=3)])
    planner = {"acting": True, "decisions": [msgspec.to_builtins(decision)], "targets": {}}
    status = status_json(snapshot(), planner)
    assert status["planner"]["decisions"][0]["pools"][0]["target"] == 3
    text = screen(status, 160)
    assert "Planner: acting | mode sla | connector local | last decision (interval, interval 7) 12s ago" in text
    assert "m/agg" in text and "predicted 4.2 req/s" in text
    assert "Planner" not in screen(status_json(snapshot(), {"acting": False, "decisions": [], "targets": {}}), 160)
