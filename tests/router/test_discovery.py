"""Prometheus discovery (router.discovery): the target groups Prometheus reads, built from the registries."""

from __future__ import annotations

import dataclasses

from router.discovery import prometheus_targets, target_group
from router.frontends import FrontendRecord, LiveFrontend
from tests.router.factories import make_worker


def frontend(fid: str, metrics_url: str) -> LiveFrontend:
    return LiveFrontend(FrontendRecord(frontend_id=fid, url=metrics_url.removesuffix("/metrics"), metrics_url=metrics_url,
                                       router_mode="kv", started_at=1.0), lease_expires_at=2.0)


def worker(wid: str, metrics_url: str, **record: object):  # noqa: ANN201
    w = make_worker(wid, 0, **record)
    return dataclasses.replace(w, record=dataclasses.replace(w.record, metrics_url=metrics_url))


def test_target_group_splits_the_url_into_the_target_and_its_path() -> None:
    assert target_group("http://10.0.0.5:9400/metrics", {"a": "b"}) == {
        "targets": ["10.0.0.5:9400"], "labels": {"__metrics_path__": "/metrics", "a": "b"}}
    assert target_group("http://[::1]:9400/other", {}) == {
        "targets": ["[::1]:9400"], "labels": {"__metrics_path__": "/other"}}
    assert target_group("https://host:443", {})["labels"] == {"__metrics_path__": "/metrics", "__scheme__": "https"}
    assert target_group("", {}) is None


def test_every_live_frontend_then_every_worker_with_an_endpoint_each_with_its_labels() -> None:
    groups = prometheus_targets(
        "ns", [worker("w2", "http://127.0.0.1:2/metrics", model="m2"), worker("w1", "http://127.0.0.1:1/metrics"),
               worker("w3", "")],
        [frontend("f1", "http://127.0.0.1:8000/metrics")])
    assert groups == [
        {"targets": ["127.0.0.1:8000"], "labels": {"__metrics_path__": "/metrics", "sluice_namespace": "ns",
                                                   "component": "frontend", "frontend": "f1"}},
        {"targets": ["127.0.0.1:1"], "labels": {"__metrics_path__": "/metrics", "sluice_namespace": "ns",
                                                "component": "worker", "worker": "w1", "model": "m", "pool": "agg",
                                                "engine": "mocker"}},
        {"targets": ["127.0.0.1:2"], "labels": {"__metrics_path__": "/metrics", "sluice_namespace": "ns",
                                                "component": "worker", "worker": "w2", "model": "m2", "pool": "agg",
                                                "engine": "mocker"}},
    ]


def test_nothing_live_is_an_empty_list() -> None:
    assert prometheus_targets("ns", [], []) == []


def test_the_acting_planner_is_listed_from_its_lease() -> None:
    from router.discovery import planner_metrics_url

    lease = '{"token": "t", "metrics_url": "http://10.0.0.9:9464/metrics", "started_at": 1.0}'
    url = planner_metrics_url(lease.encode())
    assert url == "http://10.0.0.9:9464/metrics"
    assert prometheus_targets("ns", [], [], url) == [
        {"targets": ["10.0.0.9:9464"], "labels": {"__metrics_path__": "/metrics", "sluice_namespace": "ns",
                                                  "component": "planner"}}]
    # No planner, one without metrics, or a value of another release: nothing listed.
    assert [planner_metrics_url(v) for v in (None, '{"metrics_url": ""}', "not json", "[1]")] == ["", "", "", ""]
