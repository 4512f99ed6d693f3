"""How many workers each pool wants: the planner's modes, as pure functions of what it observed and
predicted (docs/planner.md explains when to use which).

Threshold modes (``throughput``, the default, ``latency`` and ``load``) need no profile; they differ
only in their thresholds (core.settings.PlannerThresholds). A pool of ``n`` workers whose mean KV usage
``u`` passes ``kv_high``, or that has more than ``queue_high`` requests per worker waiting, grows to::

    max(n + 1, ceil(n * u / mid), n + ceil((pending - n * queue_high) / max(queue_high, 1)))

with ``mid = (kv_high + kv_low) / 2`` (the usage brought back to the middle of the band). A pool with
nothing waiting shrinks to the fewest workers ``k`` that keep ``n * u / k`` under ``kv_low``. In between
it stays. Those modes react to load already there; ``sla`` plans for the next interval's.

The ``sla`` mode sizes pools from the predicted rate ``r``, input length ``I`` and output length ``O``
and the engine's profile (planner.profile), corrected by what was observed (``c_p``, ``c_d``: observed
over expected TTFT and ITL):

* a prefill worker serves a prompt in ``S = ttft(I) * c_p``; queueing (M/D/1) adds ``rho S / (2 (1 - rho))``
  at utilization ``rho``, so the highest utilization that keeps the mean TTFT within the target ``T`` is
  ``rho* = min(prefill_utilization, 2k / (1 + 2k))`` with ``k = (T - S) / S``; prefill workers:
  ``ceil(r S / rho*)``;
* a decode worker holds the largest batch ``b`` whose ITL (times ``c_d``) meets the ITL target at the
  decode's context ``C`` (:attr:`Forecast.decode_context`: the token-weighted context the frontends count,
  ``I + O / 2`` for requests of one shape); streams decode for ``O * itl(b)`` each, so ``r O itl(b)`` of
  them run at once (Little's law), and decode workers: ``ceil(r O itl(b) / b)``;
* an aggregated worker does both: the fewest ``n`` whose prefill share ``busy = r S / n`` stays under
  ``rho*``, and whose streams fit the batch ``b`` that meets the ITL target with the decode's time cut to
  ``1 - busy`` (prefill steps stall the batch): ``r (O itl + S) / n <= b``, with ``itl = itl(b) / (1 - busy)``.
  A stream holds its KV from its prefill on, so the prefill's ``S`` counts in what a worker holds: with long
  prompts and short answers it is a tenth of a stream's stay (2,000 tokens and 32: the day's long-prompt
  phase needed 7 workers live where the decode alone counted 6, docs/planner.md).
* disaggregated with ``local_prefill``: when the decode pool alone, sized as aggregated workers (they
  compute the prompts themselves: with no prefill worker live the router keeps every prompt local,
  router/disagg.py), takes fewer workers than the two pools apart (a kept pool has one at least), the
  prefill pool plans 0 and the decode pool that many; on a tie the pools stay as they are. Each pool's
  plan then carries its plan with the pools apart (:attr:`PoolPlan.apart`): moving the prompts from one
  pool to the other is one move, and while the prefill pool's hysteresis holds its workers the decode pool
  keeps the size it has apart (planner.scaling.decode_wish).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from core.pools import Pool
from core.settings import PlannerThresholds
from core.timing import TimingModel
from planner.connectors.base import PoolRef
from planner.observe import PoolState, TrafficSample
from planner.profile import Profile, replicas_for

#: Correction factors (observed over expected latency) are held within these bounds: one odd interval
#: must not send the plan to the budget or to zero.
CORRECTION_BOUNDS = (0.25, 4.0)
#: Each interval's correction moves the kept one this far towards it (an exponential average).
CORRECTION_SMOOTHING = 0.5
#: The most workers the aggregated search tries for one pool.
MAX_WORKERS = 1024


def decode_context(isl: float, osl: float, context: float | None) -> float:
    """The context a decode step holds: ``context`` (weighted by tokens, as the frontends count it) where
    known, else ``isl + osl / 2``, which is the same for requests of one shape."""
    return context if context is not None and context > 0 else isl + osl / 2


def serving_pools(layout: str, local: bool = False) -> tuple[Pool, Pool]:
    """The pools that compute a model's prompts and decode its streams: prefill and decode apart
    (``disagg``), the decode pool for both when it computes the prompts itself (``local``), the
    aggregated pool for both otherwise."""
    if layout != "disagg":
        return Pool.AGG, Pool.AGG
    return (Pool.DECODE if local else Pool.PREFILL), Pool.DECODE


@dataclass(frozen=True, slots=True)
class Forecast:
    """The next interval's load of one model, as the predictors expect it."""

    rate: float
    isl: float
    osl: float
    #: The context a decode step holds, weighted by tokens (planner.observe.TrafficSample.context); None:
    #: unknown, ``isl + osl / 2`` (the same for requests of one shape).
    context: float | None = None

    @property
    def decode_context(self) -> float:
        return decode_context(self.isl, self.osl, self.context)


