"""From a mode's wish to the replicas the planner asks for: bounds, hysteresis and the budget, as pure
functions (the controller keeps each pool's :class:`PoolMemory` across intervals and restarts).

* Bounds: each pool between ``min_replicas`` and ``max_replicas``; a prefill pool may go to 0 when the
  ``sla`` mode computes prompts on the decode pool (:func:`lowest`).
* Hysteresis (:func:`settle`): a pool grows at once; it shrinks only after ``down_after`` intervals in a
  row that each wanted fewer workers, to the most of those wishes, and never within ``cooldown``
  intervals of growing. A steady load therefore never scales a pool up and down within two intervals.
  A sure fall skips the wait: when the caller saw the rate fall past the noise and even the upper end of
  the observed rate needs fewer workers than the pool has (``sure``), it shrinks to that at once (still
  never within the cooldown).
  The other way round, the ``sla`` mode's floor (the load already on a pool) does not grow a pool back to
  the size it had within ``cooldown`` intervals of shrinking it, only past it (:func:`floor_allowed`); the
  burst thresholds still do.
* Up-band (:func:`within_band`): a plan's need is fractional (4.03 workers) and rounds up; a pool holds
  when that need passes its size by no more than ``up_band`` of it (5% by default), instead of growing a
  whole worker for a few hundredths of one. The plan aims at ``sla_margin`` of the targets, so the pool
  still meets them; the rate an interval draws swings a need at the edge of a whole number by a few
  percent, and growing on it was the last steady flap (docs/planner.md, "The up-band"). The floor (the
  load already on a pool), a sure rise and the burst thresholds are whole numbers and grow past it.
* One move across two pools (:func:`decode_wish`): a disaggregated plan that moves the prompts to the
  decode pool (the prefill pool at 0) or back changes both pools, and they change together. While the
  prefill pool's hysteresis keeps its workers, the decode pool keeps the size it has apart (growing it to
  compute the prompts as well would pay twice, and shrink back when the prefill pool stayed: a flap). When
  the prefill pool grows from 0 the decode pool shrinks to its size apart at once, not after
  ``down_after`` intervals.
* Budget (:func:`fit_budget`): when the pools together want more than the budget, each keeps its floor
  and what is left is shared in proportion to what each wanted above it (largest remainders).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TypeVar

from core.pools import Pool

K = TypeVar("K")

#: Why a sure shrink (:func:`settle`'s ``sure``) shrinks a pool at once, unless a rule says otherwise.
SURE_FALL = "a sure fall"


@dataclass(slots=True)
class PoolMemory:
    """What hysteresis remembers of one pool: when it last grew and shrank (interval numbers), the size
    it last shrank from, and the latest run of intervals that wanted fewer workers than it had."""

    last_up: int = -(10**9)
    low: list[int] = field(default_factory=list)
    last_down: int = -(10**9)
    shrunk_from: int = 0


def bounded(wanted: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, wanted))


def lowest(pool: Pool, min_replicas: int, local_prefill: bool) -> int:
    """The fewest workers ``pool`` may have: ``min_replicas``, or 0 for a prefill pool whose prompts the
    decode pool may compute (``local_prefill``, planner.modes.SlaPlanner)."""
    return 0 if local_prefill and pool is Pool.PREFILL else min_replicas


def settle(requested: int, wanted: int, memory: PoolMemory, tick: int, down_after: int,
           cooldown: int, sure: int | None = None, sure_why: str = SURE_FALL, need: float | None = None,
           up_band: float = 0.0) -> tuple[int, str]:
    """The replicas to ask for at interval ``tick`` and a note on why (see the module's docstring).
    ``sure``: after a sure fall (``sure_why``), what the upper end of the observed rate needs (taken at
    least ``wanted``); None: no sure shrink. ``need``: the workers the wish rounded up from (None: a whole
    number that must be met); within ``up_band`` of the pool's size the pool holds instead of growing."""
    if wanted > requested and within_band(requested, need, up_band):
        memory.low.clear()
        return requested, f"hold: needs {need:.2f} workers, within {up_band:.0%} of the {requested} it has"
    if wanted > requested:
        memory.last_up = tick
        memory.low.clear()
        return wanted, "up"
    if wanted == requested:
        memory.low.clear()
        return requested, "hold"
    memory.low = [*memory.low, wanted][-down_after:]
    since = tick - memory.last_up
    if sure is not None and max(sure, wanted) < requested and since > cooldown:
        return _shrink(memory, tick, requested, max(sure, wanted)), f"down ({sure_why})"
    if len(memory.low) < down_after:
        return requested, f"hold: {len(memory.low)} of {down_after} intervals wanted fewer"
    if since <= cooldown:
        return requested, f"hold: grew {since} interval(s) ago (cooldown {cooldown})"
    return _shrink(memory, tick, requested, max(memory.low)), "down"


def within_band(requested: int, need: float | None, up_band: float) -> bool:
    """Whether a pool of ``requested`` workers holds a fractional ``need`` within the up-band: it has a
    worker, and the need passes its size by at most ``up_band`` of it (see the module's docstring)."""
    return need is not None and requested > 0 and need <= requested * (1 + up_band)


@dataclass(frozen=True, slots=True)
class Wish:
    """What a pool asks hysteresis for: ``wanted`` workers, and ``sure``, a size to shrink to at once,
    and why (see :func:`settle`; None: none). ``apart``: the decode pool's size with the pools apart,
    taken instead of its plan's (:func:`decode_wish`). ``need``: the fractional workers ``wanted`` rounds
    up (the up-band's measure; None: none)."""

    wanted: int
    sure: int | None = None
    sure_why: str = SURE_FALL
    apart: bool = False
    need: float | None = None


def wish_within(replicas: int, sure: int | None, need: float | None, lo: int, hi: int) -> Wish:
    """A plan's wish (``replicas``, its ``sure`` shrink and fractional ``need``) within the bounds ``lo``..``hi``;
    the need is kept only where the bounds kept ``replicas`` (a bound is a whole number that must be met)."""
    wanted = bounded(replicas, lo, hi)
    return Wish(wanted, None if sure is None else bounded(sure, lo, hi), need=need if wanted == replicas else None)


def decode_wish(prefill_requested: int, prefill_target: int, plan: Wish, apart: Wish | None) -> Wish:
    """A disaggregated model's decode pool's wish once its prefill pool settled on ``prefill_target``
    (from ``prefill_requested``) at the same tick: ``plan``'s, or ``apart`` (the decode pool's wish with the
    pools apart, when the plan moves the prompts to the decode pool) while the prefill pool keeps workers;
    when the prefill pool grows from 0, ``plan`` at once (see the module's docstring)."""
    if apart is not None and prefill_target > 0:
        return replace(apart, apart=True)
    if prefill_requested == 0 and prefill_target > 0:
        return replace(plan, sure=plan.wanted, sure_why=f"the prefill pool grows from 0 to {prefill_target}")
    return plan


def _shrink(memory: PoolMemory, tick: int, requested: int, target: int) -> int:
    memory.low.clear()
    memory.last_down, memory.shrunk_from = tick, requested
    return target


def floor_allowed(memory: PoolMemory, tick: int, cooldown: int, floor: int) -> bool:
    """Whether the load already on a pool may grow it to ``floor`` workers at interval ``tick``: within
    ``cooldown`` intervals of a shrink (which hysteresis allowed after intervals that each wanted fewer),
    only past the size it shrank from. The usage of the moment on one or two workers swings with a few
    long requests; growing back on it is a flap, while a load that needs more than the pool had before
    is a ramp (holding the floor whole within the cooldown lost one: docs/planner.md)."""
    return floor > memory.shrunk_from or tick - memory.last_down > cooldown


def grow_only(requested: int, wanted: int, memory: PoolMemory, tick: int) -> tuple[int, str]:
    """The fast path: grow at once, never shrink (shrinking waits for the interval)."""
    if wanted > requested:
        memory.last_up = tick
        memory.low.clear()
        return wanted, "up (burst)"
    return requested, "hold"


def fit_budget(targets: dict[K, int], floors: dict[K, int], budget: int) -> dict[K, int]:
    """``targets`` cut down to ``budget`` in all (see the module's docstring); unchanged when they fit.
    Floors that alone pass the budget are kept: the bounds say a pool may not go under them."""
    if sum(targets.values()) <= budget:
        return dict(targets)
    base = {k: min(floors.get(k, 0), t) for k, t in targets.items()}
    left = budget - sum(base.values())
    extra = {k: targets[k] - base[k] for k in targets}
    total = sum(extra.values())
    if left <= 0 or total == 0:
        return base
    shares = {k: left * e / total for k, e in extra.items()}
    out = {k: base[k] + math.floor(shares[k]) for k in targets}
    rest = left - sum(math.floor(s) for s in shares.values())
    for k in sorted(targets, key=lambda k: (-(shares[k] - math.floor(shares[k])), str(k)))[:rest]:
        out[k] += 1
    return out
