"""The planner's loop: observe, predict, plan, apply, record.

Usage::

    planner = Planner(settings, broker, index, connector)
    await planner.run(stop)          # until ``stop`` is set; stands by while another planner acts

Each adjustment interval (``interval_s``) it reads the interval's traffic from the frontends' counters and
each pool's state from the workers' leases and the queues (planner.observe), feeds the predictors, asks
the mode for each pool's replicas (planner.modes), settles them with bounds, hysteresis and the budget
(planner.scaling), asks the connector for the changes, and records the decision (a log line, the
metrics, the decisions stream) and its own state (for a successor). Between intervals, every
``fast_interval_s``, the fast path grows a pool that passed the burst thresholds; it never shrinks one.

Only the namespace's acting planner (planner.leader) reads, decides or acts; the lease is renewed
before every tick, so a planner that lost it does nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import msgspec
import redis.asyncio as aioredis
import redis.exceptions

from core.keys import PLANNER_DECISIONS_MAXLEN, Keys
from core.pools import Pool
from core.settings import PlannerSettings, PlannerThresholds
from planner.connectors.base import Connector, PoolRef
from planner.decision import (
    Decision,
    ModelView,
    PlannerState,
    PoolDecision,
    Traffic,
    decode_state,
    encode,
)
from planner.leader import LeaderLease
from planner.metrics import PlannerMetrics
from planner.modes import (
    Corrections,
    Forecast,
    PoolPlan,
    SlaPlanner,
    decode_context,
    rate_rose,
    serving_pools,
    threshold_plan,
    with_headroom,
)
from planner.observe import PoolState, TrafficMeter, TrafficSample, pool_states
from planner.predictors import Predictor, PredictorKind, make_predictor
from planner.profile import Profile
from planner.prometheus import PrometheusError, PrometheusTraffic
from planner.scaling import (
    PoolMemory,
    Wish,
    bounded,
    decode_wish,
    fit_budget,
    floor_allowed,
    grow_only,
    lowest,
    settle,
    wish_within,
)
from router.cluster import ClusterReader, ClusterSnapshot

log = logging.getLogger("sluice.planner")

#: Observations per model kept in the planner's state for a successor's predictors.
HISTORY_KEPT = 64


def pools_of(layout: str) -> tuple[Pool, ...]:
    return (Pool.PREFILL, Pool.DECODE) if layout == "disagg" else (Pool.AGG,)


@dataclass(slots=True)
class ModelForecaster:
    """One model's predictors (rate, input length, output length, the decode's context) and recent
    observations (``contexts`` beside ``history``, -1 where unknown)."""

    rate: Predictor
    isl: Predictor
    osl: Predictor
    context: Predictor
    history: list[tuple[float, float, float]]
    contexts: list[float]

    def observe(self, rate: float, isl: float | None, osl: float | None, context: float | None = None) -> None:
        """``context`` None with lengths known (a frontend that does not count it): that of one shape."""
        self.rate.observe(rate)
        if isl is not None and osl is not None:
            self.isl.observe(isl)
            self.osl.observe(osl)
            self.context.observe(decode_context(isl, osl, context))
        self.history = [*self.history, (rate, -1.0 if isl is None else isl, -1.0 if osl is None else osl)][-HISTORY_KEPT:]
        self.contexts = [*self.contexts, -1.0 if context is None else context][-HISTORY_KEPT:]

    def forecast(self) -> Forecast:
        return Forecast(self.rate.predict(), self.isl.predict(), self.osl.predict(), self.context.predict())


def _predictor(kind: PredictorKind, window: int) -> Predictor:
    """``window`` is the moving average's; ARIMA keeps its own (it needs more points than a window to average)."""
    return make_predictor(kind, window=window) if kind == "moving_average" else make_predictor(kind)