def with_headroom(f: Forecast, z: float, interval_s: float) -> Forecast:
    """``f`` with its rate raised to the upper end of what the next interval may bring: arrivals are
    Poisson, so an interval of ``T`` seconds at rate ``r`` sees ``r +- sqrt(r / T)`` (one standard
    deviation); planning for ``r + z sqrt(r / T)`` leaves the intervals that bring more than the mean
    within the targets too (z = 0.5: seven in ten; z = 1.3: nine in ten). It matters for short intervals
    and low rates."""
    if f.rate <= 0 or z <= 0:
        return f
    return replace(f, rate=f.rate + z * math.sqrt(f.rate / interval_s))


def upper_forecast(f: Forecast, z: float, interval_s: float) -> Forecast:
    """``f`` at the upper end of the rate its last interval may have had: ``z`` standard deviations of the
    arrivals counted, and never fewer than one arrival's (an interval with none may still come from a low
    rate). What that rate needs is where a sure shrink stops (planner.scaling.settle)."""
    count = max(f.rate, 0.0) * interval_s
    return replace(f, rate=(count + z * math.sqrt(max(count, 1.0))) / interval_s)


def rate_fell(previous: float, current: float, z: float, interval_s: float) -> bool:
    """Whether an interval's rate fell from the previous one's by more than ``z`` standard deviations of
    the difference of their Poisson counts: a fall that noise cannot explain (the sure shrink's trigger)."""
    before, now = max(previous, 0.0) * interval_s, max(current, 0.0) * interval_s
    return before - now >= z * math.sqrt(max(before + now, 1.0))


def rate_rose(expected: float, arrived: int, elapsed_s: float, z: float) -> bool:
    """Whether ``arrived`` requests in the first ``elapsed_s`` seconds of an interval are more than ``z``
    standard deviations of a Poisson count above what the ``expected`` rate brings in that time: a rise
    that noise cannot explain (the sure rise's trigger, :meth:`SlaPlanner.rise_replicas`)."""
    mean = max(expected, 0.0) * elapsed_s
    return elapsed_s > 0 and arrived - mean >= z * math.sqrt(max(mean, 1.0))


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """What one pool wants, and why (one line, logged and kept with the decision)."""

    ref: PoolRef
    replicas: int
    reason: str
    expected_ttft_s: float | None = None
    expected_itl_s: float | None = None
    #: ``sla`` mode, after a sure fall (:meth:`SlaPlanner.sure_replicas`): the replicas the upper end of
    #: the observed rate needs (planner.scaling.settle shrinks to it at once when it is fewer than the pool
    #: has); None: only hysteresis shrinks the pool.
    sure_replicas: int | None = None
    #: ``sla`` mode: the size the load on the pool asked for and a rule held it from (the floor within
    #: the cooldown of a shrink, planner.controller); None: nothing held.
    held: int | None = None
    #: ``sla`` mode, a disaggregated plan that moves the prompts to the decode pool (the prefill pool at 0):
    #: this pool's plan with the pools apart, which it keeps while the prefill pool still has workers
    #: (planner.scaling.decode_wish); None: the plan keeps the pools apart.
    apart: PoolPlan | None = None
    #: ``sla`` mode: the workers the plan's load needs as a fraction, before rounding up to ``replicas``
    #: (the up-band's measure, planner.scaling.settle); None: a whole number of workers that must be met
    #: (the threshold modes, the floor of the load already on the pool, a sure rise).
    need: float | None = None


