"""The planner benchmark's trace and what is computed offline from it: a time-compressed day of traffic
(one planner interval per trace step), the oracle schedule, the static fleets, and the figures of a run.

The day (``DAY``, one row per interval, load as a multiple of the base rate): a quiet night of chat, a
ramp to 8x, a long-prompt phase at the peak (prefill-heavy: it needs prefill workers), a chat phase at
the peak (decode-heavy: it needs decode workers), the ramp back, and the night again. Arrivals are
Poisson, seeded; prompts are random token ids (no prefix is shared, so capacity does not depend on
cache luck).

The oracle knows each interval's load exactly and sizes it with the planner's own model (planner.modes,
the ``sla`` mode with no correction) and the same profile: the fewest workers per interval the model says
meet the targets, with no start-up lag and no prediction error. The static fleets hold the oracle's peak,
and the time-weighted mean of its schedule (rounded up), for the whole day.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from core.settings import PlannerSettings
from planner.connectors.base import PoolRef
from planner.modes import Corrections, Forecast, PoolPlan, SlaPlanner, with_headroom
from planner.predictors import PredictorKind, make_predictor
from planner.scaling import PoolMemory, Wish, bounded, decode_wish, lowest, settle, wish_within

CHAT = (512, 128)
LONG = (2000, 32)


@dataclass(frozen=True, slots=True)
class Step:
    """One interval of the trace: the load as a multiple of the base rate, and the request shape."""

    load: float
    isl: int
    osl: int
    #: Whether it is part of a steady phase (flapping is counted there).
    steady: bool = False


def _ramp(lo: float, hi: float, n: int, shape: tuple[int, int]) -> list[Step]:
    return [Step(lo + (hi - lo) * (i + 1) / (n + 1), *shape) for i in range(n)]


#: A day, one step per planner interval.
DAY: tuple[Step, ...] = (
    *[Step(1.0, *CHAT, steady=True)] * 7,
    *_ramp(1.0, 8.0, 4, CHAT),
    *[Step(8.0, *LONG, steady=True)] * 4,
    *[Step(8.0, *CHAT, steady=True)] * 4,
    *_ramp(8.0, 1.0, 4, CHAT),
    *[Step(1.0, *CHAT, steady=True)] * 7,
)


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    step: int
    isl: int
    osl: int


def arrivals(day: Sequence[Step], base_rate: float, step_s: float, seed: int = 7) -> list[Arrival]:
    """Poisson arrivals over the day, each step at ``base_rate * load`` per second."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    for i, step in enumerate(day):
        rate = base_rate * step.load
        t = i * step_s + rng.expovariate(rate)
        while t < (i + 1) * step_s:
            out.append(Arrival(t, i, step.isl, step.osl))
            t += rng.expovariate(rate)
    return out


@dataclass(frozen=True, slots=True)
class Schedule:
    """Replicas per pool per step (pool name -> one count per step)."""

    name: str
    replicas: dict[str, list[int]]

    def worker_seconds(self, step_s: float) -> float:
        return sum(sum(counts) for counts in self.replicas.values()) * step_s

    @property
    def steps(self) -> int:
        return len(next(iter(self.replicas.values())))

    @property
    def peak(self) -> int:
        return max(sum(counts[i] for counts in self.replicas.values()) for i in range(self.steps))


def oracle(day: Sequence[Step], base_rate: float, sla: SlaPlanner, layout: str, lo: int, hi: int) -> Schedule:
    """The fewest workers per step the model says meet the targets, knowing each step's load."""
    return sized(day, [base_rate * step.load for step in day], sla, layout, lo, hi, f"oracle-{layout}")


def realized_rates(plan: Sequence[Arrival], steps: int, step_s: float) -> list[float]:
    """Each step's arrivals per second, as they came (the Poisson draw, not the trace's mean)."""
    counts = [0] * steps
    for a in plan:
        counts[a.step] += 1
    return [n / step_s for n in counts]


def sized(day: Sequence[Step], rates: Sequence[float], sla: SlaPlanner, layout: str, lo: int, hi: int,
          name: str) -> Schedule:
    """The fewest workers per step the model says meet the targets at the given rate of each step."""
    replicas: dict[str, list[int]] = {}
    for step, rate in zip(day, rates, strict=True):
        for plan in sla.plan("m", layout, Forecast(rate, step.isl, step.osl), Corrections()):
            replicas.setdefault(plan.ref.pool.value, []).append(
                bounded(plan.replicas, lowest(plan.ref.pool, lo, sla.local_prefill), hi))
    return Schedule(name, replicas)


