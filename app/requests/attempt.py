"""One attempt at serving a request: the first, then one per migration (app.requests.generation).

An attempt has its own id on the wire (the request id, then ``<request id>-r<n>``), so a lost worker
that comes back cannot write into a later attempt's stream; its own stream; the workers its route
named; and the moment it was enqueued, from which its queue-wait limit counts.

Who serves the request *now* is one field, the stream's ``worker_id`` (:attr:`Attempt.serving`): the
prefill worker until its first token, then the decode (or aggregated) worker; in pool mode the
worker that took the task, from its first delta. Lease judgments, the "still computing the prompt"
check and migration all read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from core.keys import Keys
from core.messages import ControlCommand

if TYPE_CHECKING:
    from app.requests.streams import RequestStream
    from router.request_plan import RequestPlan


class ControlSender(Protocol):
    """What an attempt needs of the frontend's runtime to reach its workers (app.runtime)."""

    keys: Keys

    def send_control(self, channel: str, command: ControlCommand) -> None: ...


@dataclass(eq=False, slots=True)
class Attempt:
    #: The id this attempt carries on the wire: tasks, deltas, cancels, the router's prediction.
    wire_id: str
    stream: RequestStream
    #: The worker the route named to serve (decode or aggregated); None in pool mode, where any worker
    #: of the pool takes the task.
    routed_to: str | None = None
    #: Disaggregated: the prefill worker computing the prompt for ``routed_to``.
    prefill_worker: str | None = None
    #: When the attempt was enqueued (monotonic): the queue-wait limit counts from it.
    queued_since: float = field(default_factory=time.monotonic)
    #: No token has come yet.
    awaiting_first: bool = True

    def follow(self, plan: RequestPlan) -> None:
        """Point the attempt at the workers its plan named: the prefill worker serves the stream until
        its first token, the decode worker after it; without one, the serving worker from the start."""
        self.routed_to = plan.serving.worker_id
        if plan.prefill is not None:
            self.prefill_worker = self.stream.worker_id = plan.prefill.worker_id
            self.stream.handoff_to = plan.serving.worker_id
        elif self.stream.worker_id is None:
            self.stream.worker_id = plan.serving.worker_id

    @property
    def serving(self) -> str | None:
        """The worker serving the request now (None in pool mode until a worker takes it)."""
        return self.stream.worker_id

    @property
    def server(self) -> str | None:
        """The worker that generates the answer: the routed one, or in pool mode the one that took it
        (what the ``x-sluice-worker`` header and the usage record name)."""
        return self.routed_to or self.stream.worker_id

    def workers(self) -> list[str]:
        """Every worker this attempt may be running on, each once."""
        return [w for w in dict.fromkeys((self.prefill_worker, self.serving, self.routed_to)) if w]

    def cancel(self, rt: ControlSender) -> None:
        """Tell every worker of the attempt to drop it (fire and forget; each frees its KV). Before any
        worker is known (pool mode, not taken yet) the cancel is broadcast: whichever takes it drops it."""
        cancel = ControlCommand("cancel", self.wire_id)
        workers = self.workers()
        if not workers:
            rt.send_control(rt.keys.control_broadcast, cancel)
        for worker in workers:
            rt.send_control(rt.keys.control_channel(worker), cancel)

    def release_prefill(self, rt: ControlSender) -> None:
        """A prefill worker frees the blocks it holds for this attempt now instead of at its hold's end."""
        if self.prefill_worker:
            rt.send_control(rt.keys.control_channel(self.prefill_worker), ControlCommand("kv_release", self.wire_id))
