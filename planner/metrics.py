"""The planner's Prometheus metrics (served by ``sluice planner`` on ``SLUICE_PLANNER__METRICS_PORT``;
docs/metrics.md lists them): per pool, the replicas it wants, asks for and sees live; per model, the load
it observed and predicted and its corrections; its actions and whether this process is the acting one."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from planner.decision import Decision


@dataclass
class PlannerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.desired = Gauge("sluice_planner_desired_replicas", "Replicas the planner asked for, per pool "
                             "(after bounds, hysteresis and the budget)", ["model", "pool"], registry=r)
        self.wanted = Gauge("sluice_planner_wanted_replicas", "Replicas the planner's mode wanted, per pool",
                            ["model", "pool"], registry=r)
        self.actual = Gauge("sluice_planner_actual_replicas", "Live workers taking requests, per pool, as the "
                            "planner last saw them", ["model", "pool"], registry=r)
        self.actions = Counter("sluice_planner_actions_total", "Scaling actions, per pool and direction",
                               ["model", "pool", "direction"], registry=r)
        self.observed = Gauge("sluice_planner_observed_load", "Load observed over the last interval: rate "
                              "(req/s), isl, osl (tokens), ttft_s, itl_s", ["model", "quantity"], registry=r)
        self.predicted = Gauge("sluice_planner_predicted_load", "Load predicted for the next interval: rate "
                               "(req/s), isl, osl (tokens)", ["model", "quantity"], registry=r)
        self.correction = Gauge("sluice_planner_correction", "sla mode: observed over expected latency per "
                                "phase (prefill, decode), and the workers' step-time models over the profile's "
                                "(prefill_model, decode_model)", ["model", "phase"], registry=r)
        self.leader = Gauge("sluice_planner_leader", "1 while this process is the namespace's acting planner",
                            registry=r)
        self.decisions = Counter("sluice_planner_decisions_total", "Decisions taken, by kind (interval, fast)",
                                 ["kind"], registry=r)

    def observe(self, decision: Decision) -> None:
        self.decisions.labels(decision.kind).inc()
        for p in decision.pools:
            for direction in ("up", "down"):  # each pool's series from its first decision on, at 0
                self.actions.labels(p.model, p.pool, direction)
            self.desired.labels(p.model, p.pool).set(p.target)
            self.wanted.labels(p.model, p.pool).set(p.wanted)
            self.actual.labels(p.model, p.pool).set(p.live)
            if p.action != "hold":
                self.actions.labels(p.model, p.pool, p.action).inc()
        for m in decision.models:
            for gauge, traffic in ((self.observed, m.observed), (self.predicted, m.predicted)):
                if traffic is None:
                    continue
                for quantity in ("rate", "isl", "osl", "ttft_s", "itl_s"):
                    value = getattr(traffic, quantity)
                    if value is not None:
                        gauge.labels(m.model, quantity).set(value)
            self.correction.labels(m.model, "prefill").set(m.prefill_correction)
            self.correction.labels(m.model, "decode").set(m.decode_correction)
            self.correction.labels(m.model, "prefill_model").set(m.prefill_model_correction)
            self.correction.labels(m.model, "decode_model").set(m.decode_model_correction)
