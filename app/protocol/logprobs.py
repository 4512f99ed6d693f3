"""Log probabilities in OpenAI's shapes (filled by app.output.logprobs)."""

from __future__ import annotations

import msgspec


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[ChatTokenLogprob]


class CompletionLogprobs(msgspec.Struct):
    """An echoed prompt's first token has no logprob: ``null`` in ``token_logprobs`` and ``top_logprobs``."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]

    def __add__(self, other: CompletionLogprobs) -> CompletionLogprobs:
        return CompletionLogprobs(self.tokens + other.tokens, self.token_logprobs + other.token_logprobs,
                                  self.top_logprobs + other.top_logprobs, self.text_offset + other.text_offset)
