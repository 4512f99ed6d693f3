"""What a worker is running, shared by its request runner (workers.request_runner), its control
channel (workers.control) and its lifecycle (workers.host); all on the engine loop's thread."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from core.messages import ErrorInfo

#: How many cancels for requests not (yet) running a worker remembers.
EARLY_CANCELS_MAX = 4096


@dataclass
class RunningRequests:
    #: The task serving each running request, by its wire id.
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    #: The frontend of each running request (those that name one).
    frontend_of: dict[str, str] = field(default_factory=dict)
    #: When each running request started (monotonic seconds).
    started_at: dict[str, float] = field(default_factory=dict)
    #: Requests this worker stopped on its own, with the error each ends with instead of a finish: at the
    #: drain deadline ``worker_draining``; its lease lapsed, or their frontend's lease is gone, ``worker_lost``
    #: (a frontend that still reads them moves them on).
    stopped: dict[str, ErrorInfo] = field(default_factory=dict)
    #: Cancels that came before their request's task (most recent last).
    early_cancels: OrderedDict[str, None] = field(default_factory=OrderedDict)
    #: Taking no new request (SIGTERM or the ``drain`` command).
    draining: bool = False

    def ids(self) -> list[str]:
        return list(self.tasks)

    def started_before(self, moment: float) -> list[str]:
        """The running requests that started before ``moment`` (monotonic seconds)."""
        return [r for r in self.tasks if self.started_at.get(r, 0.0) < moment]

    def remember_cancel(self, request_id: str) -> None:
        """A cancel for a request not running here (yet): its task, if it comes, ends at once."""
        self.early_cancels[request_id] = None
        while len(self.early_cancels) > EARLY_CANCELS_MAX:
            self.early_cancels.popitem(last=False)

    def take_cancel(self, request_id: str) -> bool:
        """Whether a cancel came for ``request_id`` before it started (forgotten once asked)."""
        return self.early_cancels.pop(request_id, False) is None

    def started(self, request_id: str, task: asyncio.Task[None] | None, frontend_id: str | None) -> None:
        if task is not None:
            self.tasks[request_id] = task
            self.started_at[request_id] = time.monotonic()
        if frontend_id:
            self.frontend_of[request_id] = frontend_id

    def ended(self, request_id: str) -> None:
        self.tasks.pop(request_id, None)
        self.frontend_of.pop(request_id, None)
        self.started_at.pop(request_id, None)
        self.stopped.pop(request_id, None)
