"""An attempt's workers and the cancels it sends: who serves it now follows its stream."""

from __future__ import annotations

from app.requests.attempt import Attempt
from app.requests.streams import RequestStream
from core.keys import Keys
from core.messages import ControlCommand, TokenDelta
from router.policies import RouteDecision
from router.request_plan import RequestPlan


class Sent:
    """Records the control commands an attempt sends (the runtime publishes them on Redis)."""

    def __init__(self) -> None:
        self.keys = Keys("t")
        self.commands: list[tuple[str, ControlCommand]] = []

    def send_control(self, channel: str, command: ControlCommand) -> None:
        self.commands.append((channel, command))


def test_a_disaggregated_attempt_is_served_by_the_prefill_worker_until_its_first_token() -> None:
    stream = RequestStream("r1", None)
    attempt = Attempt("r1", stream)
    attempt.follow(RequestPlan(RouteDecision("d1", "q.d1"), prefill=RouteDecision("p1", "q.p1")))
    assert attempt.serving == "p1" and attempt.server == "d1" and attempt.prefill_worker == "p1"
    stream._push(TokenDelta("r1", 0, [7], worker_id="p1"))
    assert attempt.serving == "d1" and attempt.workers() == ["p1", "d1"]


def test_cancels_reach_every_worker_of_the_attempt_once_and_the_prefill_worker_frees_its_blocks() -> None:
    stream = RequestStream("r1-r1", "d1")
    attempt = Attempt("r1-r1", stream, routed_to="d1", prefill_worker="p1")
    sent = Sent()
    attempt.cancel(sent)
    attempt.release_prefill(sent)
    keys = sent.keys
    assert sent.commands == [(keys.control_channel("p1"), ControlCommand("cancel", "r1-r1")),
                             (keys.control_channel("d1"), ControlCommand("cancel", "r1-r1")),
                             (keys.control_channel("p1"), ControlCommand("kv_release", "r1-r1"))]


def test_an_aggregated_attempt_is_served_by_its_routed_worker_from_the_start() -> None:
    attempt = Attempt("r3", RequestStream("r3", None))
    attempt.follow(RequestPlan(RouteDecision("w1", "q.w1")))
    assert attempt.serving == attempt.server == attempt.routed_to == "w1" and attempt.prefill_worker is None


def test_a_pool_attempt_not_taken_yet_broadcasts_its_cancel_and_names_its_worker_once_taken() -> None:
    stream = RequestStream("r2", None)
    attempt = Attempt("r2", stream)
    sent = Sent()
    attempt.cancel(sent)
    assert sent.commands == [(sent.keys.control_broadcast, ControlCommand("cancel", "r2"))]
    attempt.release_prefill(sent)
    assert len(sent.commands) == 1
    stream._push(TokenDelta("r2", 0, [1], worker_id="w3"))
    assert attempt.serving == attempt.server == "w3"
