"""Prometheus metrics of the frontend process (served at ``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class FrontendMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("sluice_requests_total", "Finished requests", ["model", "outcome"], registry=r)
        self.errors = Counter("sluice_request_errors_total", "Failed requests by error type",
                              ["model", "type"], registry=r)
        self.ttft = Histogram("sluice_time_to_first_token_seconds", "Time to first token", ["model"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("sluice_request_duration_seconds", "Request duration", ["model"],
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("sluice_output_tokens_total", "Generated tokens", ["model"], registry=r)
        self.in_flight = Gauge("sluice_requests_in_flight", "Requests being served", registry=r)
        self.migrations = Counter("sluice_request_migrations_total",
                                  "Requests moved to another worker after theirs was lost", ["model"], registry=r)
        self.admission_refusals = Counter("sluice_admission_refusals_total",
                                          "Requests refused because every worker had its bound waiting", ["model"],
                                          registry=r)
        self.live_workers = Gauge("sluice_live_workers", "Workers with a live lease", ["model"], registry=r)
        self.waiting = Gauge("sluice_requests_waiting", "Requests routed by this frontend and waiting for their "
                             "first token", registry=r)
        self.limits = Gauge("sluice_admission_limit", "Admission-control limits in force (settings; 0: none)",
                            ["limit"], registry=r)

    def observe_finished(self, model: str, finish_reason: str | None, error_type: str | None,
                         ttft_s: float | None, total_s: float, completion_tokens: int) -> None:
        outcome = "error" if error_type else (finish_reason or "unknown")
        self.requests.labels(model, outcome).inc()
        if error_type:
            self.errors.labels(model, error_type).inc()
        if ttft_s is not None:
            self.ttft.labels(model).observe(ttft_s)
        self.duration.labels(model).observe(total_s)
        self.tokens.labels(model).inc(completion_tokens)
