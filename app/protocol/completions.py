"""``/v1/completions`` request and response shapes."""

from __future__ import annotations

from typing import Annotated, Any, cast

import msgspec
from pydantic import Discriminator, Field, Strict, Tag, model_validator

from app.protocol.common import SamplingFields, UsageInfo
from app.protocol.fields import Flag, Text, TokenCount, TokenId
from app.protocol.logprobs import CompletionLogprobs


def _prompt_shape(prompt: Any) -> str | None:
    """Which of the prompt's shapes ``prompt`` is, told from its type and its first item: only that
    shape is then validated (a union would try each: for a long list of token ids, a list of
    strings first, with an error per id)."""
    if isinstance(prompt, str):
        return "text"
    if not isinstance(prompt, list):
        return None
    first = prompt[0] if prompt else 0
    return "texts" if isinstance(first, str) else "token_id_lists" if isinstance(first, list) else "token_ids"


Prompt = Annotated[
    Annotated[Text, Tag("text")]
    | Annotated[list[Text], Field(min_length=1), Tag("texts")]
    | Annotated[list[TokenId], Field(min_length=1), Tag("token_ids")]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1), Tag("token_id_lists")],
    Discriminator(_prompt_shape, custom_error_type="prompt_type",
                  custom_error_message="prompt must be a string, a list of strings, a list of token ids "
                                       "or a list of lists of token ids"),
]


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: TokenCount | None = 16
    echo: Flag = False
    logprobs: Annotated[int, Strict(), Field(ge=0, le=5)] | None = None
    suffix: Text | None = None
    best_of: Annotated[int, Strict(), Field(ge=1, le=128)] | None = None

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of not in (None, 1, self.n):
            raise ValueError("best_of other than n is not supported")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):  # one prompt of token ids
            return [cast(list[int], p)]
        return list(cast(list[str] | list[list[int]], p))


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
