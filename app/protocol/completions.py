"""``/v1/completions`` request and response shapes."""

from __future__ import annotations

from typing import Annotated

import msgspec
from pydantic import Field, StrictBool, StrictInt, model_validator

from app.protocol.common import SamplingFields, Text, TokenCount, TokenId, UsageInfo


class CompletionRequest(SamplingFields):
    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    max_tokens: TokenCount | None = 16
    echo: StrictBool = False
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    suffix: Text | None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=128)] | None = None

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.logprobs is not None:
            raise ValueError("logprobs are not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of not in (None, 1, self.n):
            raise ValueError("best_of other than n is not supported")
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ValueError("prompt must not be empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
