"""Long prompts tokenized chunk by chunk give the ids of the whole text, and reuse seen chunks."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.normalizers import Lowercase
from tokenizers.pre_tokenizers import Whitespace

from app.model_card import ModelCard
from app.prompts.chunked_tokens import ChunkedEncoder, chunkable, chunks


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


def texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = ["word", "Éclair", "naïve", "42", "3.14", "x=1", " ", "  ", "\n", "\t", ",", ".", "!", "'s", "—",
                "東京", "<|im_start|>", "<|im_end|>", "assistant", "(", ")", "\"", "-", "ünd", "a"]
    return ["".join(rng.choice(alphabet) + rng.choice(["", " ", " "]) for _ in range(rng.randrange(50, 3000)))
            for _ in range(40)]


def test_the_default_models_tokenizer_passes_the_self_test(tokenizer: Tokenizer) -> None:
    assert chunkable(tokenizer)


@pytest.mark.parametrize("chunk_chars", [1, 7, 64, 2048])
def test_chunked_ids_equal_the_whole_texts(tokenizer: Tokenizer, chunk_chars: int) -> None:
    enc = ChunkedEncoder(tokenizer, chunk_chars=chunk_chars)
    for text in texts(chunk_chars):
        assert "".join(chunks(text, chunk_chars)) == text
        assert enc.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids


def test_a_grown_conversation_tokenizes_only_what_is_new(tokenizer: Tokenizer) -> None:
    rng = random.Random(1)
    enc = ChunkedEncoder(tokenizer, chunk_chars=256)
    history = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(2000))
    enc.encode(history)
    misses, hits = enc.misses, enc.hits
    grown = history + " and a new question about it?"
    assert enc.encode(grown) == tokenizer.encode(grown, add_special_tokens=False).ids
    # Only the tail is new: the history's last chunk (now longer, or cut once more) and what follows.
    assert enc.misses - misses <= 2 and enc.hits - hits >= len(chunks(grown, 256)) - 2 >= 30


def test_a_tokenizer_that_cuts_differently_is_not_chunked(tmp_path: Path) -> None:
    """Whitespace pre-tokenization with a lowercasing normalizer still passes; a tokenizer whose ids
    depend on where the text starts (a template adding tokens) does not."""
    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "quick", "fox"])}
    plain = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    plain.pre_tokenizer = Whitespace()
    plain.normalizer = Lowercase()
    assert chunkable(plain)
    from tokenizers.processors import TemplateProcessing
    plain.post_processor = TemplateProcessing(single="the $A", special_tokens=[("the", 1)])
    assert not chunkable(plain)


def test_the_model_card_uses_it_for_long_texts(tokenizer_dir: Path, tokenizer: Tokenizer) -> None:
    card = ModelCard.load("m", tokenizer_dir)
    assert card.chunked is not None
    text = " ".join(["The river Seine flows through Paris"] * 400)
    assert card.encode(text, add_special_tokens=True) == tokenizer.encode(text).ids
    assert card.chunked.misses > 0


async def test_long_inputs_are_tokenized_one_at_a_time_in_arrival_order(tokenizer_dir: Path) -> None:
    """A chunked tokenizer spreads one text over every core, so the card runs its off-loop work one
    job at a time, first come first served."""
    card = ModelCard.load("m", tokenizer_dir)
    assert card.chunked is not None
    running, overlapped, order = 0, False, []
    lock = threading.Lock()

    def job(name: str) -> str:
        nonlocal running, overlapped
        with lock:
            running += 1
            overlapped |= running > 1
        time.sleep(0.02)
        with lock:
            running -= 1
            order.append(name)
        return name

    names = [f"prompt-{i}" for i in range(6)]
    assert await asyncio.gather(*(card.off_loop(job, n) for n in names)) == names
    assert order == names
    assert not overlapped
