"""Messages that cross process boundaries, as versioned msgspec structs, encoded in one place.

* A worker task's payload (JSON, so Flower shows it) is in core.task_requests, one message per role.
* :class:`TokenDelta` goes from a worker to the frontend on the frontend's token channel (msgpack).
* :class:`ControlCommand` goes from a frontend to a worker on its control channel (msgpack).

A delta stream for one request is: deltas with ``seq`` 0, 1, 2, ... in order; the last one has
``finish_reason`` set (and ``usage``), or ``error`` set. Nothing follows the last one.
"""

from __future__ import annotations

from typing import Literal

import msgspec

MESSAGE_VERSION = 1

FinishReason = Literal["stop", "length", "abort", "error"]


#: What an engine may be able to do beyond plain generation (registered with its worker).
#: ``structured_outputs``: output constrained to a JSON schema, JSON, a regex, a choice or a grammar.
#: ``lora``: LoRA adapters loaded and unloaded at run time (``load_lora``/``unload_lora`` commands).
Feature = Literal["structured_outputs", "lora"]
STRUCTURED_OUTPUTS: Feature = "structured_outputs"
LORA: Feature = "lora"


class StructuredOutput(msgspec.Struct, frozen=True, omit_defaults=True):
    """A constraint on the output (one of them): a JSON schema (as JSON text), any JSON object, a
    regular expression, one of ``choice``, or an EBNF ``grammar``."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True):
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    #: 0: every token (vLLM's -1).
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    #: (token id, bias) pairs, sorted by id (a list, since JSON task messages have only string keys).
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: Log probabilities to return: None, none; k, the chosen token's and the k most likely (0..20).
    logprobs: int | None = None
    structured: StructuredOutput | None = None
    #: The prompt's log probabilities (``echo`` with ``logprobs``): None, none; k, as ``logprobs``.
    prompt_logprobs: int | None = None


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    #: Prompt tokens whose KV arrived from a prefill worker instead of being computed here.
    transferred_tokens: int = 0


class ErrorInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """``type`` follows OpenAI's error types where one fits (``invalid_request_error``);
    otherwise it names what failed (``engine_error``, ``worker_lost``, ``timeout``...)."""

    type: str
    message: str
    code: str | None = None


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """A generated token's log probability, and the most likely tokens at its position (``top``:
    (token id, log probability) pairs, most likely first)."""

    logprob: float
    top: list[tuple[int, float]] = []


class TokenDelta(msgspec.Struct, frozen=True, omit_defaults=True):
    request_id: str
    seq: int
    token_ids: list[int] = []
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: ErrorInfo | None = None
    worker_id: str | None = None
    started_at: float | None = None
    #: With ``sampling.logprobs``: one per token of ``token_ids``.
    logprobs: list[TokenLogprob] | None = None
    #: With ``sampling.prompt_logprobs``, on the first token's delta: one per prompt token (the
    #: first None: nothing comes before it).
    prompt_logprobs: list[TokenLogprob | None] | None = None
    v: int = MESSAGE_VERSION

    @property
    def is_last(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    @property
    def is_start(self) -> bool:
        """The worker's "started" notice: no token, not the end; it names the worker and when it
        took the request, and does not use up a ``seq`` (its ``seq`` is the first token's)."""
        return not self.token_ids and not self.is_last and self.started_at is not None


class ControlCommand(msgspec.Struct, frozen=True, omit_defaults=True):
    """A command to one worker (or every worker, on the broadcast channel), fire and forget.

    ``cancel`` aborts ``request_id`` (remembered if its task has not started yet); ``clear_kv``
    drops the engine's unused cached blocks; ``kv_release`` (decode worker to prefill worker) says
    the blocks held for ``request_id``'s transfer may go; ``drain`` takes the worker out of routing
    and, at its drain deadline, moves what still runs elsewhere, as SIGTERM does, without exiting.
    ``load_lora``/``unload_lora`` load the adapter ``lora_name`` from ``lora_path`` (or drop it) and
    push a :class:`LoraAck` onto the Redis list ``reply_key``.
    """

    op: Literal["cancel", "clear_kv", "drain", "kv_release", "load_lora", "unload_lora"]
    request_id: str | None = None
    lora_name: str | None = None
    lora_path: str | None = None
    reply_key: str | None = None
    v: int = MESSAGE_VERSION


class LoraAck(msgspec.Struct, frozen=True):
    """A worker's answer to ``load_lora``/``unload_lora``: done, or why not."""

    worker_id: str
    ok: bool
    error: str = ""
    code: str = ""


_delta_encoder = msgspec.msgpack.Encoder()
_delta_decoder = msgspec.msgpack.Decoder(TokenDelta)
_control_decoder = msgspec.msgpack.Decoder(ControlCommand)


_deltas_decoder = msgspec.msgpack.Decoder(list[TokenDelta])


def encode_delta(delta: TokenDelta) -> bytes:
    return _delta_encoder.encode(delta)


def join_deltas(encoded: list[bytes]) -> bytes:
    """One message carrying several encoded deltas, in order: a msgpack array of them, built from
    their bytes without decoding (:func:`decode_deltas` reads it)."""
    n = len(encoded)
    if n < 16:
        header = bytes((0x90 | n,))
    elif n < 1 << 16:
        header = b"\xdc" + n.to_bytes(2, "big")
    else:
        header = b"\xdd" + n.to_bytes(4, "big")
    return header + b"".join(encoded)


def decode_deltas(data: bytes) -> list[TokenDelta]:
    """The deltas of one token-channel message: a single delta (a msgpack map), or several
    (:func:`join_deltas`)."""
    first = data[0] if data else 0
    if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
        return _deltas_decoder.decode(data)
    return [_delta_decoder.decode(data)]


def encode_control(cmd: ControlCommand) -> bytes:
    return _delta_encoder.encode(cmd)


def decode_control(data: bytes) -> ControlCommand:
    return _control_decoder.decode(data)


# --- KV cache events ---------------------------------------------------------------------------
# A tagged union of small structs: what an engine reports about its prefix cache, in Sluice block
# hashes (router.hashing). Batches carry a per-worker, strictly increasing event id.


#: Where a block is held: the engine's own cache, or a KV tier below it (workers.kvbm).
KvTier = Literal["device", "host", "disk", "shared"]


class BlockStored(msgspec.Struct, frozen=True, tag="stored", omit_defaults=True):
    """Full blocks entered the prefix cache (or the tier ``tier``); ``block_hashes`` in chain order, the
    first one's parent is ``parent_hash`` (None at the root of a chain)."""

    block_hashes: list[int]
    parent_hash: int | None = None
    tier: KvTier = "device"


class BlockRemoved(msgspec.Struct, frozen=True, tag="removed", omit_defaults=True):
    block_hashes: list[int]
    tier: KvTier = "device"


class AllBlocksCleared(msgspec.Struct, frozen=True, tag="cleared"):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventBatch(msgspec.Struct, frozen=True):
    worker_id: str
    event_id: int
    events: list[KvEvent]
    v: int = MESSAGE_VERSION


_kv_encoder = msgspec.msgpack.Encoder()
_kv_decoder = msgspec.msgpack.Decoder(KvEventBatch)


def encode_kv_batch(batch: KvEventBatch) -> bytes:
    return _kv_encoder.encode(batch)


def decode_kv_batch(data: bytes) -> KvEventBatch:
    return _kv_decoder.decode(data)