def threshold_plan(state: PoolState, thresholds: PlannerThresholds) -> PoolPlan:
    """A threshold mode's wish for one pool (see the module's docstring)."""
    n, u, pending = state.workers, state.kv_usage, state.pending
    t = thresholds
    if n == 0:
        wanted = 1 if pending or state.running else 0
        return PoolPlan(state.ref, wanted, f"no live worker, {pending} waiting")
    mid = (t.kv_high + t.kv_low) / 2
    if u > t.kv_high or pending > n * t.queue_high:
        by_kv = math.ceil(n * u / mid) if mid > 0 else n + 1
        by_queue = n + math.ceil((pending - n * t.queue_high) / max(t.queue_high, 1.0)) if pending > n * t.queue_high else n
        wanted = max(n + 1, by_kv, by_queue)
        return PoolPlan(state.ref, wanted, f"kv usage {u:.2f} (high {t.kv_high}), {pending} waiting on {n} workers "
                                           f"(high {t.queue_high}/worker)")
    if pending == 0 and n > 1:
        fewest = next((k for k in range(1, n) if n * u / k < t.kv_low), n)
        if fewest < n:
            return PoolPlan(state.ref, fewest, f"kv usage {u:.2f} on {n} workers stays under {t.kv_low} on {fewest}, "
                                               "nothing waiting")
    return PoolPlan(state.ref, n, f"kv usage {u:.2f}, {pending} waiting on {n} workers: within the band")


@dataclass(slots=True)
class Corrections:
    """How far the fleet is from its profile, per phase (1.0: the profile holds), in two factors:

    * ``prefill_model``, ``decode_model``: the workers' own step-time models (fitted from their steps and
      published with their load) over the model the profile's run fitted, for a prompt of the predicted
      length and a step at the target's KV usage: the hardware or the engine's settings changed;
    * ``prefill``, ``decode``: observed over expected TTFT and ITL, the expectation already scaled by the
      first factor, smoothed across intervals: what the step models do not see (the request path, other
      processes on the machine).

    The plan scales the profile's times by their product (``prefill_factor``, ``decode_factor``)."""

    prefill: float = 1.0
    decode: float = 1.0
    prefill_model: float = 1.0
    decode_model: float = 1.0

    @property
    def prefill_factor(self) -> float:
        return self.prefill * self.prefill_model

    @property
    def decode_factor(self) -> float:
        return self.decode * self.decode_model

    def update(self, phase: str, observed: float | None, expected: float | None) -> None:
        if observed is None or expected is None or not 0 < expected < math.inf:
            return
        lo, hi = CORRECTION_BOUNDS
        ratio = min(hi, max(lo, observed / expected))
        kept = getattr(self, phase)
        setattr(self, phase, kept + CORRECTION_SMOOTHING * (ratio - kept))

    def set_models(self, prefill: float | None, decode: float | None) -> None:
        """The step-model factors (None: no worker published a model, or the profile has none: left)."""
        lo, hi = CORRECTION_BOUNDS
        if prefill is not None:
            self.prefill_model = min(hi, max(lo, prefill))
        if decode is not None:
            self.decode_model = min(hi, max(lo, decode))


