"""Long prompts tokenized chunk by chunk, each chunk's token ids remembered.

Tokenizing is the frontend's costliest step on long prompts (about 3 µs a token here: 12-20 ms for
4,000 tokens), and long prompts are mostly text the frontend has seen before: a chat's history, a
shared system prompt, a document asked about again. For a byte-level BPE tokenizer (GPT-2's
family, the default model's), a space that follows a non-space and precedes a letter always starts
a new pre-token, so the text on either side of it tokenizes independently: cut there, tokenized
piece by piece, the ids are those of the whole. :class:`ChunkedEncoder` cuts a text at the first such
space at or after every ``chunk_chars`` characters (the cuts of a shared prefix are the same in
every text that starts with it), looks each chunk up in an LRU of chunk -> ids, and tokenizes only
the chunks it has not seen, together (``encode_batch_fast``, which releases the GIL and spreads a
batch over the tokenizer's threads).

It is used only when a self-test on the model's own tokenizer passes at load (a text with words,
digits, punctuation, runs of spaces, newlines, non-ASCII letters and the special tokens, cut at
every candidate space, gives the ids of the whole) and the tokenizer adds no special tokens of
its own; otherwise ModelCard tokenizes the whole text as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator

import xxhash
from tokenizers import Tokenizer

#: The self-test's text (the special tokens are added by :func:`chunkable`).
_SAMPLE = ("The quick brown fox, aged 42, jumped over 3 lazy dogs!  Twice;\n\tthen   again. "
           "Ça va? Über naïve café — 東京 и Москва. x=1+2*3 (done) 'quoted' \"double\" end")


def cuts(text: str, chunk_chars: int) -> Iterator[int]:
    """The cut positions: for each multiple of ``chunk_chars``, the first space at or after it that
    follows a non-space and precedes a letter."""
    n = len(text)
    target = chunk_chars
    while target < n:
        p = text.find(" ", target)
        while p != -1 and p + 1 < n and not (text[p + 1].isalpha() and not text[p - 1].isspace()):
            p = text.find(" ", p + 1)
        if p == -1 or p + 1 >= n:
            return
        yield p
        target = max(target + chunk_chars, p + 1)


def chunks(text: str, chunk_chars: int) -> list[str]:
    out, start = [], 0
    for p in cuts(text, chunk_chars):
        out.append(text[start:p])
        start = p
    out.append(text[start:])
    return out


def chunkable(tokenizer: Tokenizer) -> bool:
    """Whether cutting at the spaces :func:`cuts` picks leaves this tokenizer's ids unchanged, and it
    adds no special tokens of its own."""
    specials = [t.content for t in tokenizer.get_added_tokens_decoder().values()][:8]
    sample = " ".join([_SAMPLE, *specials, _SAMPLE])
    whole = tokenizer.encode(sample, add_special_tokens=False).ids
    if tokenizer.encode(sample, add_special_tokens=True).ids != whole:
        return False
    pieces = chunks(sample, 1)
    return len(pieces) > 10 and [i for e in tokenizer.encode_batch(pieces, add_special_tokens=False)
                                 for i in e.ids] == whole


class ChunkedEncoder:
    def __init__(self, tokenizer: Tokenizer, chunk_chars: int = 2048, capacity: int = 8192) -> None:
        self.tokenizer = tokenizer
        self.chunk_chars = chunk_chars
        self.capacity = capacity
        self._ids: OrderedDict[bytes, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def encode(self, text: str) -> list[int]:
        pieces = chunks(text, self.chunk_chars)
        keys = [xxhash.xxh3_128_digest(p.encode("utf-8", "surrogatepass")) for p in pieces]
        found: list[list[int] | None] = []
        with self._lock:
            for key in keys:
                ids = self._ids.get(key)
                if ids is not None:
                    self._ids.move_to_end(key)
                found.append(ids)
        missing = [i for i, ids in enumerate(found) if ids is None]
        if missing:
            encoded = self.tokenizer.encode_batch_fast([pieces[i] for i in missing], add_special_tokens=False)
            with self._lock:
                for i, enc in zip(missing, encoded, strict=True):
                    found[i] = self._ids[keys[i]] = enc.ids
                while len(self._ids) > self.capacity:
                    self._ids.popitem(last=False)
        self.hits += len(pieces) - len(missing)
        self.misses += len(missing)
        return [i for ids in found for i in ids]  # type: ignore[union-attr]  # every piece was found or encoded above
