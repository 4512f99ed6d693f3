"""Pieces shared by the chat and completions schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from app.protocol.fields import (
    INT32_MAX,
    Flag,
    NonEmptyText,
    Number,
    Seed,
    Text,
    TokenId,
    valid_unicode,
)
from app.protocol.structured import StructuredOutputsRequest

MAX_STOP_STRINGS = 16


class StreamOptions(BaseModel):
    include_usage: Flag = False
    continuous_usage_stats: Flag = False


class RouterExtension(BaseModel):
    """Sluice's per-request routing knobs (also settable with the ``x-sluice-router`` header)."""

    model_config = ConfigDict(extra="forbid")
    mode: Text | None = None
    #: The ``kv`` mode's cost: ``time`` (predicted time to first token) or ``blocks``.
    cost: Literal["time", "blocks"] | None = None
    overlap_score_weight: Annotated[Number, Field(ge=0)] | None = None
    temperature: Annotated[Number, Field(ge=0)] | None = None
    worker_id: Text | None = None
    disagg: Literal["auto", "on", "off"] | None = None
    disagg_min_tokens: Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)] | None = None
    disagg_min_ratio: Annotated[Number, Field(ge=0, le=1)] | None = None
    #: How many times the request may move to another worker when its own is lost (at most the
    #: deployment's ``frontend.max_migrations``; 0: never).
    max_migrations: Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)] | None = None


class SluiceExtension(BaseModel):
    model_config = ConfigDict(extra="forbid")
    router: RouterExtension | None = None


class SamplingFields(BaseModel):
    """Sampling fields common to both endpoints, with OpenAI's ranges (and types: see
    app.protocol.fields), and vLLM's extensions; every one reaches the engine (app.requests.generation.sampling_from)."""

    model_config = ConfigDict(extra="allow")

    model: NonEmptyText
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Strict(), Field(ge=1, le=128)] = 1
    stream: Flag = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    #: Token id (a JSON object key, so a string of digits) to a bias.
    logit_bias: dict[Annotated[int, Field(ge=0, le=INT32_MAX)], Annotated[Number, Field(ge=-100, le=100)]] | None = None
    user: Text | None = None
    # vLLM-style extensions
    top_k: Annotated[int, Strict(), Field(ge=-1, le=INT32_MAX)] | None = None
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[Number, Field(gt=0, le=2)] | None = None
    ignore_eos: Flag = False
    min_tokens: Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)] = 0
    stop_token_ids: list[TokenId] | None = None
    # vLLM's structured outputs (app.output.structured): one constraint
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: NonEmptyText | None = None
    guided_choice: Annotated[list[NonEmptyText], Field(min_length=1)] | None = None
    guided_grammar: NonEmptyText | None = None
    sluice: SluiceExtension | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        return [valid_unicode(s) for s in stops]

    def stop_strings(self) -> list[str]:
        return list(self.stop or [])


class PromptTokensDetails(msgspec.Struct):
    """``cached_tokens`` (OpenAI's field): prompt tokens the serving worker found in its own prefix
    cache. ``transferred_tokens`` (Sluice's): prompt tokens whose KV it read from a prefill worker
    (disaggregated serving). The two never overlap; the rest of the prompt was computed there."""

    cached_tokens: int = 0
    transferred_tokens: int = 0


class UsageInfo(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


def make_usage(prompt: int, completion: int, cached: int, transferred: int = 0) -> UsageInfo:
    return UsageInfo(prompt, completion, prompt + completion, PromptTokensDetails(cached, transferred))


_encoder = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)
