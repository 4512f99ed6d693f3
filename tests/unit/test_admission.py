"""Admission control's bound (app.requests.admission): this frontend's own count, or the worker's reported one."""

from __future__ import annotations

import dataclasses

import pytest

from app.requests.admission import Admission
from core.errors import Overloaded
from tests.router.factories import make_worker


def test_a_worker_at_the_bound_by_this_frontends_count_is_closed() -> None:
    adm = Admission(max_waiting_per_worker=2, retry_after_s=1)
    a, b = make_worker("a", 0), make_worker("b", 1)
    adm.add("a")
    adm.add("a")
    assert adm.open_workers([a, b]) == [b]
    adm.remove("a")
    assert adm.open_workers([a, b]) == [a, b]


def test_a_worker_at_the_bound_by_its_own_report_is_closed_too() -> None:
    """Other frontends' requests waiting on the worker count: its heartbeat's ``waiting``."""
    adm = Admission(max_waiting_per_worker=2, retry_after_s=1)
    a = make_worker("a", 0)
    busy = dataclasses.replace(a, load=dataclasses.replace(a.load, waiting=2))
    with pytest.raises(Overloaded) as refused:
        adm.admit("m", [busy])
    assert refused.value.retry_after_s == 1
    assert adm.admit("m", [a]) == [a]


def test_a_bound_of_zero_admits_everything() -> None:
    adm = Admission(max_waiting_per_worker=0, retry_after_s=1)
    a = make_worker("a", 0)
    busy = dataclasses.replace(a, load=dataclasses.replace(a.load, waiting=10_000))
    assert adm.admit("m", [busy]) == [busy]
