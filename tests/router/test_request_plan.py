"""The request plan (router.request_plan): who serves a request, where its prompt is computed and why,
and what is left to push; a pure function of its inputs and the policy's choices, which a scripted
chooser stands in for here (the planner over the real KV policy is tested through /best_worker in
test_service.py and through the frontend in tests/e2e/test_disagg.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from core.settings import DisaggSettings
from core.wire import TaskParts
from router.disagg import DisaggThresholds
from router.policies import RouteDecision, RouteRequest, RouterOverrides
from router.registry import LiveWorker
from router.request_plan import PlanRequest, disagg_mode, disagg_thresholds, plan_route, prefill_route_id
from tests.router.factories import make_worker

TASK = TaskParts(b"generate:", b"")
PROMPT = list(range(4000))  # 1,000 blocks of 4
AGG, DECODE, PREFILL = make_worker("a0", 0, pool="agg"), make_worker("d0", 1, pool="decode"), \
    make_worker("p0", 2, pool="prefill")


@dataclass
class Scripted:
    """Picks the first candidate, with the overlap set for it; pushes the task when ``enqueues``."""

    overlap: dict[str, int] = field(default_factory=dict)
    enqueues: bool = False
    calls: list[tuple[RouteRequest, list[str]]] = field(default_factory=list)

    async def __call__(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        self.calls.append((request, [w.record.worker_id for w in workers]))
        wid = workers[0].record.worker_id
        return RouteDecision(wid, f"q.{wid}", overlap_blocks=self.overlap.get(wid, 0),
                             enqueued=self.enqueues and request.task is not None)


def prefill_task(decode: LiveWorker) -> TaskParts:
    return TaskParts(f"prefill-for-{decode.record.worker_id}:".encode(), b"")


def request(serving: list[LiveWorker], prefill: list[LiveWorker] = [], mode: str = "auto",  # noqa: B006
            worker_id: str | None = None, **thresholds: float) -> PlanRequest:
    return PlanRequest(RouteRequest("r1", "m", PROMPT, overrides=RouterOverrides(worker_id=worker_id), task=TASK),
                       serving=serving, prefill=prefill, disagg=mode,  # type: ignore[arg-type]
                       thresholds=DisaggThresholds(**thresholds),  # type: ignore[arg-type]
                       prefill_task=prefill_task)


@pytest.mark.parametrize("mode", ["auto", "on", "off"])
async def test_without_a_prefill_pool_one_decision_carries_the_task(mode: str) -> None:
    choose = Scripted()
    plan = await plan_route(request([AGG], mode=mode), choose)
    assert (plan.serving.worker_id, plan.prefill, plan.disagg) == ("a0", None, None)
    assert plan.to_push == (("q.a0", TASK),) and choose.calls[0][0].task is TASK


async def test_a_policy_that_enqueues_as_it_routes_leaves_nothing_to_push() -> None:
    assert (await plan_route(request([AGG]), Scripted(enqueues=True))).to_push == ()
    plan = await plan_route(request([DECODE], [PREFILL]), Scripted(enqueues=True))
    assert plan.prefill is not None and plan.to_push == ()


async def test_a_long_uncached_prompt_is_prefilled_on_the_prefill_pool_for_the_chosen_decode_worker() -> None:
    choose = Scripted()
    plan = await plan_route(request([DECODE], [PREFILL], worker_id="d0"), choose)
    assert plan.disagg is not None and plan.disagg.remote and plan.disagg.reason == "long uncached prompt"
    assert (plan.serving.worker_id, plan.prefill and plan.prefill.worker_id) == ("d0", "p0")
    (serving_route, serving_candidates), (prefill_route, prefill_candidates) = choose.calls
    assert serving_route.task is None and serving_candidates == ["d0"]  # whether it goes remote is not known yet
    assert prefill_route.request_id == prefill_route_id("r1") == "r1:prefill" and prefill_candidates == ["p0"]
    assert prefill_route.overrides.worker_id is None  # a pin names the decode worker
    assert plan.to_push == (("q.p0", TaskParts(b"prefill-for-d0:", b"")),)


@pytest.mark.parametrize(("overlap_blocks", "mode", "thresholds", "reason", "remote"), [
    (0, "auto", {}, "long uncached prompt", True),
    (400, "auto", {}, "mostly cached on the decode worker", False),  # 2,400 of 4,000 uncached: < 0.7 of it
    (600, "auto", {"min_ratio": 0.3}, "short uncached prompt", False),  # 1,600 < 2,048
    (600, "auto", {"min_ratio": 0.3, "min_tokens": 1000}, "long uncached prompt", True),
    (999, "on", {}, "long uncached prompt", True),  # "on": remote whatever is cached...
    (0, "on", {"max_prefill_queue": 0}, "prefill queue full", False),  # ...while the pool takes more
])
async def test_the_thresholds_decide_where_the_prompt_is_computed(overlap_blocks: int, mode: str, thresholds: dict,
                                                                  reason: str, remote: bool) -> None:
    plan = await plan_route(request([DECODE], [PREFILL], mode=mode, **thresholds), Scripted({"d0": overlap_blocks}))
    assert plan.disagg is not None and (plan.disagg.reason, plan.disagg.remote) == (reason, remote)
    assert (plan.prefill is not None) == remote
    assert plan.to_push == ((("q.p0", TaskParts(b"prefill-for-d0:", b"")),) if remote else (("q.d0", TASK),))


async def test_an_aggregated_worker_computes_its_own_prompt_and_disagg_off_asks_nothing_of_the_pool() -> None:
    plan = await plan_route(request([AGG, DECODE], [PREFILL]), Scripted())
    assert plan.disagg is not None and (plan.disagg.reason, plan.prefill) == ("aggregated worker", None)
    choose = Scripted()
    plan = await plan_route(request([DECODE], [PREFILL], mode="off"), choose)
    assert (plan.disagg, plan.prefill, len(choose.calls)) == (None, None, 1)


async def test_a_dry_run_plans_the_same_path_and_pushes_nothing() -> None:
    dry = PlanRequest(RouteRequest("r1", "m", PROMPT), serving=[DECODE], prefill=[PREFILL], disagg="on")
    plan = await plan_route(dry, Scripted())
    assert plan.prefill is not None and plan.prefill.worker_id == "p0" and plan.to_push == ()


def test_the_mode_and_thresholds_come_from_the_request_or_else_the_deployment() -> None:
    assert (disagg_mode(None, True), disagg_mode(None, False), disagg_mode("on", False)) == ("auto", "off", "on")
    with pytest.raises(ValueError, match="auto, on or off"):
        disagg_mode("maybe", True)
    deployment = DisaggSettings(min_tokens=100, min_ratio=0.5, max_prefill_queue=7)
    assert disagg_thresholds(deployment, RouterOverrides()) == DisaggThresholds(100, 0.5, 7)
    assert disagg_thresholds(deployment, RouterOverrides(disagg_min_tokens=5, disagg_min_ratio=3)) == \
        DisaggThresholds(5, 1.0, 7)
