"""What a request leaves behind: the timings taken as its stream goes (queue time, time to first
token, inter-token latency), and when it ends, its usage record (to the accounts), its log line and
its metrics, made from one :class:`Outcome`.

app.requests.generation drives a request; this module only watches it. Each attempt (the first, and each one
after a migration) restarts the queue clock: queue time is enqueue to the worker's "started" notice
(a worker's engine-side batch wait is not visible here and shows in TTFT).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.accounting import UsageRecord
from router.frontends import decode_context_tokens

if TYPE_CHECKING:
    from app.accounts.service import Principal
    from app.runtime import FrontendRuntime

#: One line per finished request (log_request).
request_log = logging.getLogger("sluice.requests")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended: what it used and who served it."""

    request_id: str
    model: str
    pool: str
    worker_ids: list[str]
    prompt_tokens: int
    cached_tokens: int
    transferred_tokens: int
    completion_tokens: int
    finish_reason: str | None
    error_type: str | None
    #: Whether the prompt is charged (a request with ``n`` > 1 charges it on one choice only).
    charge_prompt: bool = True
    user: str | None = None
    disagg_reason: str | None = None


class RequestObserver:
    def __init__(self, rt: FrontendRuntime, model: str, principal: Principal | None) -> None:
        self.rt = rt
        self.model = model
        self.principal = principal
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        #: When the first tokens arrived and when the last ones did (monotonic).
        self.t_first: float | None = None
        self.t_last: float | None = None
        #: When the first worker took the request (its wall clock, from the "started" notice).
        self.started_at: float | None = None
        self._itl = rt.metrics.child(rt.metrics.itl, model)
        self._enqueued_at = 0.0
        self._queue_timed = False
        self._gaps = 0
        self._load = rt.load_of(model)
        self._load.arrived += 1

    def enqueued(self) -> None:
        """An attempt was routed and enqueued now: its queue time counts from here."""
        self._enqueued_at = time.time()
        self._queue_timed = False

    def taken(self, started_at: float | None) -> None:
        """The current attempt's worker took it at ``started_at`` (None: not yet known)."""
        if started_at is None:
            return
        if self.started_at is None:
            self.started_at = started_at
        if not self._queue_timed:
            self._queue_timed = True
            self.rt.metrics.child(self.rt.metrics.queue_time, self.model).observe(
                max(0.0, started_at - self._enqueued_at))

    def tokens(self, n: int) -> None:
        """``n`` tokens arrived together now: each gap since the last ones is an inter-token latency."""
        now = time.monotonic()
        if self.t_last is None:
            self.t_first = now
        else:  # the gap since the last tokens, shared by the tokens that came together
            gap = (now - self.t_last) / n
            for _ in range(n):
                self._itl.observe(gap)
            self._gaps += n
        self.t_last = now

    def finish(self, outcome: Outcome) -> None:
        """The request ended: its usage record, log line and metrics."""
        end = time.monotonic()
        ttft = self.t_first - self.t0 if self.t_first is not None else None
        charged = outcome.charge_prompt
        record = UsageRecord(
            request_id=outcome.request_id, model=outcome.model,
            key_id=self.principal.key_id if self.principal else None, pool=outcome.pool,
            worker_ids=outcome.worker_ids,
            prompt_tokens=outcome.prompt_tokens if charged else 0,
            cached_tokens=outcome.cached_tokens if charged else 0,
            transferred_tokens=outcome.transferred_tokens if charged else 0,
            completion_tokens=outcome.completion_tokens,
            queue_time_s=(self.started_at - self.wall0) if self.started_at else None,
            ttft_s=ttft, total_s=end - self.t0,
            finish_reason=outcome.finish_reason, error_type=outcome.error_type, created_at=self.wall0)
        self.rt.accounts.finish(self.principal, record)
        log_request(record, outcome.user, outcome.disagg_reason)
        self._tally(outcome, ttft)
        self.rt.metrics.observe_finished(outcome.model, outcome.finish_reason, outcome.error_type, ttft,
                                         end - self.t0, outcome.completion_tokens, outcome.prompt_tokens,
                                         outcome.cached_tokens, outcome.transferred_tokens)

    def _tally(self, outcome: Outcome, ttft: float | None) -> None:
        """The request in its model's load counters (what the planner reads from the frontend's lease)."""
        load = self._load
        load.finished += 1
        load.input_tokens += outcome.prompt_tokens
        load.output_tokens += outcome.completion_tokens
        load.context_tokens += decode_context_tokens(outcome.prompt_tokens, outcome.completion_tokens)
        if ttft is not None:
            load.ttft_s += ttft
            load.ttft_n += 1
        if self._gaps and self.t_first is not None and self.t_last is not None:
            load.decode_s += self.t_last - self.t_first
            load.gaps += self._gaps


def log_request(record: UsageRecord, user: str | None = None, disagg_reason: str | None = None) -> None:
    """The request's one line on the frontend (``sluice.requests``, INFO): id, model, workers, status,
    tokens, TTFT and total time, and where a prefill pool serves the model why the prompt was or was
    not computed there (router.disagg); in JSON logs the same as fields."""
    status = record.error_type or record.finish_reason or "unknown"
    ttft = f"{record.ttft_s:.3f}" if record.ttft_s is not None else "-"
    request_log.info(
        "request %s model=%s worker=%s status=%s prompt_tokens=%d cached_tokens=%d transferred_tokens=%d "
        "completion_tokens=%d ttft_s=%s total_s=%.3f%s", record.request_id, record.model,
        ",".join(record.worker_ids) or "-", status, record.prompt_tokens, record.cached_tokens,
        record.transferred_tokens, record.completion_tokens, ttft, record.total_s,
        f' disagg="{disagg_reason}"' if disagg_reason else "",
        extra={"request_id": record.request_id, "model": record.model, "workers": record.worker_ids,
               "status": status, "prompt_tokens": record.prompt_tokens, "cached_tokens": record.cached_tokens,
               "transferred_tokens": record.transferred_tokens, "completion_tokens": record.completion_tokens,
               "ttft_s": record.ttft_s, "total_s": record.total_s,
               "key_id": record.key_id, "user": user, "disagg_reason": disagg_reason})
