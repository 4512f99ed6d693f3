"""Turning API requests into prompt token ids (chat template + tokenizer of the model card)."""

from __future__ import annotations

import asyncio

from app.model_card import ModelCard
from app.protocol.chat import ChatCompletionRequest, message_text
from core.errors import InvalidRequest

#: Inputs longer than this (characters) are tokenized in a thread, off the event loop.
_INLINE_TOKENIZE_MAX_CHARS = 16_384


async def _encode(card: ModelCard, text: str, add_special_tokens: bool) -> list[int]:
    if len(text) <= _INLINE_TOKENIZE_MAX_CHARS:
        return card.encode(text, add_special_tokens=add_special_tokens)
    return await asyncio.to_thread(card.encode, text, add_special_tokens=add_special_tokens)


async def chat_prompt_ids(card: ModelCard, body: ChatCompletionRequest) -> list[int]:
    messages = [{"role": m["role"], "content": message_text(m)} for m in body.messages]
    text = card.render_chat(messages, add_generation_prompt=body.add_generation_prompt)
    return await _encode(card, text, add_special_tokens=False)


async def completion_prompt_ids(card: ModelCard, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        ids = await _encode(card, prompt, add_special_tokens=True)
    else:
        vocab = card.tokenizer.get_vocab_size(with_added_tokens=True)
        if any(t >= vocab for t in prompt):
            raise InvalidRequest(f"prompt token ids must be below the vocabulary size {vocab}", param="prompt")
        ids = prompt
    if not ids:
        raise InvalidRequest("the prompt is empty", param="prompt")
    return ids
