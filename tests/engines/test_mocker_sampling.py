"""The mocker's penalties and bias (workers.engines.mocker.tokens): they change its choice as they
would a model's, and without them the stream is unchanged."""

from __future__ import annotations

from collections import Counter

from core.messages import SamplingParams
from workers.engines.mocker.tokens import expected_output

VOCAB = 49152
MAX_LEN = 8192
PROMPT = list(range(100, 140))


def _out(**fields: object) -> list[int]:
    return expected_output(PROMPT, SamplingParams(max_tokens=40, temperature=0, **fields), VOCAB, MAX_LEN)[0]


def test_neutral_fields_leave_the_stream_alone() -> None:
    plain = _out()
    assert _out(top_k=5, min_p=0.3, top_p=0.5) == plain
    assert _out(presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0) == plain


def test_a_bias_of_100_forces_a_token_and_minus_100_bans_one() -> None:
    assert _out(logit_bias=((4242, 100.0),)) == [4242] * 40
    plain = _out()
    banned = _out(logit_bias=((plain[0], -100.0),))
    assert banned[0] != plain[0] and plain[0] not in banned


def test_penalties_discourage_repeats() -> None:
    forced = ((4242, 9.0),)  # 4242 wins while it is unpenalised
    assert Counter(_out(logit_bias=forced))[4242] == 40
    assert Counter(_out(logit_bias=forced, frequency_penalty=2.0))[4242] < 40
    assert Counter(_out(logit_bias=forced, presence_penalty=2.0))[4242] < 40
    assert Counter(_out(logit_bias=forced, repetition_penalty=2.0))[4242] < 40


def test_repetition_penalty_counts_the_prompt() -> None:
    in_prompt = ((120, 9.0),)  # token 120 is in the prompt
    assert _out(logit_bias=in_prompt)[0] == 120
    assert _out(logit_bias=in_prompt, repetition_penalty=2.0)[0] != 120
