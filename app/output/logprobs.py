"""Log probabilities in OpenAI's shapes, from the engines' (core.messages.TokenLogprob).

Chat (``logprobs: true, top_logprobs: k``): ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}]}]}``. Completions (``logprobs: k``):
``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``. A token's
text is what the tokenizer decodes it to alone (special tokens included); ``bytes`` its UTF-8.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.model_card import ModelCard
from app.protocol.logprobs import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from core.messages import TokenLogprob

Entries = Sequence[tuple[int, TokenLogprob]]
#: A prompt's: its first token has none.
PromptEntries = Sequence[tuple[int, TokenLogprob | None]]


def token_text(card: ModelCard, token_id: int) -> str:
    return card.tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprobs(card: ModelCard, entries: Entries) -> ChatLogprobs:
    def top(token_id: int, logprob: float) -> TopLogprob:
        text = token_text(card, token_id)
        return TopLogprob(text, logprob, list(text.encode()))

    content = []
    for token_id, lp in entries:
        text = token_text(card, token_id)
        content.append(ChatTokenLogprob(text, lp.logprob, list(text.encode()), [top(t, v) for t, v in lp.top]))
    return ChatLogprobs(content)


def completion_logprobs(card: ModelCard, entries: PromptEntries, offset: int) -> CompletionLogprobs:
    """``offset``: where the first entry's text starts in the choice's text (the echo, and the
    text of earlier chunks, come before it)."""
    tokens, offsets = [], []
    for token_id, _ in entries:
        text = token_text(card, token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(tokens, [lp.logprob if lp is not None else None for _, lp in entries],
                              [{token_text(card, t): v for t, v in lp.top} if lp is not None else None
                               for _, lp in entries], offsets)
