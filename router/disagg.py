"""Conditional disaggregation: does this request's prefill go to the prefill pool, or stay local?

A remote prefill costs a queue hop and a KV transfer; it pays when the prefill the decode worker
would otherwise run itself is long enough to stall that worker's running decodes. The rule, with
``uncached = prompt_tokens - overlap_tokens`` (the part of the prompt the chosen decode worker does
not hold)::

    remote  iff  a prefill worker is live
            and  the prefill pool's queue holds fewer than ``max_prefill_queue`` requests
            and  uncached >= min_tokens
            and  uncached >= min_ratio * prompt_tokens

``min_tokens`` is the absolute bound (a short prompt is cheaper to prefill in place than to move);
``min_ratio`` keeps a prompt the decode worker mostly holds local even when its new part is long
(the decode worker would pull only the new blocks, but the hop and the second scheduling are paid
whole). Both are settings (:class:`core.settings.DisaggSettings`) overridable per request.

Pure and synchronous: the inputs come from the routing decision already made for the decode worker.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.registry import LiveWorker


def split_pools(workers: Sequence[LiveWorker]) -> tuple[list[LiveWorker], list[LiveWorker]]:
    """A model's workers as a request is routed over them: those that answer it (decode and aggregated
    workers), and the prefill pool."""
    return [w for w in workers if w.record.pool.serves_clients], [w for w in workers if w.record.pool.prefills_for_others]


class PrefillPlace(enum.StrEnum):
    LOCAL = "local"
    REMOTE = "remote"


@dataclass(frozen=True, slots=True)
class DisaggThresholds:
    min_tokens: int = 2048
    min_ratio: float = 0.7
    max_prefill_queue: int = 64

    def __post_init__(self) -> None:
        if self.min_tokens < 0 or not 0.0 <= self.min_ratio <= 1.0 or self.max_prefill_queue < 0:
            raise ValueError(f"invalid disaggregation thresholds: {self}")


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    place: PrefillPlace
    uncached_tokens: int
    reason: str

    @property
    def remote(self) -> bool:
        return self.place is PrefillPlace.REMOTE


def plan_prefill(prompt_tokens: int, overlap_tokens: int, *, prefill_workers: int, prefill_queue: int,
                 thresholds: DisaggThresholds) -> PrefillPlan:
    """Where the prompt is computed; ``reason`` names the condition that decided (the response's
    ``x-sluice-disagg-reason`` header and the request's log line)."""
    if prompt_tokens < 0 or not 0 <= overlap_tokens <= prompt_tokens:
        raise ValueError(f"overlap {overlap_tokens} outside a prompt of {prompt_tokens} tokens")
    uncached = prompt_tokens - overlap_tokens
    if prefill_workers <= 0:
        return PrefillPlan(PrefillPlace.LOCAL, uncached, "no prefill worker")
    if prefill_queue >= thresholds.max_prefill_queue:
        return PrefillPlan(PrefillPlace.LOCAL, uncached, "prefill queue full")
    if uncached < thresholds.min_tokens:
        return PrefillPlan(PrefillPlace.LOCAL, uncached, "short uncached prompt")
    if uncached < thresholds.min_ratio * prompt_tokens:
        return PrefillPlan(PrefillPlace.LOCAL, uncached, "mostly cached on the decode worker")
    return PrefillPlan(PrefillPlace.REMOTE, uncached, "long uncached prompt")