class Planner:
    def __init__(self, settings: PlannerSettings, models: list[str], broker: aioredis.Redis, keys: Keys,
                 connector: Connector, *, reader: ClusterReader | None = None, profile: Profile | None = None,
                 metrics: PlannerMetrics | None = None, clock: Callable[[], float] = time.time,
                 metrics_url: str = "", prometheus: PrometheusTraffic | None = None) -> None:
        """``broker``: the Redis of the frontends' leases, the queues and the planner's own keys; ``reader``
        reads the workers (its registry may live on the routing state's Redis); ``profile``: the ``sla``
        mode's (loaded from ``settings.profile`` when not given)."""
        self.s = settings
        self.models = models
        self.redis = broker
        self.keys = keys
        self.connector = connector
        self.reader = reader or ClusterReader(broker, keys)
        self.metrics = metrics or PlannerMetrics()
        self.clock = clock
        self.lease = LeaderLease(broker, keys, settings.lock_ttl_s, metrics_url)
        self.refs = [PoolRef(m, p) for m in models for p in pools_of(settings.layout)]
        if settings.mode == "sla":
            profile = profile or (Profile.load(settings.profile) if settings.profile else None)
            if profile is None:
                raise ValueError("the sla mode needs a profile: SLUICE_PLANNER__PROFILE (sluice profile writes one)")
        #: The prefill pools may go to 0 (PlannerSettings.local_prefill: the sla mode, disaggregated).
        self.local_prefill = settings.local_prefill and settings.mode == "sla" and settings.layout == "disagg"
        self.sla = SlaPlanner(profile, settings.ttft_s * settings.sla_margin, settings.itl_s * settings.sla_margin,
                              settings.prefill_utilization, self.local_prefill,
                              settings.itl_s * (settings.decode_floor_margin or settings.sla_margin)) if profile else None
        self.meter = TrafficMeter()
        #: Where the traffic is read when it is not the frontends' counters (SLUICE_PLANNER__SOURCE).
        self.prometheus = prometheus
        self.tick = 0
        self.memory: dict[PoolRef, PoolMemory] = {r: PoolMemory() for r in self.refs}
        self.forecasters = {m: self._forecaster([], []) for m in models}
        self.corrections = {m: Corrections() for m in models}
        self.last: Decision | None = None

    def _forecaster(self, history: list[tuple[float, float, float]], contexts: list[float]) -> ModelForecaster:
        """Predictors fed ``history`` again; ``contexts`` may be shorter (an older planner's state): its
        last ones go with the last observations."""
        kind, window = self.s.predictor, self.s.predictor_window
        rate_p, isl_p, osl_p, context_p = (_predictor(kind, window) for _ in range(4))
        f = ModelForecaster(rate_p, isl_p, osl_p, context_p, [], [])
        known = [-1.0] * (len(history) - len(contexts)) + contexts[-len(history):] if history else []
        for (rate, isl, osl), context in zip(history, known, strict=True):
            f.observe(rate, isl if isl >= 0 else None, osl if osl >= 0 else None, context if context >= 0 else None)
        return f

    def _lowest(self, ref: PoolRef) -> int:
        return lowest(ref.pool, self.s.min_replicas, self.local_prefill)

    def _bounded(self, ref: PoolRef, wanted: int) -> int:
        return bounded(wanted, self._lowest(ref), self.s.max_replicas)

    def _local(self, model: str, states: dict[PoolRef, PoolState]) -> bool:
        """Whether ``model``'s decode pool computes its prompts itself: prefill may go to 0 and no prefill
        worker is live (the router then keeps every prompt local, router/disagg.py)."""
        prefill = states.get(PoolRef(model, Pool.PREFILL))
        return self.local_prefill and prefill is not None and prefill.workers == 0

    @property
    def thresholds(self) -> PlannerThresholds:
        return {"latency": self.s.latency_thresholds, "load": self.s.load_thresholds}.get(
            self.s.mode, self.s.throughput_thresholds)

    # ---- the loop ----
    async def run(self, stop: asyncio.Event) -> None:
        """Act while holding the lease, stand by while another planner does, until ``stop`` is set."""
        next_interval: float | None = None
        try:
            while not stop.is_set():
                try:
                    if not await self.lease.acquire():
                        self.metrics.leader.set(0)
                        next_interval = None
                        await _wait(stop, min(self.s.fast_interval_s, self.s.lock_ttl_s / 3))
                        continue
                    self.metrics.leader.set(1)
                    now = self.clock()
                    if next_interval is None:  # just became the acting planner
                        await self.resume()
                        next_interval = now + self.s.interval_s
                        await self.step("fast")
                    elif now >= next_interval:
                        next_interval = now + self.s.interval_s
                        await self.step("interval")
                    else:
                        await self.step("fast")
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                    log.warning("planner: Redis unavailable (%s); trying again", exc)
                wait = self.s.fast_interval_s if next_interval is None else \
                    max(0.0, min(self.s.fast_interval_s, next_interval - self.clock()))
                await _wait(stop, wait)
        finally:
            self.metrics.leader.set(0)
            try:
                await self.lease.release()
            except redis.exceptions.RedisError:
                pass

    async def resume(self) -> None:
        """Take over: the last planner's state (its interval count, hysteresis and observations), and the
        traffic counters' baseline."""
        raw = await self.redis.get(self.keys.planner_state)
        if raw is not None:
            try:
                state = decode_state(raw)
            except msgspec.DecodeError:
                state = None
            if state is not None:
                self.tick = state.tick
                for key, (last_up, low) in state.memory.items():
                    ref = next((r for r in self.refs if str(r) == key), None)
                    if ref is not None:
                        memory = self.memory[ref] = PoolMemory(last_up, list(low))
                        if key in state.shrunk:
                            memory.last_down, memory.shrunk_from = state.shrunk[key]
                for model in self.models:
                    self.forecasters[model] = self._forecaster(state.history.get(model, []),
                                                               state.contexts.get(model, []))
                    self.corrections[model] = Corrections(*state.corrections.get(model, ()))
                log.info("planner: resuming at interval %d from the state of %.0f s ago", self.tick,
                         self.clock() - state.at)
        self.meter.read(await self.reader.frontends.live(), self.clock())

    async def step(self, kind: str) -> Decision:
        """One tick: observe, plan, apply, record."""
        now = self.clock()
        pool_queues = {ref: self.keys.pool_queue(ref.model, ref.pool.value) for ref in self.refs}
        snapshot = await self.reader.read(extra_queues=pool_queues.values(), index=False)
        states = pool_states(snapshot, {ref: snapshot.queue_messages.get(q, 0) for ref, q in pool_queues.items()})
        traffic = await self._traffic(snapshot, now) if kind == "interval" else None
        # The fast path's look at the interval so far (the sure rise, sla planning only): the frontends'
        # counters, not Prometheus'.
        peek = kind == "fast" and self.sla is not None and self.prometheus is None
        so_far = self.meter.peek(snapshot.frontends, now) if peek else None
        if kind == "interval":
            self.tick += 1
        views, plans = [], []
        for model in self.models:
            view, model_plans = self._plan_model(model, kind, states, traffic, (so_far or {}).get(model))
            views.append(view)
            plans.extend(model_plans)
        decision = await self._apply(kind, now, states, views, plans)
        if kind == "interval":
            await self._save_state(now)
        return decision

    async def _traffic(self, snapshot: ClusterSnapshot, now: float) -> dict[str, TrafficSample] | None:
        if self.prometheus is None:
            return self.meter.read(snapshot.frontends, now)
        try:
            return await self.prometheus.read(self.s.interval_s)
        except PrometheusError as exc:  # no traffic this interval: the pools are still sized on what they hold
            log.warning("planner: %s", exc)
            return None

    # ---- planning ----
    def _plan_model(self, model: str, kind: str, states: dict[PoolRef, PoolState],
                    traffic: dict[str, TrafficSample] | None, so_far: TrafficSample | None = None,
                    ) -> tuple[ModelView, list[PoolPlan]]:
        refs = [r for r in self.refs if r.model == model]
        observed, ended = None, None
        forecaster, corrections = self.forecasters[model], self.corrections[model]
        local = self._local(model, states)
        if traffic is not None:
            sample = traffic.get(model) or TrafficSample(self.s.interval_s, 0, 0, None, None, None, None)
            observed = Traffic(sample.rate, sample.isl, sample.osl, sample.ttft_s, sample.itl_s, sample.context)
            if self.sla is not None:
                prefill_pool, decode_pool = serving_pools(self.s.layout, local)
                corrections.set_models(*self.sla.model_factors(
                    forecaster.forecast(), states.get(PoolRef(model, prefill_pool)), states.get(PoolRef(model, decode_pool))))
                if self.s.correction:
                    self.sla.correct(corrections, sample, states, model, self.s.layout, local)
            # The floor's gate at an interval's end: the interval that ended against what was forecast for it.
            if self.s.floor_rise_z > 0 and forecaster.history:
                ended = (sample, forecaster.forecast())
            forecaster.observe(sample.rate, sample.isl, sample.osl, sample.context)
        forecast = forecaster.forecast()
        predicted = Traffic(forecast.rate, forecast.isl, forecast.osl, context=forecast.context)
        view = ModelView(model, observed, predicted, corrections.prefill, corrections.decode, corrections.prefill_model,
                         corrections.decode_model)
        if kind == "fast":
            burst = PlannerThresholds(kv_high=self.s.burst_kv, kv_low=0.0, queue_high=self.s.burst_queue)
            plans = [threshold_plan(states[r], burst) for r in refs]
            if self.sla is not None and forecaster.history and forecast.isl > 0:
                rise = self._sure_rise(model, forecast, corrections, so_far, local)
                if so_far is not None and not rise and self.s.sure_rise_z > 0:  # what a hold's record says
                    plans = [replace(p, reason=f"{p.reason}; {_so_far(so_far, forecast)}: not a sure rise")
                             for p in plans]
                opened = self._floor_opened(so_far, forecast)
                plans = [self._with_floor(_at_least(p, *rise.get(p.ref, (0, ""))), states[p.ref], forecast,
                                          corrections, rising=opened or p.ref in rise,
                                          grows=opened or p.ref in rise or self.s.floor_rise_z <= 0, local=local)
                         for p in plans]
            return view, plans
        if self.sla is not None and self.s.mode == "sla":
            if not forecaster.history:  # nothing observed yet: no plan
                return view, [PoolPlan(r, states[r].workers, "no traffic observed yet") for r in refs]
            if forecast.isl <= 0:  # requests arrive but none has finished yet: lengths unknown
                return view, [PoolPlan(r, states[r].workers, "no request finished yet") for r in refs]
            planned = with_headroom(forecast, self.s.rate_headroom_z, self.s.interval_s)
            plans = self.sla.plan(model, self.s.layout, planned, corrections, local)
            best = self._sure_fall(model, forecast, corrections, local)
            apart = self._sure_fall(model, forecast, corrections, local, keep_apart=True) \
                if any(p.apart for p in plans) else {}
            plans = [replace(p, sure_replicas=best.get(p.ref),
                             apart=p.apart and replace(p.apart, sure_replicas=apart.get(p.ref))) for p in plans]
            opened = self._floor_opened(*ended) if ended is not None else False

            def floored(p: PoolPlan) -> PoolPlan:
                return self._with_floor(p, states[p.ref], forecast, corrections, rising=opened,
                                        grows=opened or self.s.floor_rise_z <= 0, local=local)
            return view, [replace(floored(p), apart=p.apart and floored(p.apart)) for p in plans]
        return view, [threshold_plan(states[r], self.thresholds) for r in refs]

    def _sure_fall(self, model: str, forecast: Forecast, c: Corrections, local: bool,
                   keep_apart: bool = False) -> dict[PoolRef, int]:
        """The sure shrink's sizes (planner.modes.SlaPlanner.sure_replicas) on the last two intervals' rates;
        empty before there are two, or when the rate did not fall past the noise."""
        assert self.sla is not None
        history = self.forecasters[model].history
        if len(history) < 2:
            return {}
        return self.sla.sure_replicas(model, self.s.layout, history[-2][0], history[-1][0], forecast, c,
                                      self.s.sure_shrink_z, self.s.interval_s, local, keep_apart)

    def _sure_rise(self, model: str, forecast: Forecast, c: Corrections, so_far: TrafficSample | None,
                   local: bool = False) -> dict[PoolRef, tuple[int, str]]:
        """The fast path's sure rise (planner.modes.SlaPlanner.rise_replicas) on the interval so far: the
        workers each pool needs, with the reason; empty when the arrivals are within the forecast's noise."""
        assert self.sla is not None
        if so_far is None:
            return {}
        sizes = self.sla.rise_replicas(model, self.s.layout, forecast, so_far.arrived, so_far.duration_s, c,
                                       self.s.sure_rise_z, local)
        why = f"a sure rise: {_so_far(so_far, forecast)}"
        return {ref: (n, f"{why}: {n} workers") for ref, n in sizes.items()}

    def _floor_opened(self, arrivals: TrafficSample | None, forecast: Forecast) -> bool:
        """Whether the floor's gate is open (``FLOOR_RISE_Z`` above 0): ``arrivals`` (an interval's, or the
        current one's so far) passed ``forecast`` by that many deviations. An open gate lets the floor grow
        a pool, and lifts its hold within the cooldown of a shrink as the sure rise does (a rise that the
        arrivals and the load on the pool both show is less likely noise than one alone)."""
        z = self.s.floor_rise_z
        return z > 0 and arrivals is not None and rate_rose(forecast.rate, arrivals.arrived, arrivals.duration_s, z)

    def _with_floor(self, plan: PoolPlan, state: PoolState, forecast: Forecast, c: Corrections,
                    rising: bool = False, grows: bool = True, local: bool = False) -> PoolPlan:
        """``sla`` mode: never fewer workers than the load already on the pool needs (planner.modes), except
        that within the cooldown after a shrink it only grows the pool past the size it shrank from
        (planner.scaling.floor_allowed; the floor taken within the bounds, as the wish is in :meth:`_apply`),
        unless the arrivals of the interval so far rose past the forecast (``rising``): a ramp, not a flap.
        With ``grows`` False (the floor's gate is shut, :meth:`_floor_opened`) the floor only keeps the pool
        from shrinking under its load: it asks for no more workers than the pool has. ``local``: the
        model's decode pool computes its prompts (:meth:`_local`), so its waiting prompts count too."""
        assert self.sla is not None
        floor, why = self.sla.floor(state, forecast, c, local)
        kept = max(plan.replicas, state.workers)
        if not grows and floor > kept:  # the gate is shut: keep the pool from shrinking under its load, no more
            held = self._bounded(plan.ref, floor)
            why = f"{why}: {floor} workers held (arrivals within {self.s.floor_rise_z:g} deviations of the forecast)"
            floor = kept
            if floor <= plan.replicas:
                return replace(plan, reason=f"{plan.reason}; {why}", held=held)
        if floor <= plan.replicas:
            return plan
        memory = self.memory[plan.ref]
        # The load already on the pool is not a fall, whatever the rate says: no sure shrink under it.
        sure = None if plan.sure_replicas is None else max(plan.sure_replicas, floor)
        within = self._bounded(plan.ref, floor)
        if not rising and not floor_allowed(memory, self.tick, self.s.cooldown_intervals, within):
            return replace(plan, reason=f"{plan.reason}; {why}: {floor} workers held (shrank from "
                                        f"{memory.shrunk_from} at interval {memory.last_down})", sure_replicas=sure,
                           held=within)
        return replace(plan, replicas=floor, reason=f"{why}: {floor} workers now ({plan.reason})", sure_replicas=sure,
                       need=None)

    def _wish(self, plan: PoolPlan) -> Wish:
        """``plan``'s wish within the pool's bounds."""
        return wish_within(plan.replicas, plan.sure_replicas, plan.need, self._lowest(plan.ref), self.s.max_replicas)

    async def _apply(self, kind: str, now: float, states: dict[PoolRef, PoolState], views: list[ModelView],
                     plans: list[PoolPlan]) -> Decision:
        requested: dict[PoolRef, int] = {}
        for plan in plans:
            asked = await self.connector.current(plan.ref)
            requested[plan.ref] = asked if asked is not None else states[plan.ref].workers
        targets: dict[PoolRef, int] = {}
        notes: dict[PoolRef, str] = {}
        wanted: dict[PoolRef, int] = {}
        chosen: list[PoolPlan] = []  # each pool's plan, or its plan apart where the prompts' move waits
        for plan in plans:  # a model's prefill pool before its decode pool (pools_of)
            ref, before = plan.ref, requested[plan.ref]
            wish = self._wish(plan)
            if ref.pool is Pool.DECODE and (prefill := PoolRef(ref.model, Pool.PREFILL)) in targets:
                wish = decode_wish(requested[prefill], targets[prefill], wish,
                                   None if plan.apart is None else self._wish(plan.apart))
                if wish.apart and plan.apart is not None:
                    plan = replace(plan.apart, reason=f"the prefill pool keeps {targets[prefill]} workers, so "
                                                      f"the prompts stay there ({plan.apart.reason})")
            chosen.append(plan)
            wanted[ref] = wish.wanted
            if kind == "fast":
                targets[ref], notes[ref] = grow_only(before, wish.wanted, self.memory[ref], self.tick)
            else:
                targets[ref], notes[ref] = settle(before, wish.wanted, self.memory[ref], self.tick,
                                                  self.s.down_after_intervals, self.s.cooldown_intervals, wish.sure,
                                                  wish.sure_why, wish.need, self.s.up_band)
        # The fast path never shrinks, through the budget either: a pool that grows takes only what the
        # others leave (cutting one to grow another was a flap a tick, the disagg 60-second run).
        floors = {r: requested[r] if kind == "fast" else self._lowest(r) for r in targets}
        fitted = fit_budget(targets, floors, self.s.budget)
        pools = []
        for plan in chosen:
            ref, before, target = plan.ref, requested[plan.ref], fitted[plan.ref]
            note = notes[ref] if target == targets[ref] else f"{notes[ref]}, cut to {target} by the budget {self.s.budget}"
            action = "up" if target > before else "down" if target < before else "hold"
            state = states[ref]
            held = None  # a size this tick kept the pool from: the budget's cut, else the floor's hold
            if target < targets[ref]:
                held = targets[ref]
            elif plan.held is not None and plan.held > target:
                held = plan.held
            pools.append(PoolDecision(
                model=ref.model, pool=ref.pool.value, live=state.workers, draining=state.draining, requested=before,
                wanted=wanted[ref], target=target, action=action, reason=f"{note}: {plan.reason}",
                kv_usage=round(state.kv_usage, 4), pending=state.pending, expected_ttft_s=plan.expected_ttft_s,
                expected_itl_s=plan.expected_itl_s, held=held))
            if action != "hold":
                await self.connector.scale(ref, target, plan.reason)
        decision = Decision(at=now, kind=kind, mode=self.s.mode, connector=self.connector.name, tick=self.tick,
                            models=views, pools=pools)
        await self._record(decision)
        return decision

    # ---- records ----
    async def _record(self, decision: Decision) -> None:
        self.last = decision
        self.metrics.observe(decision)
        if decision.kind == "interval" or decision.actions or decision.holds:
            for p in decision.pools:
                log.info("planner %s: %s/%s %s %d -> %d (live %d, draining %d, wanted %d): %s", decision.kind,
                         p.model, p.pool, p.action, p.requested, p.target, p.live, p.draining, p.wanted, p.reason,
                         extra={"planner": msgspec.to_builtins(p)})
            await self.redis.xadd(self.keys.planner_decisions, {"d": encode(decision)},
                                  maxlen=PLANNER_DECISIONS_MAXLEN, approximate=True)

    async def _save_state(self, now: float) -> None:
        state = PlannerState(
            at=now, tick=self.tick,
            memory={str(r): (m.last_up, list(m.low)) for r, m in self.memory.items()},
            shrunk={str(r): (m.last_down, m.shrunk_from) for r, m in self.memory.items() if m.shrunk_from},
            history={m: list(f.history) for m, f in self.forecasters.items()},
            contexts={m: list(f.contexts) for m, f in self.forecasters.items()},
            corrections={m: (c.prefill, c.decode, c.prefill_model, c.decode_model) for m, c in self.corrections.items()})
        await self.redis.set(self.keys.planner_state, encode(state))


def _so_far(so_far: TrafficSample, forecast: Forecast) -> str:
    return (f"{so_far.arrived} arrivals in {so_far.duration_s:.0f} s against "
            f"{forecast.rate * so_far.duration_s:.1f} forecast")


def _at_least(plan: PoolPlan, replicas: int, why: str) -> PoolPlan:
    """``plan``, or ``replicas`` workers for ``why`` when that is more."""
    return replace(plan, replicas=replicas, reason=f"{why} ({plan.reason})", need=None) \
        if replicas > plan.replicas else plan


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    """Until ``stop`` is set or ``seconds`` have passed."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(seconds, 0.0)):
            await stop.wait()