def causal(day: Sequence[Step], rates: Sequence[float], sla: SlaPlanner, layout: str, lo: int, hi: int, *,
           z: float, step_s: float, down_after: int, cooldown: int, sure_z: float = 0.0,
           predictor: PredictorKind = "constant", up_band: float = 0.0) -> Schedule:
    """What a planner that sees only the past can do with the same model, with no start-up lag: step
    ``i`` is sized on what ``predictor`` (planner.predictors, fed steps ``0..i-1``'s realized rates and
    shapes; ``constant``: step ``i - 1``'s) expects, raised by ``z`` deviations of an interval's arrivals,
    through the same hysteresis (planner.scaling.settle; ``down_after=1, cooldown=0`` is none), with the sure
    shrink at ``sure_z`` deviations (0: none; it needs the step before the last to compare with). Step 0 is
    sized on its own rate. ``up_band``: the planner's up-band (planner.scaling.settle; 0: none)."""
    replicas: dict[str, list[int]] = {}
    memory: dict[str, PoolMemory] = {}

    def wish(plan: PoolPlan, sure: dict[PoolRef, int]) -> Wish:
        return wish_within(plan.replicas, sure.get(plan.ref), plan.need, lowest(plan.ref.pool, lo, sla.local_prefill), hi)

    options = {"window": PlannerSettings().predictor_window} if predictor == "moving_average" else {}
    rate_p, isl_p, osl_p = (make_predictor(predictor, **options) for _ in range(3))
    for i, step in enumerate(day):
        if i:
            rate_p.observe(rates[i - 1])
            isl_p.observe(day[i - 1].isl)
            osl_p.observe(day[i - 1].osl)
        rate = rate_p.predict() if i else rates[0]
        seen_f = Forecast(rate, isl_p.predict(), osl_p.predict()) if i else Forecast(rate, step.isl, step.osl)
        plans = sla.plan("m", layout, with_headroom(seen_f, z, step_s), Corrections())
        best: dict[PoolRef, int] = {}
        apart: dict[PoolRef, int] = {}
        if i >= 2:
            best = sla.sure_replicas("m", layout, rates[i - 2], rates[i - 1], seen_f, Corrections(), sure_z, step_s)
            if any(p.apart for p in plans):
                apart = sla.sure_replicas("m", layout, rates[i - 2], rates[i - 1], seen_f, Corrections(), sure_z,
                                          step_s, keep_apart=True)
        for plan in plans:  # prefill before decode, as the planner settles them (planner.scaling.decode_wish)
            pool, w = plan.ref.pool.value, wish(plan, best)
            counts = replicas.setdefault(pool, [])
            prefill = replicas.get("prefill", [])
            if pool == "decode" and len(prefill) > 1:  # the prefill pool's last size and the one it settled on
                w = decode_wish(prefill[-2], prefill[-1], w, None if plan.apart is None else wish(plan.apart, apart))
            if not counts:
                counts.append(w.wanted)
                memory[pool] = PoolMemory(last_up=i)
                continue
            target, _ = settle(counts[-1], w.wanted, memory[pool], i, down_after, cooldown, w.sure, w.sure_why, w.need,
                               up_band)
            counts.append(target)
    return Schedule(f"causal-{layout}-z{z:g}-{'h' if down_after > 1 or cooldown else 'nh'}"
                    f"{f'-sure{sure_z:g}' if sure_z else ''}{'' if predictor == 'constant' else '-' + predictor}",
                    replicas)


def short_share(schedule: Schedule, need: Schedule, plan: Sequence[Arrival]) -> float:
    """Share of the requests that arrived in a step where some pool of ``schedule`` had fewer workers than
    ``need`` says that step's load wanted."""
    if not plan:
        return 0.0
    steps = len(next(iter(need.replicas.values())))
    short = [any(schedule.replicas[p][i] < need.replicas[p][i] for p in need.replicas) for i in range(steps)]
    return sum(1 for a in plan if short[a.step]) / len(plan)


def static(schedule: Schedule, how: str) -> Schedule:
    """A fixed fleet: each pool at its ``peak`` or its time-weighted ``mean`` (rounded up) all day."""
    sizes = {pool: max(counts) if how == "peak" else math.ceil(sum(counts) / len(counts) - 1e-9)
             for pool, counts in schedule.replicas.items()}
    return fixed(sizes, schedule.steps, f"static-{how}-{schedule.name.removeprefix('oracle-')}")


def fixed(sizes: dict[str, int], steps: int, name: str | None = None) -> Schedule:
    """A fleet of the given size per pool at every step (``--fleets static-7``, ``static-2+5``; named
    ``name``, else by its sizes)."""
    name = name or "static-" + "+".join(str(n) for n in sizes.values())
    return Schedule(name, {pool: [n] * steps for pool, n in sizes.items()})


