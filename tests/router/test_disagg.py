"""The conditional-disaggregation rule (router.disagg.plan_prefill), case by case."""

from __future__ import annotations

import pytest

from router.disagg import DisaggThresholds, PrefillPlace, plan_prefill

T = DisaggThresholds(min_tokens=2048, min_ratio=0.7, max_prefill_queue=4)


@pytest.mark.parametrize(
    ("prompt", "overlap", "workers", "queue", "place", "reason"),
    [
        (4096, 0, 1, 0, PrefillPlace.REMOTE, "long uncached prompt"),
        (2048, 0, 1, 0, PrefillPlace.REMOTE, "long uncached prompt"),  # the bound is inclusive
        (2047, 0, 1, 0, PrefillPlace.LOCAL, "short uncached prompt"),
        (100, 0, 1, 0, PrefillPlace.LOCAL, "short uncached prompt"),
        (8192, 6145, 1, 0, PrefillPlace.LOCAL, "short uncached prompt"),  # 2047 new
        (8192, 4096, 1, 0, PrefillPlace.LOCAL, "mostly cached on the decode worker"),  # 4096 new: 0.5
        (8192, 6144, 1, 0, PrefillPlace.LOCAL, "mostly cached on the decode worker"),  # 2048 new: 0.25
        (10000, 3000, 1, 0, PrefillPlace.REMOTE, "long uncached prompt"),  # 7000 new: exactly 0.7
        (4096, 0, 0, 0, PrefillPlace.LOCAL, "no prefill worker"),
        (4096, 0, 2, 4, PrefillPlace.LOCAL, "prefill queue full"),
        (4096, 0, 2, 3, PrefillPlace.REMOTE, "long uncached prompt"),
    ],
)
def test_plan(prompt: int, overlap: int, workers: int, queue: int, place: PrefillPlace, reason: str) -> None:
    plan = plan_prefill(prompt, overlap, prefill_workers=workers, prefill_queue=queue, thresholds=T)
    assert (plan.place, plan.reason, plan.uncached_tokens) == (place, reason, prompt - overlap)
    assert plan.remote is (place is PrefillPlace.REMOTE)


def test_zero_thresholds_send_every_prompt_remote() -> None:
    always = DisaggThresholds(min_tokens=0, min_ratio=0.0, max_prefill_queue=1)
    assert plan_prefill(1, 1, prefill_workers=1, prefill_queue=0, thresholds=always).remote


@pytest.mark.parametrize("bad", [dict(min_tokens=-1), dict(min_ratio=1.5), dict(max_prefill_queue=-1)])
def test_thresholds_are_validated(bad: dict) -> None:
    with pytest.raises(ValueError):
        DisaggThresholds(**bad)


def test_overlap_beyond_the_prompt_is_refused() -> None:
    with pytest.raises(ValueError):
        plan_prefill(10, 11, prefill_workers=1, prefill_queue=0, thresholds=T)
