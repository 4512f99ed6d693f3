"""``/v1/completions`` request and response shapes."""

from __future__ import annotations

from typing import Annotated

import msgspec
from pydantic import Field, model_validator

from app.protocol.common import SamplingFields, UsageInfo


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

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
