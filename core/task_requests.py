"""The payload of a worker's Celery task: one message type per role, versioned, read in one place.

A request reaches a worker in one of four roles, each a msgspec struct with exactly the fields the
role needs, told apart on the wire by ``role``:

* :class:`GenerateRequest` (``generate``): serve the request from its prompt to its end.
* :class:`PrefillRequest` (``prefill``): compute the prompt and the first token, then hand the
  request to the decode worker ``decode`` (a ``decode`` message pushed onto its queue).
* :class:`DecodeRequest` (``decode``): continue a request a prefill worker handed off: read the
  prompt's KV through ``kv_handle``; ``token_ids`` already ends with the ``carried_tokens`` the
  prefill worker streamed.
* :class:`ResumeRequest` (``resume``): continue a request whose worker was lost; ``token_ids`` ends
  with the ``carried_tokens`` the client already has.

Versions. ``v`` is on every message (:data:`TASK_REQUEST_VERSION`, 2). Version 1 had one struct for
all roles, the role implied by which optional fields were set; its field names are the ones kept
here, so a version-1 worker still serves version-2 messages (it ignores ``role``), and
:func:`read_request` reads version-1 messages by version 1's own rule. Any other version, an unknown
role or a malformed message is refused with :class:`UnreadableRequest`, which names the request and
its reply channel where the message has them, so the worker can answer with an error event instead
of guessing (docs/architecture.md, "Rolling upgrades").
"""

from __future__ import annotations

from typing import Any

import msgspec

from core.messages import SamplingParams

TASK_REQUEST_VERSION = 2
#: The versions :func:`read_request` reads.
READABLE_VERSIONS = (1, TASK_REQUEST_VERSION)


class DecodeTarget(msgspec.Struct, frozen=True):
    worker_id: str
    queue: str


class RequestBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="role"):
    """What every role carries. Defaults are encoded too, so ``v`` is always on the wire."""

    request_id: str
    model: str
    token_ids: list[int]
    sampling: SamplingParams
    reply_channel: str
    deadline: float
    lora: str | None = None
    #: The frontend waiting for the request: workers drop it once that frontend's lease lapses.
    frontend_id: str | None = None
    v: int = TASK_REQUEST_VERSION

    @property
    def first_seq(self) -> int:
        """The ``seq`` of the first token this task streams (tokens carried in come before it)."""
        return 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids) - self.first_seq


class GenerateRequest(RequestBase, frozen=True, kw_only=True, tag="generate"):
    pass


class PrefillRequest(RequestBase, frozen=True, kw_only=True, tag="prefill"):
    #: Where the decode task goes once the prompt is computed.
    decode: DecodeTarget


class DecodeRequest(RequestBase, frozen=True, kw_only=True, tag="decode"):
    #: The engine's transfer handle (opaque; vLLM's ``kv_transfer_params``).
    kv_handle: dict[str, Any]
    #: The worker holding the prompt's KV until this one has read it (told by a ``kv_release``).
    prefill_worker_id: str
    #: How many generated tokens ``token_ids`` ends with (the first token, streamed by the prefill worker).
    carried_tokens: int

    @property
    def first_seq(self) -> int:
        return self.carried_tokens


class ResumeRequest(RequestBase, frozen=True, kw_only=True, tag="resume"):
    #: How many generated tokens ``token_ids`` ends with (streamed by the lost worker).
    carried_tokens: int

    @property
    def first_seq(self) -> int:
        return self.carried_tokens


TaskRequest = GenerateRequest | PrefillRequest | DecodeRequest | ResumeRequest
_BY_ROLE: dict[str, type[TaskRequest]] = {
    str(cls.__struct_config__.tag): cls for cls in (GenerateRequest, PrefillRequest, DecodeRequest, ResumeRequest)}


class UnreadableRequest(Exception):
    """A task message this worker cannot read. ``request_id``/``reply_channel``/``first_seq``: what the
    message says of them, where it says it, so the worker can answer the frontend."""

    def __init__(self, reason: str, data: object) -> None:
        super().__init__(reason)
        self.reason = reason
        fields = data if isinstance(data, dict) else {}
        self.request_id = _text(fields.get("request_id"))
        self.reply_channel = _text(fields.get("reply_channel"))
        self.prefill_worker_id = _text(fields.get("prefill_worker_id"))
        carried = fields.get("carried_tokens", 0)
        self.first_seq = carried if isinstance(carried, int) and carried >= 0 else 0


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def request_to_builtins(req: TaskRequest) -> dict[str, Any]:
    """The task argument as plain JSON-able data (what the Celery message body carries)."""
    data: dict[str, Any] = msgspec.to_builtins(req)
    return data


def read_request(data: object) -> TaskRequest:
    """The task argument as its role's message; raises :class:`UnreadableRequest` for a version or
    role this code does not know, or a message that does not fit its role."""
    if not isinstance(data, dict):
        raise UnreadableRequest(f"a task request is a JSON object, not {type(data).__name__}", data)
    version = data.get("v", 1)
    if version == 1:
        data = {**data, "role": _v1_role(data), "v": TASK_REQUEST_VERSION}
    elif version not in READABLE_VERSIONS:
        raise UnreadableRequest(f"task request version {version!r} is unknown to this worker, which reads "
                                f"versions {', '.join(map(str, READABLE_VERSIONS))}", data)
    role = data.get("role")
    cls = _BY_ROLE.get(role) if isinstance(role, str) else None
    if cls is None:
        raise UnreadableRequest(f"task request role {role!r} is unknown to this worker, which serves "
                                f"{', '.join(_BY_ROLE)}", data)
    try:  # by its class, not the union: msgspec resolves a union afresh on every call (8 µs against 0.7)
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        raise UnreadableRequest(f"unreadable task request: {exc}", data) from None


def _v1_role(data: dict[str, Any]) -> str:
    """Version 1's rule: a ``decode`` target makes a prefill, a transfer handle a hand-off, carried
    tokens without one a resumed request."""
    if data.get("decode") is not None:
        return "prefill"
    if data.get("kv_handle") is not None:
        return "decode"
    if data.get("carried_tokens"):
        return "resume"
    return "generate"