def fixed_sizes(fleet: str, pools: Sequence[str]) -> dict[str, int] | None:
    """The pool sizes a ``static-N`` fleet names (``static-P+D`` for prefill and decode pools); None when
    ``fleet`` names none (``static-peak``, ``static-mean``, another fleet) or another number of pools."""
    sizes = fleet.removeprefix("static-").split("+")
    if not fleet.startswith("static-") or len(sizes) != len(pools) or not all(x.isdigit() and int(x) > 0 for x in sizes):
        return None
    return {pool: int(x) for pool, x in zip(pools, sizes, strict=True)}


def day_slice(plan: Sequence[Arrival], first: int, end: int, step_s: float) -> list[Arrival]:
    """The arrivals of steps ``first`` to ``end - 1`` of the day (the same draw as the whole day's), their
    times counted from ``first``'s start: a phase replayed alone (``--steps``)."""
    return [Arrival(a.at_s - first * step_s, a.step, a.isl, a.osl) for a in plan if first <= a.step < end]


def attainment(rows: Iterable[dict], ttft_s: float, itl_s: float) -> float:
    """Share of requests that succeeded with TTFT and their mean ITL within the targets."""
    rows = list(rows)
    met = sum(1 for r in rows if r["ok"] and r["ttft_s"] <= ttft_s and (r["itl_s"] is None or r["itl_s"] <= itl_s))
    return met / len(rows) if rows else 0.0


def actions_of(schedule: Schedule) -> list[tuple[int, str, str]]:
    """The scaling actions a schedule takes, as the bench counts a planner's: (interval, pool, up/down). The
    planner's interval ``j`` (counted from 1) ends step ``j - 1`` and sizes step ``j``."""
    out = []
    for pool, counts in schedule.replicas.items():
        out += [(j, pool, "up" if counts[j] > counts[j - 1] else "down") for j in range(1, len(counts))
                if counts[j] != counts[j - 1]]
    return sorted(out)


def action_times(decisions: Sequence[tuple[int, str, float]], step_s: float) -> list[float]:
    """When each of a planner's decisions was taken, in intervals of the day, from (tick, kind, at):
    an interval decision at its tick ``j`` (it ends interval ``j`` and answers step ``j - 1``); a fast one
    at ``j`` plus the time since tick ``j``'s interval decision (between ticks ``j`` and ``j + 1`` it
    answers step ``j``, the one under way). Tick 0's fast decisions, before the first interval, count from
    one interval before tick 1."""
    tick_at = {tick: at for tick, kind, at in decisions if kind == "interval"}
    if 1 in tick_at:
        tick_at.setdefault(0, tick_at[1] - step_s)
    return [float(tick) if kind == "interval" or tick not in tick_at else tick + (at - tick_at[tick]) / step_s
            for tick, kind, at in decisions]


def steady_intervals(day: Sequence[Step]) -> set[int]:
    """The planner's intervals (counted from 1) that end a steady step: where flaps are counted."""
    return {i + 1 for i, s in enumerate(day) if s.steady}


def flaps(actions: Sequence[tuple[float, str, str]], within: float, steady: set[int]) -> int:
    """Pools scaled one way and then the other within ``within`` intervals, the second answering a steady
    step. ``actions``: (when, pool, "up"/"down") in order, ``when`` in intervals (:func:`action_times`;
    an action at ``when`` answers the step interval ``ceil(when)`` ends)."""
    count = 0
    last: dict[str, tuple[float, str]] = {}
    for when, pool, direction in actions:
        prev = last.get(pool)
        if prev is not None and prev[1] != direction and when - prev[0] <= within and math.ceil(when) in steady:
            count += 1
        last[pool] = (when, direction)
    return count


def cpu_by_step(cpu: list[tuple[float, float]], t0: float, step_s: float, steps: int,
                first: int = 0, end: int | None = None) -> list[float | None]:
    """The machine's mean CPU busy share in each step of the day (its workers, frontend, Redis and the bench's
    own client share it): where the fleet's misses meet a saturated machine, more workers cannot help.
    ``t0`` is the start of step ``first``; steps from ``end`` on (a slice of the day: :func:`day_slice`) and
    before ``first`` are left None."""
    per: list[list[float]] = [[] for _ in range(steps)]
    for t, busy in cpu:
        i = first + math.floor((t - 0.5 - t0) / step_s)  # a sample covers the second before it
        if first <= i < (steps if end is None else min(steps, end)):
            per[i].append(busy)
    return [round(sum(v) / len(v), 3) if v else None for v in per]
