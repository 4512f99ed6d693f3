"""What the mocker generates, and when it stops: pure functions, so tests can predict every token.

A request's output is a hash stream. With ``H(data, seed)`` = xxh3-64 and ``b(ids)`` the
little-endian uint32 bytes of the prompt::

    key      = H(b(prompt), 0)                       temperature == 0 (greedy: the prompt only)
             = H(b(prompt), seed mod 2**64)          temperature > 0 (a seed makes it repeatable)
    token(i) = 16 + H(le64(i), key) mod (vocab_size - 16)

so output token ``i`` depends on the prompt, the seed and ``i`` alone, never on batching, timing
or the tokens generated before it. Ids 0..15 are never produced: tokenizers keep their special
tokens (EOS, BOS, chat markers) there, and a stream of them would end or garble requests. The
engine picks a random seed for a request with ``temperature > 0`` and no seed. ``top_p`` and the
value of a non-zero temperature do not change the stream.

Penalties and bias change the choice as they would a model's. A request with ``logit_bias``,
``presence_penalty``, ``frequency_penalty`` or ``repetition_penalty`` weighs ``CANDIDATES``
tokens at each position: the stream's token (logit ``CANDIDATES``) and the draws of keys
``key + 64 + j`` (logit ``CANDIDATES - j``, j = 1..CANDIDATES-1), plus every biased token (logit 0
before its bias); the penalties
are applied as vLLM applies them (presence and frequency over the output so far, repetition over
prompt and output), and the highest logit wins (ties: the lowest id). Without those fields the
choice is the stream's token, as above. Log probabilities (``logprobs``) are those of a softmax
over the same candidates. ``top_k``, ``top_p`` and ``min_p`` keep the highest logit
whatever their value, so they never change the mocker's choice; nor does ``temperature`` beyond
greedy or not.

Stop rules follow vLLM. Until ``min_tokens`` tokens are out, stop token ids cannot be sampled
(vLLM masks their logits): a draw that hits one is redrawn with the key ``key + 1``, ``key + 2``,
... (mod 2**64; after 64 draws, the lowest allowed id). After each generated token, a stop token id finishes with ``stop``, the token included;
otherwise reaching ``max_tokens``, or ``max_model_len`` tokens in prompt plus output, finishes
with ``length``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Sequence

import numpy as np
import xxhash

from core.messages import FinishReason, SamplingParams, TokenLogprob

#: Token ids below this are never generated (special tokens live there).
FIRST_TOKEN_ID = 16

_U64 = (1 << 64) - 1
_MAX_DRAWS = 64


def stream_key(prompt_ids: Sequence[int], temperature: float, seed: int) -> int:
    """The 64-bit key of a request's token stream: ``H(b(prompt), 0 if greedy else seed)``."""
    data = np.asarray(prompt_ids, dtype="<u4").tobytes()
    return xxhash.xxh3_64_intdigest(data, 0 if temperature == 0 else seed & _U64)


def token_at(key: int, position: int, vocab_size: int, banned: Collection[int] = ()) -> int:
    """Output token ``position`` (0-based) of the stream ``key``: ``16 + H(le64(i), key) mod (V - 16)``,
    redrawn with ``key + 1``, ``key + 2``, ... while it is in ``banned``."""
    span = vocab_size - FIRST_TOKEN_ID
    data = position.to_bytes(8, "little")
    for attempt in range(_MAX_DRAWS):
        token = FIRST_TOKEN_ID + xxhash.xxh3_64_intdigest(data, (key + attempt) & _U64) % span
        if token not in banned:
            return token
    # Only a tiny vocabulary gets here: take the lowest id that is allowed.
    for token in range(FIRST_TOKEN_ID, vocab_size):
        if token not in banned:
            return token
    raise ValueError("every token id is banned")


#: Tokens weighed at each position when penalties or bias can change the choice.
CANDIDATES = 8


def shapes_choice(sampling: SamplingParams) -> bool:
    """Whether the request's penalties or bias can change which token the mocker picks."""
    return bool(sampling.logit_bias or sampling.presence_penalty or sampling.frequency_penalty
                or sampling.repetition_penalty != 1.0)


def next_token(key: int, position: int, sampling: SamplingParams, vocab_size: int,
               tokens: Sequence[int] = (), prompt_len: int = 0) -> int:
    """Output token ``position`` of a request whose prompt and output so far are ``tokens`` (the
    first ``prompt_len`` of them the prompt): stop token ids are banned before ``min_tokens``, and
    penalties and bias weigh the candidates (module docstring)."""
    return choose(key, position, sampling, vocab_size, tokens, prompt_len)[0]


