"""The mocker's timing model: exact values of Dynamo's published polynomials and how a step adds them."""

from __future__ import annotations

import pytest

from workers.engines.mocker.timing import decode_ms, prefill_ms, step_ms


def test_prefill_polynomial() -> None:
    assert prefill_ms(0) == 0.0
    assert prefill_ms(1) == pytest.approx(4.209989e-07 + 1.518344e-02 + 16.50142)
    assert prefill_ms(1000) == pytest.approx(0.4209989 + 15.18344 + 16.50142)
    assert prefill_ms(8192) == pytest.approx(4.209989e-07 * 8192**2 + 1.518344e-02 * 8192 + 16.50142)


def test_decode_polynomial_is_clamped() -> None:
    assert decode_ms(0.0) == pytest.approx(5.74)
    assert decode_ms(0.5) == pytest.approx(-25.74 * 0.25 + 54.01 * 0.5 + 5.74)
    assert decode_ms(1.0) == pytest.approx(-25.74 + 54.01 + 5.74)
    assert decode_ms(3.0) == decode_ms(1.0)  # usage above 1 is clamped
    assert decode_ms(-1.0) == decode_ms(0.0)


def test_step_adds_prefill_and_decode_and_divides_by_speedup() -> None:
    assert step_ms(0, 0, 0.3) == 0.0
    assert step_ms(100, 0, 0.3) == pytest.approx(prefill_ms(100))
    assert step_ms(0, 7, 0.3) == pytest.approx(decode_ms(0.3))
    assert step_ms(100, 7, 0.3, speedup=4.0) == pytest.approx((prefill_ms(100) + decode_ms(0.3)) / 4)


def test_decode_time_does_not_grow_with_the_batch() -> None:
    assert step_ms(0, 1, 0.2) == step_ms(0, 256, 0.2)


def test_speedup_must_be_positive() -> None:
    with pytest.raises(ValueError):
        step_ms(1, 1, 0.0, speedup=0)