@dataclass(frozen=True, slots=True)
class SlaPlanner:
    """The ``sla`` mode for one model (see the module's docstring)."""

    profile: Profile
    ttft_s: float
    itl_s: float
    prefill_utilization: float = 0.7
    #: ``disagg``: the prefill pool may go to 0 workers, the decode pool computing the prompts itself,
    #: when that takes fewer workers (:meth:`plan`; PlannerSettings.local_prefill).
    local_prefill: bool = False
    #: The ITL at which :meth:`floor` takes the KV target of a decode pool that computes no prompts (None:
    #: ``itl_s``, the one the plan aims at; PlannerSettings.decode_floor_margin).
    decode_floor_itl_s: float | None = None

    def prefill_service_s(self, isl: float, c: Corrections) -> float:
        return self.profile.ttft_s(isl) * c.prefill_factor

    def prefill_rho(self, service_s: float) -> float:
        """The highest prefill utilization that keeps the mean TTFT within the target (M/D/1)."""
        if service_s >= self.ttft_s:
            return self.prefill_utilization  # out of reach whatever the fleet: plan for throughput
        k = (self.ttft_s - service_s) / service_s
        return min(self.prefill_utilization, 2 * k / (1 + 2 * k))

    def expected_ttft_s(self, rate: float, isl: float, workers: int, c: Corrections) -> float:
        """Mean TTFT with ``workers`` prefill workers taking ``rate`` prompts of ``isl`` tokens per second."""
        s = self.prefill_service_s(isl, c)
        rho = rate * s / workers if workers else math.inf
        if rho >= 1:
            return math.inf
        return s + rho * s / (2 * (1 - rho))

    def decode_batch(self, context: float, c: Corrections) -> tuple[int, float]:
        """The batch a decode worker holds within the ITL target at ``context``, and its ITL there."""
        batch = max(1, self.profile.decode_batch_within(self.itl_s, context, c.decode_factor))
        return batch, self.profile.itl_s(batch, context) * c.decode_factor

    def needs(self, f: Forecast, c: Corrections) -> tuple[float, float, float, float]:
        """Worker-equivalents for prefill and decode, the prompt's service time and the decode ITL."""
        s = self.prefill_service_s(f.isl, c)
        prefill = f.rate * s / self.prefill_rho(s)
        batch, itl = self.decode_batch(f.decode_context, c)
        decode = f.rate * f.osl * itl / batch
        return prefill, decode, s, itl

    def agg_fit(self, f: Forecast, c: Corrections, n: float) -> float | None:
        """The ITL ``n`` aggregated workers give ``f`` when they meet the targets (see the module's
        docstring; ``n`` may be fractional, a share of a worker's time), else None."""
        s = self.prefill_service_s(f.isl, c)
        busy = f.rate * s / n if n > 0 else math.inf
        if busy >= self.prefill_rho(s):
            return None
        context = f.decode_context
        batch = self.profile.decode_batch_within(self.itl_s * (1 - busy), context, c.decode_factor)
        if batch == 0:
            return None
        itl = self.profile.itl_s(batch, context) * c.decode_factor / (1 - busy)
        # Little's law over a stream's stay: prefill and decode
        return itl if f.rate * (f.osl * itl + s) / n <= batch else None

    def agg_workers(self, f: Forecast, c: Corrections) -> tuple[int, float]:
        """The fewest aggregated workers for ``f``, and the ITL they give (see the module's docstring)."""
        for n in range(1, MAX_WORKERS + 1):
            itl = self.agg_fit(f, c, n)
            if itl is not None:
                return n, itl
        prefill, decode, _, itl = self.needs(f, c)  # out of reach: the two phases' sum, as for pools apart
        return replicas_for(prefill + decode), itl

    def agg_need(self, f: Forecast, c: Corrections, n: int) -> float:
        """The aggregated workers ``f`` needs as a fraction (the up-band's measure, planner.scaling.settle),
        given :meth:`agg_workers`' ``n``: where between ``n - 1`` and ``n`` workers' time starts to meet the
        targets, to a thousandth of a worker; ``n`` when ``n`` does not meet them either (out of reach)."""
        if self.agg_fit(f, c, n) is None:
            return float(n)
        lo, hi = n - 1.0, float(n)
        while hi - lo > 1e-3:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.agg_fit(f, c, mid) is not None else (mid, hi)
        return hi

    def plan(self, model: str, layout: str, f: Forecast, c: Corrections, local_now: bool = False,
             keep_apart: bool = False) -> list[PoolPlan]:
        """Each pool's workers for ``f``. With ``local_prefill``, disaggregated: the decode pool alone when it
        takes fewer workers than the pools apart, and on a tie when it already computes the prompts
        (``local_now``: no prefill worker live), so that a tie does not start and stop a prefill worker;
        each of those plans carries its plan apart (:attr:`PoolPlan.apart`). ``keep_apart``: the pools apart
        whatever it costs (the fast path, which never shrinks the prefill pool, cannot move the prompts)."""
        prefill, decode, s, itl = self.needs(f, c)
        why = (f"predicted {f.rate:.2f} req/s, isl {f.isl:.0f}, osl {f.osl:.0f}; prompt {s:.3f} s "
               f"(corrections prefill {c.prefill:.2f} x {c.prefill_model:.2f}, decode {c.decode:.2f} x "
               f"{c.decode_model:.2f})")
        if layout == "disagg":
            n_p, n_d = replicas_for(prefill), replicas_for(decode)
            apart = [PoolPlan(PoolRef(model, Pool.PREFILL), n_p, f"{why}: {prefill:.2f} prefill workers",
                              self.expected_ttft_s(f.rate, f.isl, max(n_p, 1), c), None, need=prefill),
                     PoolPlan(PoolRef(model, Pool.DECODE), n_d, f"{why}, itl {itl * 1000:.1f} ms: {decode:.2f} decode "
                                                                "workers", None, itl, need=decode)]
            if self.local_prefill and not keep_apart:  # the decode pool alone, as aggregated workers, when fewer
                n, local_itl = self.agg_workers(f, c)
                total = max(n_p, 1) + max(n_d, 1)  # a pool that is kept has a worker
                if n < total or (n == total and local_now):
                    local = f"{why}: the decode pool computes the prompts, {n} workers ({total} apart)"
                    return [PoolPlan(PoolRef(model, Pool.PREFILL), 0, local, None, None, apart=apart[0], need=0.0),
                            PoolPlan(PoolRef(model, Pool.DECODE), n, f"{local}, itl {local_itl * 1000:.1f} ms",
                                     self.expected_ttft_s(f.rate, f.isl, n, c), local_itl, apart=apart[1],
                                     need=self.agg_need(f, c, n))]
            return apart
        n, itl = self.agg_workers(f, c)
        need = self.agg_need(f, c, n)
        return [PoolPlan(PoolRef(model, Pool.AGG), n, f"{why}, itl {itl * 1000:.1f} ms: {n} workers ({need:.2f})",
                         self.expected_ttft_s(f.rate, f.isl, n, c), itl, need=need)]

    def sure_replicas(self, model: str, layout: str, previous: float, current: float, f: Forecast, c: Corrections,
                      z: float, interval_s: float, local_now: bool = False, keep_apart: bool = False,
                      ) -> dict[PoolRef, int]:
        """The sure shrink's sizes: when the rate fell from ``previous`` to ``current`` (the last two
        intervals' observed rates) past the noise (:func:`rate_fell`), what the upper end of ``f``'s rate
        (:func:`upper_forecast`) needs per pool (``keep_apart``: with the pools apart); empty otherwise, or
        with ``z`` 0 (off)."""
        if z <= 0 or not rate_fell(previous, current, z, interval_s):
            return {}
        upper = upper_forecast(f, z, interval_s)
        return {p.ref: p.replicas for p in self.plan(model, layout, upper, c, local_now, keep_apart)}

    def rise_replicas(self, model: str, layout: str, f: Forecast, arrived: int, elapsed_s: float, c: Corrections,
                      z: float, local_now: bool = False) -> dict[PoolRef, int]:
        """The sure rise's sizes: when the current interval's ``arrived`` requests in its first ``elapsed_s``
        seconds passed what ``f`` predicted by more than the noise (:func:`rate_rose`), what the rate they
        show needs per pool; empty otherwise, or with ``z`` 0 (off). The rate observed is the estimate: the
        trigger already says it is above the forecast, and a lower end ``z`` deviations down would size the
        first seconds of a ramp under the forecast itself. The pools stay apart unless the decode pool computes
        the prompts already (``local_now``): the fast path grows pools, and cannot take the prefill pool's
        workers away to move the prompts."""
        if z <= 0 or not rate_rose(f.rate, arrived, elapsed_s, z):
            return {}
        observed = replace(f, rate=arrived / elapsed_s)
        return {p.ref: p.replicas for p in self.plan(model, layout, observed, c, local_now, keep_apart=not local_now)}

    def floor(self, state: PoolState, f: Forecast, c: Corrections, local: bool = False) -> tuple[int, str]:
        """The workers the load already on the pool needs, whatever was predicted: its KV usage brought down
        to the usage at which the profile's ITL meets the target (pools that decode), and its waiting
        prompts computed within the TTFT target (pools that prefill; a decode pool too when ``local``: it
        computes its prompts itself, no prefill worker being live). A decode pool whose prompts the prefill
        pool computes takes its KV target at ``decode_floor_itl_s``: its streams' ITL spreads little around
        the pool's mean, while a pool that computes prompts between its decode steps keeps the margin the
        plan aims at (docs/planner.md, "The floor of a decode pool apart")."""
        n, pool, out, why = state.workers, state.ref.pool, 0, []
        computes_prompts = pool is not Pool.DECODE or local
        if pool.serves_clients and n:
            context = max(f.decode_context, 1.0)
            itl = self.itl_s if computes_prompts or self.decode_floor_itl_s is None else self.decode_floor_itl_s
            batch = max(1, self.profile.decode_batch_within(itl, context, c.decode_factor))
            usage_at_target = min(1.0, batch * context / self.profile.kv_tokens)
            out = replicas_for(n * state.kv_usage / usage_at_target)
            why.append(f"kv usage {state.kv_usage:.2f} (target {usage_at_target:.2f})")
        if computes_prompts and state.pending:
            s = self.prefill_service_s(max(f.isl, 1.0), c)
            out = max(out, replicas_for(state.pending * s / self.ttft_s))
            why.append(f"{state.pending} prompts waiting")
        return out, ", ".join(why)

    def model_factors(self, f: Forecast, prefill: PoolState | None, decode: PoolState | None,
                      ) -> tuple[float | None, float | None]:
        """The workers' step-time models over the profile's (see :class:`Corrections`): the mean over the
        workers that published one of their prefill time for a prompt of the predicted length, and of their
        decode step at the KV usage where the profile meets the ITL target; None where either side lacks one."""
        reference = TimingModel.decode_text(self.profile.timing)
        if reference is None:
            return None, None
        context = max(f.decode_context, 1.0)
        batch = max(1, self.profile.decode_batch_within(self.itl_s, context))
        usage = min(1.0, batch * context / self.profile.kv_tokens)

        def ratio(models: tuple[TimingModel, ...], of: Callable[[TimingModel], float]) -> float | None:
            base = of(reference)
            return sum(of(m) for m in models) / len(models) / base if models and base > 0 else None

        isl = max(f.isl, 1.0)
        return (ratio(prefill.timings, lambda m: m.prefill_ms(isl)) if prefill else None,
                ratio(decode.timings, lambda m: m.decode_ms(usage)) if decode else None)

    def correct(self, c: Corrections, sample: TrafficSample, states: dict[PoolRef, PoolState], model: str,
                layout: str, local: bool = False) -> None:
        """Fold one interval's observed TTFT and ITL into the corrections, against what the profile
        expected for the load that was observed on the workers that served it (``local``: a disaggregated
        layout's decode pool computed the prompts, as aggregated workers do)."""
        if sample.isl is None:
            return
        prefill_pool, decode_pool = serving_pools(layout, local)
        layout = "agg" if local else layout
        p_state, d_state = states.get(PoolRef(model, prefill_pool)), states.get(PoolRef(model, decode_pool))
        context = decode_context(sample.isl, sample.osl or 0.0, sample.context)
        per_worker = max(1.0, d_state.running / d_state.workers) if d_state is not None and d_state.workers else 1.0
        if p_state is not None and p_state.workers and sample.ttft_s is not None:
            unit = Corrections(1.0, c.decode, c.prefill_model, c.decode_model)
            expected = self.expected_ttft_s(sample.rate, sample.isl, p_state.workers, unit)
            if layout != "disagg":  # a prompt that arrives mid-step waits for it: half a decode step
                expected += self.profile.itl_s(per_worker, context) * c.decode_factor / 2
            c.update("prefill", sample.ttft_s, expected)
        if d_state is not None and d_state.workers and sample.itl_s is not None and sample.osl is not None:
            expected = self.profile.itl_s(per_worker, context) * c.decode_model
            if layout != "disagg":  # the prefills the same workers ran meanwhile stretch the gaps
                busy = sample.rate * self.profile.ttft_s(sample.isl) * c.prefill_model / d_state.workers
                expected = expected / (1 - busy) if busy < 1 else math.inf
            c.update("decode", sample.itl_s, expected)