def choose(key: int, position: int, sampling: SamplingParams, vocab_size: int,
           tokens: Sequence[int] = (), prompt_len: int = 0) -> tuple[int, TokenLogprob | None]:
    """:func:`next_token`, and with ``sampling.logprobs`` its log probability among the candidates
    (a softmax of their logits) with the ``sampling.logprobs`` most likely."""
    banned = sampling.stop_token_ids if position < sampling.min_tokens else ()
    first = token_at(key, position, vocab_size, banned)
    if not shapes_choice(sampling) and sampling.logprobs is None:
        return first, None
    logits = {first: float(CANDIDATES)}
    for j in range(1, CANDIDATES):
        logits.setdefault(token_at((key + _MAX_DRAWS + j) & _U64, position, vocab_size, banned), float(CANDIDATES - j))
    for token, bias in sampling.logit_bias:
        if token < vocab_size and token not in banned:
            logits[token] = logits.get(token, 0.0) + bias
    output = Counter(tokens[prompt_len:])
    seen = set(tokens[:prompt_len]) if sampling.repetition_penalty != 1.0 else set()
    for token in logits:
        count = output.get(token, 0)
        if count:
            logits[token] -= sampling.presence_penalty + sampling.frequency_penalty * count
        if sampling.repetition_penalty != 1.0 and (count or token in seen):
            value = logits[token]
            logits[token] = value / sampling.repetition_penalty if value > 0 else value * sampling.repetition_penalty
    chosen = max(logits, key=lambda t: (logits[t], -t))
    if sampling.logprobs is None:
        return chosen, None
    peak = logits[chosen]
    log_total = peak + math.log(sum(math.exp(v - peak) for v in logits.values()))
    ranked = sorted(logits, key=lambda t: (-logits[t], t))[:sampling.logprobs]
    return chosen, TokenLogprob(logits[chosen] - log_total, [(t, logits[t] - log_total) for t in ranked])


def prompt_logprobs(prompt_ids: Sequence[int], vocab_size: int, top: int) -> list[TokenLogprob | None]:
    """The prompt's log probabilities (``echo`` with ``logprobs``), as the mocker would have
    predicted each token: at position ``i``, a softmax over the candidates the greedy stream of
    ``prompt[:i]`` weighs for its first token (logits ``CANDIDATES`` down to 1), plus the prompt's
    own token at logit 0 when it is none of them. The first token has none (nothing precedes it)."""
    data = np.asarray(prompt_ids, dtype="<u4").tobytes()
    out: list[TokenLogprob | None] = [None]
    for i in range(1, len(prompt_ids)):
        key = xxhash.xxh3_64_intdigest(data[:4 * i], 0)
        logits = {token_at(key, 0, vocab_size): float(CANDIDATES)}
        for j in range(1, CANDIDATES):
            logits.setdefault(token_at((key + _MAX_DRAWS + j) & _U64, 0, vocab_size), float(CANDIDATES - j))
        actual = prompt_ids[i]
        logits.setdefault(actual, 0.0)
        peak = max(logits.values())
        log_total = peak + math.log(sum(math.exp(v - peak) for v in logits.values()))
        ranked = sorted(logits, key=lambda t: (-logits[t], t))[:top]
        out.append(TokenLogprob(logits[actual] - log_total, [(t, logits[t] - log_total) for t in ranked]))
    return out


def finish_reason(
    token: int, num_output: int, num_total: int, sampling: SamplingParams, max_model_len: int
) -> FinishReason | None:
    """Why a request stops right after generating ``token``, its ``num_output``-th output token
    (``num_total`` = prompt + output tokens), or None when it goes on."""
    if num_output >= sampling.min_tokens and token in sampling.stop_token_ids:
        return "stop"
    if num_output >= sampling.max_tokens or num_total >= max_model_len:
        return "length"
    return None


def expected_output(
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    vocab_size: int,
    max_model_len: int,
) -> tuple[list[int], FinishReason]:
    """The whole output of a request and its finish reason, as the mocker produces it.

    Only defined for reproducible requests: greedy (``temperature == 0``) or seeded.
    """
    if sampling.temperature != 0 and sampling.seed is None:
        raise ValueError("an unseeded request with temperature > 0 is random")
    key = stream_key(prompt_ids, sampling.temperature, sampling.seed or 0)
    out: list[int] = []
    tokens = list(prompt_ids)
    while True:
        token = next_token(key, len(out), sampling, vocab_size, tokens, len(prompt_ids))
        out.append(token)
        tokens.append(token)
        reason = finish_reason(token, len(out), len(prompt_ids) + len(out), sampling, max_model_len)
        if reason is not None:
            return out, reason
