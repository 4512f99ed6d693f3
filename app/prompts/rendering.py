"""Turning API requests into prompt token ids (chat template + tokenizer of the model card).

A prompt that cannot fit the model's context is refused (400 ``context_length_exceeded``, ``param``
naming the request's prompt field) as soon as that is known: from its length in characters before
it is rendered or tokenized (:attr:`ModelCard.max_prompt_chars`), then from its tokens. So the
work spent on a prompt is bounded by the context, not by the body. Long inputs are rendered and
tokenized on the model card's tokenizing thread, one at a time in arrival order
(:meth:`ModelCard.off_loop`); tokenizing releases the GIL, so the event loop serves other requests
meanwhile.
"""

from __future__ import annotations

import math
from typing import Any

from app.model_card import ModelCard
from app.prompts.tools import inline_tools, template_messages
from app.protocol.chat import ChatCompletionRequest
from app.protocol.tokenize import TokenizeChatRequest
from core.errors import ContextLengthExceeded, InvalidRequest

#: Inputs longer than this (characters) are rendered and tokenized in a thread, off the event loop...
_INLINE_MAX_CHARS = 16_384
#: ...and so are chats of more messages than this (the template renders each).
_INLINE_MAX_MESSAGES = 256

CHAT_PARAM = "messages"
COMPLETION_PARAM = "prompt"


def check_chars(card: ModelCard, chars: int, param: str) -> None:
    """Refuse text of ``chars`` characters that has too many tokens whatever they are."""
    if chars > card.max_prompt_chars:
        at_least = math.ceil(chars / card.max_token_chars)
        raise ContextLengthExceeded(f"This model's maximum context length is {card.context_length} tokens; "
                                    f"the prompt has at least {at_least} tokens.", param=param)


def check_tokens(card: ModelCard, tokens: int, param: str) -> None:
    """Refuse a prompt of ``tokens`` tokens that leaves no room to generate (the message
    app.requests.generation.resolve_max_tokens gives, with the endpoint's ``param``)."""
    if tokens >= card.context_length:
        raise ContextLengthExceeded(f"This model's maximum context length is {card.context_length} tokens; "
                                    f"the prompt has {tokens} tokens.", param=param)


def _chat_ids(card: ModelCard, messages: list[dict[str, Any]], add_generation_prompt: bool,
              tools: list[dict[str, Any]] | None) -> list[int]:
    text = card.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    check_chars(card, len(text), CHAT_PARAM)
    ids = card.encode(text, add_special_tokens=False)
    check_tokens(card, len(ids), CHAT_PARAM)
    return ids


def _text_ids(card: ModelCard, text: str) -> list[int]:
    ids = card.encode(text, add_special_tokens=True)
    if not ids:
        raise InvalidRequest("the prompt is empty", param=COMPLETION_PARAM)
    check_tokens(card, len(ids), COMPLETION_PARAM)
    return ids


async def chat_prompt_ids(card: ModelCard, body: ChatCompletionRequest | TokenizeChatRequest,
                          tool_format: str = "hermes") -> list[int]:
    """The prompt of a chat; its tools (and tool messages) rendered by the template when it takes
    them, else written into the messages in ``tool_format`` (app.prompts.tools)."""
    messages = template_messages(body.messages)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    if not card.template_takes_tools and (tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)):
        messages, tools = inline_tools(messages, tools, tool_format), None
    chars = sum(len(m["content"]) for m in messages) + (sum(len(str(t)) for t in tools) if tools else 0)
    check_chars(card, chars, CHAT_PARAM)
    if chars <= _INLINE_MAX_CHARS and len(messages) <= _INLINE_MAX_MESSAGES:
        return _chat_ids(card, messages, body.add_generation_prompt, tools)
    return await card.off_loop(_chat_ids, card, messages, body.add_generation_prompt, tools)


async def completion_prompt_ids(card: ModelCard, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        check_chars(card, len(prompt), COMPLETION_PARAM)
        if len(prompt) <= _INLINE_MAX_CHARS:
            return _text_ids(card, prompt)
        return await card.off_loop(_text_ids, card, prompt)
    if not prompt:
        raise InvalidRequest("the prompt is empty", param=COMPLETION_PARAM)
    check_tokens(card, len(prompt), COMPLETION_PARAM)
    vocab = card.tokenizer.get_vocab_size(with_added_tokens=True)
    if max(prompt) >= vocab:
        raise InvalidRequest(f"prompt token ids must be below the vocabulary size {vocab}", param=COMPLETION_PARAM)
    return prompt
