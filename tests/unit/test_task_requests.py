"""Task requests: one message per role, the version checked on read, and both directions of a
rolling upgrade against version 1's message as it was."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from core.messages import SamplingParams
from core.task_requests import (
    TASK_REQUEST_VERSION,
    DecodeRequest,
    DecodeTarget,
    GenerateRequest,
    PrefillRequest,
    ResumeRequest,
    TaskRequest,
    UnreadableRequest,
    read_request,
    request_to_builtins,
)


class V1DecodeTarget(msgspec.Struct, frozen=True):
    worker_id: str
    queue: str


class V1GenerateRequest(msgspec.Struct, frozen=True, omit_defaults=True):
    """Version 1's task request, exactly as version-1 workers and frontends declare it."""

    request_id: str
    model: str
    token_ids: list[int]
    sampling: SamplingParams
    reply_channel: str
    deadline: float
    lora: str | None = None
    decode: V1DecodeTarget | None = None
    kv_handle: dict[str, Any] | None = None
    prefill_worker_id: str | None = None
    carried_tokens: int = 0
    frontend_id: str | None = None
    v: int = 1


COMMON: dict[str, Any] = dict(request_id="r1", model="m", token_ids=[1, 2, 3, 4], reply_channel="ch",
                              deadline=123.5, lora="ad", frontend_id="f1",
                              sampling=SamplingParams(max_tokens=7, temperature=0.0, logprobs=2))

ROLES: list[tuple[TaskRequest, V1GenerateRequest]] = [
    (GenerateRequest(**COMMON), V1GenerateRequest(**COMMON)),
    (PrefillRequest(**COMMON, decode=DecodeTarget("d1", "q.d1")),
     V1GenerateRequest(**COMMON, decode=V1DecodeTarget("d1", "q.d1"))),
    (DecodeRequest(**COMMON, kv_handle={"remote_block_ids": [3]}, prefill_worker_id="p1", carried_tokens=1),
     V1GenerateRequest(**COMMON, kv_handle={"remote_block_ids": [3]}, prefill_worker_id="p1", carried_tokens=1)),
    (DecodeRequest(**COMMON, kv_handle={}, prefill_worker_id="p1", carried_tokens=1),  # an engine with no handle
     V1GenerateRequest(**COMMON, kv_handle={}, prefill_worker_id="p1", carried_tokens=1)),
    (ResumeRequest(**COMMON, carried_tokens=2), V1GenerateRequest(**COMMON, carried_tokens=2)),
]


def json_round_trip(data: dict) -> dict:
    """What a worker's Celery task receives: the argument after JSON."""
    return msgspec.json.decode(msgspec.json.encode(data))


@pytest.mark.parametrize(("message", "_v1"), ROLES)
def test_each_role_reads_back_as_itself_with_its_version_on_the_wire(message: TaskRequest, _v1: object) -> None:
    wire = json_round_trip(request_to_builtins(message))
    assert wire["v"] == TASK_REQUEST_VERSION and wire["role"] in ("generate", "prefill", "decode", "resume")
    assert read_request(wire) == message


@pytest.mark.parametrize(("message", "v1"), ROLES)
def test_an_old_worker_reads_a_new_message_as_the_same_request(message: TaskRequest, v1: V1GenerateRequest) -> None:
    old = msgspec.convert(json_round_trip(request_to_builtins(message)), V1GenerateRequest)
    assert msgspec.structs.replace(old, v=1) == v1


@pytest.mark.parametrize(("message", "v1"), ROLES)
def test_a_new_worker_reads_an_old_message_by_version_ones_rule(message: TaskRequest, v1: V1GenerateRequest) -> None:
    wire = json_round_trip(msgspec.to_builtins(v1))
    assert "v" not in wire and "role" not in wire  # version 1 left its defaults out
    assert read_request(wire) == message


def test_first_seq_counts_the_tokens_carried_in() -> None:
    assert [(m.first_seq, m.prompt_tokens) for m, _ in ROLES] == [(0, 4), (0, 4), (1, 3), (1, 3), (2, 2)]


@pytest.mark.parametrize(("change", "reason"), [
    ({"v": 3}, "version 3 is unknown"),
    ({"v": "2"}, "version '2' is unknown"),
    ({"role": "speculate"}, "role 'speculate' is unknown"),
    ({"role": None}, "role None is unknown"),
    ({"role": "prefill"}, "missing required field `decode`"),
    ({"token_ids": "1 2 3"}, "Expected `array`"),
])
def test_an_unknown_version_or_role_or_a_misshapen_message_is_refused_naming_where_to_answer(
        change: dict, reason: str) -> None:
    wire = {**json_round_trip(request_to_builtins(ROLES[4][0])), **change}
    with pytest.raises(UnreadableRequest) as refused:
        read_request(wire)
    assert reason in refused.value.reason
    assert (refused.value.request_id, refused.value.reply_channel, refused.value.first_seq) == ("r1", "ch", 2)


def test_a_refusal_of_a_hand_off_names_the_prefill_worker_holding_its_kv() -> None:
    wire = {**json_round_trip(request_to_builtins(ROLES[2][0])), "v": 9}
    with pytest.raises(UnreadableRequest) as refused:
        read_request(wire)
    assert refused.value.prefill_worker_id == "p1"


@pytest.mark.parametrize("data", [[1, 2], "r1", {"v": 2}, {"request_id": 5, "reply_channel": None, "carried_tokens": -1}])
def test_a_message_without_a_reply_channel_is_refused_with_nothing_to_answer(data: object) -> None:
    with pytest.raises(UnreadableRequest) as refused:
        read_request(data)
    assert (refused.value.request_id, refused.value.reply_channel, refused.value.first_seq) == (None, None, 0)
