"""Prometheus metrics of the frontend process (served at ``/metrics``): its requests, its routing
decisions, and what it reads from Redis at each scrape (queue depths, index size). docs/metrics.md
lists every metric.

Label sets stay bounded: ``model``, ``mode``, error types and pools come from small fixed sets;
``worker`` labels name live workers only (a gone worker's series are removed at the next scrape).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis.exceptions
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from core.errors import SluiceError
from router.cluster import ClusterSnapshot
from router.frontends import decode_context_tokens

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
_DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
_RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

#: The ``worker`` label of a decision that chose a pool's queue, not a worker (``pool`` mode).
ANY_WORKER = "any"


def error_type(exc: Exception) -> str:
    """The ``type`` label of a request's error: its OpenAI error code (or type), ``redis_unavailable``
    when Redis failed under it (answered 503 like RequestPlaneUnavailable), else ``internal_error``."""
    if isinstance(exc, SluiceError):
        return exc.code or exc.type
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return "redis_unavailable"
    return "internal_error"


@dataclass
class FrontendMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("sluice_requests_total", "Requests that reached routing, by outcome (error: "
                                "refused or failed)", ["model", "outcome"], registry=r)
        self.errors = Counter("sluice_request_errors_total", "Failed requests by error type (refused at admission "
                              "or routing, or failed while served)", ["model", "type"], registry=r)
        self.ttft = Histogram("sluice_time_to_first_token_seconds", "Time to first token", ["model"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("sluice_inter_token_latency_seconds", "Time between a request's streamed tokens "
                             "(tokens that arrive together share the gap)", ["model"], buckets=_ITL_BUCKETS, registry=r)
        self.queue_time = Histogram("sluice_request_queue_time_seconds", "Enqueued until a worker took the request "
                                    "(its Celery queue wait; a migrated request once per worker)", ["model"],
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("sluice_request_duration_seconds", "Request duration", ["model"],
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("sluice_output_tokens_total", "Generated tokens", ["model"], registry=r)
        self.input_tokens = Counter("sluice_input_tokens_total", "Prompt tokens of finished requests", ["model"],
                                    registry=r)
        self.context_tokens = Counter("sluice_decode_context_tokens_total", "Generated tokens times the context "
                                      "they were generated at (prompt + half the answer), of finished requests: "
                                      "over the generated tokens, the decode's token-weighted context", ["model"],
                                      registry=r)
        self.cached_tokens = Counter("sluice_cached_tokens_total", "Prompt tokens the engine found in its prefix "
                                     "cache, of finished requests", ["model"], registry=r)
        self.transferred_tokens = Counter("sluice_transferred_tokens_total", "Prompt tokens whose KV the serving "
                                          "worker read from a prefill worker instead of computing it "
                                          "(disaggregated serving; not in the cached count), of finished requests",
                                          ["model"], registry=r)
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
        # ---- routing (this frontend's decisions) ----
        self.decision_time = Histogram("sluice_router_decision_seconds", "Time to choose a worker (kv mode: the "
                                       "one Redis call that scores, records and enqueues)", ["mode"],
                                       buckets=_DECISION_BUCKETS, registry=r)
        self.overlap_ratio = Histogram("sluice_router_overlap_ratio", "Share of the prompt cached on the worker "
                                       "chosen in kv mode", ["model"], buckets=_RATIO_BUCKETS, registry=r)
        self.picks = Counter("sluice_router_picks_total", f"Routing decisions by chosen worker ('{ANY_WORKER}': a "
                             "pool's shared queue) and mode", ["model", "worker", "mode"], registry=r)
        # ---- read from Redis at each scrape (the same on every frontend) ----
        self.index_blocks = Gauge("sluice_router_index_blocks", "Blocks the prefix index lists for the model's "
                                  "live workers (a block two workers hold counts twice)", ["model"], registry=r)
        self.pool_queue = Gauge("sluice_pool_queue_messages", "Tasks waiting in a pool's shared Celery queue",
                                ["model", "pool"], registry=r)
        self.worker_queue = Gauge("sluice_worker_queue_messages", "Tasks waiting in a live worker's own Celery "
                                  "queue", ["worker"], registry=r)
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}

    def child(self, metric: MetricWrapperBase, *labels: str) -> Any:  # noqa: ANN401 - the metric's own child type
        """``metric.labels(*labels)``, looked up once: ``labels`` validates and locks on every call, which
        the request path would pay a few times per request."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def observe_finished(self, model: str, finish_reason: str | None, error_type: str | None,
                         ttft_s: float | None, total_s: float, completion_tokens: int,
                         prompt_tokens: int = 0, cached_tokens: int = 0, transferred_tokens: int = 0) -> None:
        outcome = "error" if error_type else (finish_reason or "unknown")
        self.child(self.requests, model, outcome).inc()
        if error_type:
            self.child(self.errors, model, error_type).inc()
        if ttft_s is not None:
            self.child(self.ttft, model).observe(ttft_s)
        self.child(self.duration, model).observe(total_s)
        self.child(self.tokens, model).inc(completion_tokens)
        self.child(self.input_tokens, model).inc(prompt_tokens)
        self.child(self.context_tokens, model).inc(decode_context_tokens(prompt_tokens, completion_tokens))
        self.child(self.cached_tokens, model).inc(cached_tokens)
        self.child(self.transferred_tokens, model).inc(transferred_tokens)

    def observe_refused(self, model: str, error_type: str) -> None:
        """A request refused before any worker took it (admission, rate limits, routing)."""
        self.child(self.requests, model, "error").inc()
        self.child(self.errors, model, error_type).inc()

    def observe_decision(self, model: str, mode: str, worker_id: str | None, seconds: float,
                         overlap_ratio: float | None) -> None:
        """One routing decision; ``overlap_ratio`` only for kv decisions."""
        self.child(self.decision_time, mode).observe(seconds)
        self.child(self.picks, model, worker_id or ANY_WORKER, mode).inc()
        if overlap_ratio is not None:
            self.child(self.overlap_ratio, model).observe(overlap_ratio)

    def observe_cluster(self, snapshot: ClusterSnapshot | None) -> None:
        """Set the gauges read from Redis (None: Redis did not answer; they are left out rather than stale),
        and drop the pick series of workers that are gone."""
        for gauge in (self.index_blocks, self.pool_queue, self.worker_queue):
            gauge.clear()
        if snapshot is None:
            return
        depth = snapshot.queue_messages
        for (model, pool), queue in snapshot.pool_queues().items():
            self.pool_queue.labels(model, pool).set(depth.get(queue, 0))
        index: dict[str, int] = {}
        for w in snapshot.workers:
            self.worker_queue.labels(w.record.worker_id).set(depth.get(w.record.queue, 0))
            index[w.record.model] = index.get(w.record.model, 0) + snapshot.index_blocks.get(w.record.worker_id, 0)
        for model, blocks in index.items():
            self.index_blocks.labels(model).set(blocks)
        live = {w.record.worker_id for w in snapshot.workers} | {ANY_WORKER}
        for key in [k for k in self._children if k[0] is self.picks and k[1][1] not in live]:
            self.picks.remove(*key[1])
            del self._children[key]
