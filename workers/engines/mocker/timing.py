"""The mocker's timing model: how long one engine step takes, as pure functions.

It is the published polynomial model of NVIDIA Dynamo's mocker (fitted on vLLM runs), combined
the same way: one step (forward pass) runs the prefill chunks and the decode tokens scheduled in
it, and its time is the sum of both parts, divided by ``speedup``::

    prefill_ms(t) = 4.209989e-07 * t**2 + 1.518344e-02 * t + 16.50142    (t > 0; 0 when t == 0)
    decode_ms(u)  = max(1, -25.74 * u**2 + 54.01 * u + 5.74)               (u in [0, 1])
    step_ms       = (prefill_ms(t) + [decoding requests > 0] * decode_ms(u)) / speedup

``t`` is the number of uncached prompt tokens computed in the step, summed over the batch (the
GPU processes them together); ``u`` is the KV usage, active blocks / total blocks, as the step
begins (before the step's own prefill chunks take their blocks). Decode time
does not grow with the batch size: that is what makes continuous batching pay.
"""

from __future__ import annotations


def prefill_ms(tokens: int) -> float:
    """Prefill time of a step that computes ``tokens`` uncached tokens (whole batch), in ms.

    ``4.209989e-07 * t**2 + 1.518344e-02 * t + 16.50142``; a step without prefill costs 0.
    """
    if tokens <= 0:
        return 0.0
    return 4.209989e-07 * tokens * tokens + 1.518344e-02 * tokens + 16.50142


def decode_ms(kv_usage: float) -> float:
    """Decode time of a step at KV usage ``u`` (active / total blocks, clamped to [0, 1]), in ms.

    ``max(1, -25.74 * u**2 + 54.01 * u + 5.74)``: decode is memory bound, so it depends on how
    much KV cache the batch reads, not on how many sequences share the step.
    """
    u = min(max(kv_usage, 0.0), 1.0)
    return max(1.0, -25.74 * u * u + 54.01 * u + 5.74)


def step_ms(prefill_tokens: int, decoding: int, kv_usage: float, speedup: float = 1.0) -> float:
    """Wall time of one step, in ms: ``(prefill_ms(t) + decode_ms(u) if decoding) / speedup``.

    ``decoding`` is how many requests get a decode token in the step; without any, the step has
    no decode part (a pure prefill step, or an idle one costing 0).
    """
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    total = prefill_ms(prefill_tokens)
    if decoding > 0:
        total += decode_ms(kv_usage)
    return total / speedup
