"""Pieces shared by the chat and completions schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 16


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class RouterExtension(BaseModel):
    """Sluice's per-request routing knobs (also settable with the ``x-sluice-router`` header)."""

    model_config = ConfigDict(extra="forbid")
    mode: str | None = None
    overlap_score_weight: Annotated[float, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    worker_id: str | None = None
    disagg: Literal["auto", "on", "off"] | None = None
    disagg_min_tokens: Annotated[int, Field(ge=0)] | None = None
    disagg_min_ratio: Annotated[float, Field(ge=0, le=1)] | None = None


class SluiceExtension(BaseModel):
    model_config = ConfigDict(extra="forbid")
    router: RouterExtension | None = None


class SamplingFields(BaseModel):
    """Sampling fields common to both endpoints, with OpenAI's ranges."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    user: str | None = None
    # vLLM-style extensions
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
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
        return stops

    def stop_strings(self) -> list[str]:
        return list(self.stop or [])  # type: ignore[arg-type]


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class UsageInfo(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


def make_usage(prompt: int, completion: int, cached: int) -> UsageInfo:
    return UsageInfo(prompt, completion, prompt + completion, PromptTokensDetails(cached))


_encoder = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)
