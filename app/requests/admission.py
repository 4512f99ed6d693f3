"""Admission control: a bound on the requests each worker has waiting for their first token.

Every request this frontend routes counts against its worker until the worker's first token for it
(or its end); a worker at ``frontend.max_waiting_per_worker`` is taken out of routing, and a request
that finds every candidate worker at the bound is refused at once with 429 ``overloaded`` and
``Retry-After`` instead of queueing behind them for as long as its deadline (503 is kept for "no
worker lives"). A request that was let in still waits at most ``frontend.max_queue_wait_s`` for a
worker to take it (app/requests/generation.py), then gets the same 429 (``queue_timeout``).
A worker's count is the larger of this frontend's own (exact, immediate) and the worker's ``waiting``
as its last heartbeat published it (every frontend's requests it holds unstarted), so several frontends
share one bound per worker, to within a heartbeat.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from core.errors import Overloaded
from router.registry import LiveWorker


class Admission:
    def __init__(self, max_waiting_per_worker: int, retry_after_s: int) -> None:
        self.max_waiting = max_waiting_per_worker
        self.retry_after_s = retry_after_s
        self._waiting: collections.Counter[str] = collections.Counter()

    def open_workers(self, workers: Sequence[LiveWorker]) -> list[LiveWorker]:
        """The workers below the bound (all of them when admission control is off)."""
        if self.max_waiting <= 0:
            return list(workers)
        return [w for w in workers if self.count(w) < self.max_waiting]

    def count(self, worker: LiveWorker) -> int:
        """Requests waiting on ``worker``: this frontend's own, or every frontend's as the worker last
        reported them, whichever is larger."""
        return max(self._waiting[worker.record.worker_id], worker.load.waiting)

    def admit(self, model: str, workers: Sequence[LiveWorker]) -> list[LiveWorker]:
        """The workers a new request may go to; Overloaded when every one is at the bound."""
        open_ = self.open_workers(workers)
        if workers and not open_:
            raise Overloaded(
                f"every worker serving {model!r} has {self.max_waiting} requests waiting for their first token; "
                f"retry in {self.retry_after_s} s", retry_after_s=self.retry_after_s)
        return open_

    def waiting(self, worker_id: str) -> int:
        return self._waiting[worker_id]

    def total_waiting(self) -> int:
        return sum(self._waiting.values())

    def add(self, worker_id: str) -> None:
        self._waiting[worker_id] += 1

    def remove(self, worker_id: str) -> None:
        left = self._waiting[worker_id] - 1
        if left > 0:
            self._waiting[worker_id] = left
        else:
            del self._waiting[worker_id]
