"""Prompt building (app.prompts.rendering) with the default model's real tokenizer: a prompt that cannot fit
is refused with the endpoint's ``param``, from its characters before it is tokenized when that
suffices, and the character bound never refuses text that would fit."""

from __future__ import annotations

import random

import pytest

from app.model_card import ModelCard
from app.prompts.rendering import chat_prompt_ids, completion_prompt_ids
from app.protocol.chat import ChatCompletionRequest
from core.errors import ContextLengthExceeded, InvalidRequest


@pytest.fixture(scope="module")
def card(tokenizer_dir) -> ModelCard:  # noqa: ANN001
    return ModelCard.load("m", tokenizer_dir)


def chat(content: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": content}])


def adversarial_texts(card: ModelCard) -> list[str]:
    """Texts made to have as few tokens per character as the vocabulary allows: runs of the longest
    tokens' text (whitespace, '#', '=' and '-' runs), and random mixtures of them."""
    vocab = card.tokenizer.get_vocab(with_added_tokens=True)
    longest = sorted(vocab, key=len, reverse=True)[:200]
    pieces = [card.tokenizer.decode([vocab[t]], skip_special_tokens=False) for t in longest]
    rng = random.Random(7)
    texts = [piece * 50 for piece in pieces[:40]]
    texts += ["".join(rng.choice(pieces) for _ in range(300)) for _ in range(20)]
    texts += [" " * 20_000, "\n" + " " * 20_000, "#" * 20_000, "日本語" * 2000, "😀" * 2000]
    return texts


def test_no_text_has_more_characters_per_token_than_the_card_assumes(card: ModelCard) -> None:
    assert card.max_token_chars == 81  # SmolLM2's longest entry: a newline and 80 spaces, byte-level
    for text in adversarial_texts(card):
        ids = card.encode(text, add_special_tokens=False)
        assert len(text) <= len(ids) * card.max_token_chars, text[:40]


def test_encode_gives_the_tokenizers_own_ids(card: ModelCard) -> None:
    text = "Hello <|im_start|> world, 12345 été 😀"
    assert card.encode(text, add_special_tokens=True) == card.tokenizer.encode(text, add_special_tokens=True).ids


async def test_a_chat_too_long_to_fit_is_refused_before_it_is_tokenized(card: ModelCard,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def no_tokenizing(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("tokenized")

    monkeypatch.setattr(card, "encode", no_tokenizing)
    with pytest.raises(ContextLengthExceeded, match="the prompt has at least 8192 tokens") as info:
        await chat_prompt_ids(card, chat(" " * (card.max_prompt_chars + 1)))
    assert info.value.param == "messages"
    with pytest.raises(ContextLengthExceeded) as info:
        await completion_prompt_ids(card, "x" * (card.max_prompt_chars + 1))
    assert info.value.param == "prompt"
    with pytest.raises(ContextLengthExceeded) as info:  # token ids: by their count, before the vocabulary check
        await completion_prompt_ids(card, [10**7] * card.context_length)
    assert info.value.param == "prompt"


async def test_a_prompt_of_too_many_tokens_is_refused_with_the_endpoints_param(card: ModelCard) -> None:
    many = "x " * card.context_length  # twice as many characters as tokens: past the tokenizer
    with pytest.raises(ContextLengthExceeded, match=f"maximum context length is {card.context_length} tokens") as info:
        await chat_prompt_ids(card, chat(many))
    assert info.value.param == "messages"
    with pytest.raises(ContextLengthExceeded) as info:
        await completion_prompt_ids(card, many)
    assert info.value.param == "prompt"


async def test_prompts_that_fit_are_tokenized(card: ModelCard) -> None:
    long = "word " * 4000  # tokenized in a thread
    assert await completion_prompt_ids(card, long) == card.encode(long, add_special_tokens=True)
    ids = await chat_prompt_ids(card, chat(long))
    assert len(ids) > 4000 and ids == card.encode(card.render_chat([{"role": "user", "content": long}]),
                                                  add_special_tokens=False)
    assert await completion_prompt_ids(card, [1, 2, 3]) == [1, 2, 3]
    with pytest.raises(InvalidRequest, match="vocabulary"):
        await completion_prompt_ids(card, [1, 10**7])
