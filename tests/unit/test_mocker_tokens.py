"""The mocker's token stream and stop rules: pure, so every expectation is exact."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from core.messages import SamplingParams
from workers.engines.mocker.tokens import FIRST_TOKEN_ID, expected_output, finish_reason, stream_key, token_at

VOCAB = 49152
PROMPT = [101, 2023, 2003, 1037, 3231]


def test_stream_follows_the_documented_formula() -> None:
    key = xxhash.xxh3_64_intdigest(np.asarray(PROMPT, dtype="<u4").tobytes(), 0)
    assert stream_key(PROMPT, 0.0, 1234) == key
    h = xxhash.xxh3_64_intdigest((3).to_bytes(8, "little"), key)
    assert token_at(key, 3, VOCAB) == 16 + h % (VOCAB - 16)


def test_greedy_depends_on_the_prompt_only() -> None:
    assert stream_key(PROMPT, 0.0, 1) == stream_key(PROMPT, 0.0, 2)
    assert stream_key(PROMPT, 0.0, 1) != stream_key(PROMPT + [7], 0.0, 1)


def test_sampled_depends_on_the_seed() -> None:
    assert stream_key(PROMPT, 0.7, 1) == stream_key(PROMPT, 1.0, 1)
    assert stream_key(PROMPT, 0.7, 1) != stream_key(PROMPT, 0.7, 2)
    assert stream_key(PROMPT, 0.7, -1) == stream_key(PROMPT, 0.7, 2**64 - 1)


def test_tokens_avoid_special_ids_and_stay_in_the_vocabulary() -> None:
    key = stream_key(PROMPT, 0.0, 0)
    tokens = [token_at(key, i, 20) for i in range(2000)]
    assert set(tokens) == set(range(FIRST_TOKEN_ID, 20))


def test_stop_token_wins_over_length_and_is_included() -> None:
    sp = SamplingParams(max_tokens=3, stop_token_ids=(42,))
    assert finish_reason(42, 3, 10, sp, 100) == "stop"
    assert finish_reason(41, 3, 10, sp, 100) == "length"
    assert finish_reason(41, 2, 10, sp, 100) is None


def test_min_tokens_delays_stop_tokens() -> None:
    sp = SamplingParams(max_tokens=10, stop_token_ids=(42,), min_tokens=3)
    assert finish_reason(42, 2, 10, sp, 100) is None
    assert finish_reason(42, 3, 10, sp, 100) == "stop"


def test_context_length_ends_with_length() -> None:
    sp = SamplingParams(max_tokens=10)
    assert finish_reason(41, 1, 99, sp, 100) is None
    assert finish_reason(41, 2, 100, sp, 100) == "length"


def test_expected_output_stops_at_the_first_stop_token() -> None:
    greedy = SamplingParams(max_tokens=20, temperature=0)
    full, reason = expected_output(PROMPT, greedy, VOCAB, 8192)
    assert reason == "length" and len(full) == 20
    stop = full[5]
    first = full.index(stop)
    out, reason = expected_output(PROMPT, SamplingParams(max_tokens=20, temperature=0, stop_token_ids=(stop,)), VOCAB, 8192)
    assert (out, reason) == (full[: first + 1], "stop")


def test_expected_output_respects_max_model_len() -> None:
    out, reason = expected_output(PROMPT, SamplingParams(max_tokens=20, temperature=0), VOCAB, len(PROMPT) + 4)
    assert len(out) == 4 and reason == "length"


def test_unseeded_sampling_has_no_expected_output() -> None:
    with pytest.raises(ValueError):
        expected_output(PROMPT, SamplingParams(temperature=1.0), VOCAB, 8192)


def test_banned_tokens_are_redrawn_with_the_next_key() -> None:
    key = stream_key(PROMPT, 0.0, 0)
    first = token_at(key, 0, VOCAB)
    assert token_at(key, 0, VOCAB, banned=(first,)) == token_at(key + 1, 0, VOCAB)
    assert token_at(2**64 - 1, 0, VOCAB, banned=(token_at(2**64 - 1, 0, VOCAB),)) == token_at(0, 0, VOCAB)


def test_a_vocabulary_almost_all_banned_still_yields_the_allowed_id() -> None:
    assert token_at(5, 0, 20, banned=(16, 17, 18)) == 19
    with pytest.raises(ValueError):
        token_at(5, 0, 20, banned=(16, 17, 18, 19))


def test_stop_tokens_are_not_sampled_before_min_tokens() -> None:
    full, _ = expected_output(PROMPT, SamplingParams(max_tokens=20, temperature=0), VOCAB, 8192)
    stop = full[0]
    sampling = SamplingParams(max_tokens=20, temperature=0, stop_token_ids=(stop,), min_tokens=3)
    out, _ = expected_output(PROMPT, sampling, VOCAB, 8192)
    key = stream_key(PROMPT, 0.0, 0)
    assert out[0] == token_at(key, 0, VOCAB, banned=(stop,)) != stop
    assert out[1:3] == [t if t != stop else token_at(key, i + 1, VOCAB, (stop,)) for i, t in enumerate(full[1:3])]
    assert stop not in out[:3]
