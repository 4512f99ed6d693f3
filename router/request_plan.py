"""A request's whole path, decided in one place: the worker that streams the answer, whether the
prompt is computed on a prefill worker (which one, and why), and the tasks still to push.

The frontend plans each request and each migrated attempt with :func:`plan_route`, choosing with its
routing policy (``Policy.choose``: the decision is recorded, and the ``kv`` policy pushes the task in
the same Redis call); the standalone router's ``/best_worker`` plans with ``KvPolicy.best`` and no
tasks, a dry run that records and enqueues nothing. Both therefore answer the same question the same
way, disaggregated requests included.

With a prefill pool and disaggregation not ``off``, the serving (decode) worker is chosen first,
without an enqueue: how much of the prompt it holds decides whether the prefill goes remote
(router.disagg). A remote prefill is routed over the prefill pool (a pin names the decode worker,
not the prefill worker), and its task carries the decode worker, which the prefill worker hands the
request to. A local prefill pushes the request's own task onto the decode worker's queue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from core.settings import DisaggSettings
from core.wire import TaskParts
from router.disagg import DisaggThresholds, PrefillPlace, PrefillPlan, plan_prefill
from router.policies import RouteDecision, RouteRequest, RouterOverrides
from router.registry import LiveWorker

#: A policy's choice (``Policy.choose``, ``KvPolicy.best``, or a caller's wrapper that meters it).
Chooser = Callable[[RouteRequest, Sequence[LiveWorker]], Awaitable[RouteDecision]]

DisaggMode = Literal["auto", "on", "off"]
DISAGG_MODES: tuple[DisaggMode, ...] = ("auto", "on", "off")


def disagg_mode(requested: str | None, enabled: bool) -> DisaggMode:
    """The request's disaggregation mode: its own (``x-sluice-router: disagg=...``), else the
    deployment's (``auto`` where ``SLUICE_DISAGG__ENABLED``, else ``off``). ValueError for another."""
    mode = requested or ("auto" if enabled else "off")
    for known in DISAGG_MODES:
        if mode == known:
            return known
    raise ValueError(f"disagg must be auto, on or off, not {mode!r}")


def disagg_thresholds(settings: DisaggSettings, overrides: RouterOverrides) -> DisaggThresholds:
    """The ``auto`` mode's thresholds: the deployment's, or the request's own where it sets them."""
    return DisaggThresholds(
        min_tokens=int(settings.min_tokens if overrides.disagg_min_tokens is None else overrides.disagg_min_tokens),
        min_ratio=settings.min_ratio if overrides.disagg_min_ratio is None else min(1.0, overrides.disagg_min_ratio),
        max_prefill_queue=settings.max_prefill_queue)


def prefill_route_id(request_id: str) -> str:
    """The prefill's own id with the router (its prediction is apart from the serving worker's)."""
    return f"{request_id}:prefill"


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What a plan is made from. ``route.task``: the request's task for the serving worker (None: a
    dry run); ``prefill_task``: builds the prefill task for the chosen decode worker (None: a dry run)."""

    route: RouteRequest
    serving: Sequence[LiveWorker]
    prefill: Sequence[LiveWorker] = ()
    disagg: DisaggMode = "off"
    thresholds: DisaggThresholds = field(default_factory=DisaggThresholds)
    prefill_task: Callable[[LiveWorker], TaskParts] | None = None


@dataclass(frozen=True, slots=True)
class RequestPlan:
    #: The worker that streams the answer (a decode or an aggregated worker).
    serving: RouteDecision
    #: The prefill worker, when the prompt is computed remotely.
    prefill: RouteDecision | None = None
    #: Where the prompt is computed and why (None: no prefill pool was considered).
    disagg: PrefillPlan | None = None
    #: Tasks the caller still pushes, as (queue, task): those the policy did not push as it routed.
    to_push: tuple[tuple[str, TaskParts], ...] = ()


async def plan_route(request: PlanRequest, choose: Chooser) -> RequestPlan:
    """The request's path over ``request.serving`` (and ``request.prefill``), chosen with ``choose``."""
    route = request.route
    if not request.prefill or request.disagg == "off":
        decision = await choose(route, request.serving)
        return RequestPlan(decision, to_push=_unpushed(decision, route.task))
    serving = await choose(dataclasses.replace(route, task=None), request.serving)
    chosen = next(w for w in request.serving if w.record.worker_id == serving.worker_id)
    prompt_tokens = len(route.token_ids)
    if not chosen.record.pool.decodes_handoffs:
        disagg = PrefillPlan(PrefillPlace.LOCAL, prompt_tokens, "aggregated worker")
    else:
        thresholds = request.thresholds if request.disagg == "auto" else dataclasses.replace(
            request.thresholds, min_tokens=0, min_ratio=0.0)
        disagg = plan_prefill(prompt_tokens, min(prompt_tokens, serving.overlap_blocks * chosen.record.block_size),
                              prefill_workers=len(request.prefill),
                              prefill_queue=sum(w.load.waiting for w in request.prefill), thresholds=thresholds)
    if not disagg.remote:
        return RequestPlan(serving, disagg=disagg, to_push=_unpushed(serving, route.task))
    task = request.prefill_task(chosen) if request.prefill_task is not None else None
    prefill = await choose(RouteRequest(prefill_route_id(route.request_id), route.model, route.token_ids, route.lora,
                                        overrides=dataclasses.replace(route.overrides, worker_id=None), task=task),
                           request.prefill)
    return RequestPlan(serving, prefill, disagg, to_push=_unpushed(prefill, task))


def _unpushed(decision: RouteDecision, task: TaskParts | None) -> tuple[tuple[str, TaskParts], ...]:
    return () if task is None or decision.enqueued else ((decision.queue, task),)
