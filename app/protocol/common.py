"""Pieces shared by the chat and completions schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

MAX_STOP_STRINGS = 16
#: Integers the engines and the wire (msgpack, int64) can carry: seeds are signed 64-bit (what
#: torch's generators take), token ids and token counts 31-bit.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT31_MAX = 2**31 - 1


def _valid_unicode(text: str) -> str:
    """JSON can spell a lone UTF-16 surrogate (``"\\ud800"``); no tokenizer can encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text is not valid Unicode (it holds a lone surrogate)") from None
    return text


#: Client text: any string that is valid Unicode.
Text = Annotated[str, AfterValidator(_valid_unicode)]
#: A token id, and a token count (no JSON booleans or floats pass as integers).
TokenId = Annotated[StrictInt, Field(ge=0, le=INT31_MAX)]
TokenCount = Annotated[StrictInt, Field(ge=1, le=INT31_MAX)]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


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
    n: Annotated[StrictInt, Field(ge=1, le=128)] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = None
    seed: Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    user: Text | None = None
    # vLLM-style extensions
    ignore_eos: StrictBool = False
    min_tokens: Annotated[StrictInt, Field(ge=0, le=INT31_MAX)] = 0
    stop_token_ids: list[TokenId] | None = None
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
