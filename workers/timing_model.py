"""A worker's timing model, measured on itself: how long one engine step takes.

The model has the shape of the mocker's (Dynamo's published one, workers/engines/mocker/timing.py),
with coefficients fitted from the worker's own timed steps::

    step_ms(t, decoding, u) = [t > 0] (p0 + p1 t + p2 t²) + [decoding] (d0 + d1 u + d2 u²)

``t``: prompt tokens computed in the step (the whole batch's), ``decoding``: whether it also ran
decode tokens, ``u``: KV usage (active / total blocks). :class:`TimingFit` keeps the last ``window``
timed steps and refits by least squares (columns scaled to unit size, so ``t²`` in the tens of
millions does not swamp the constant) when asked and something new came in. The heartbeat publishes
the fit with the worker's load (``WorkerLoad.timing``, :meth:`TimingModel.encode`), and routers
predict a request's time to first token on each worker from it (router.time_cost).

A fit of the mocker's steps recovers its configured model (to rounding; tests/workers); a fit of
vLLM's steps, from its iteration details, describes the real engine on its hardware.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np

from core.timing import FIELDS, TimingModel
from workers.engines.base import StepStats


def features(tokens: np.ndarray, decoding: np.ndarray, usage: np.ndarray) -> np.ndarray:
    """The least-squares design matrix of steps (one row each)."""
    p = (tokens > 0).astype(np.float64)
    d = decoding.astype(np.float64)
    t = tokens.astype(np.float64)
    return np.column_stack([p, p * t, p * t * t, d, d * usage, d * usage * usage])


class TimingFit:
    """Fits a :class:`TimingModel` from the last ``window`` timed steps (at least ``min_steps``)."""

    def __init__(self, window: int = 2048, min_steps: int = 16) -> None:
        self.min_steps = min_steps
        self._steps: deque[tuple[int, bool, float, float]] = deque(maxlen=window)
        self._usage = 0.0
        self._model: TimingModel | None = None
        self._stale = False

    def observe(self, step: StepStats) -> None:
        if step.duration_s is None or (step.prefill_tokens <= 0 and step.decode_tokens <= 0):
            return
        usage = step.kv_usage if step.kv_usage is not None else self._usage
        self._steps.append((step.prefill_tokens, step.decode_tokens > 0, usage, step.duration_s * 1000.0))
        self._stale = True

    def set_usage(self, usage: float) -> None:
        """The KV usage to credit steps that do not carry their own (the worker's last load)."""
        self._usage = usage

    def model(self) -> TimingModel | None:
        if self._stale and len(self._steps) >= self.min_steps:
            self._stale = False
            self._model = fit(self._steps) or self._model
        return self._model


#: The prefill's per-token and quadratic coefficients: a prompt never gets cheaper as it grows, so a fit
#: that makes either negative (noisy steps, or prompts of a narrow range) refits without it. When that
#: would leave no term that grows with the prompt, the fit makes prefill proportional to it instead
#: (``p1`` alone, no constant): steps of a few similar prompts cannot tell a constant from a slope, and
#: a flat prefill would price a 4,000-token prompt like a 30-token one.
_NON_NEGATIVE = (1, 2)

#: The span of KV usage the decoding steps must cover for the fit to tell how decode time grows with it:
#: linearly from :data:`LINEAR_USAGE_SPAN`, as a parabola from :data:`QUADRATIC_USAGE_SPAN`. Below, those
#: terms stay 0. Over a narrow span (a small model's few requests use 1-3% of its cache) a few ms of noise
#: are slopes of thousands of ms per unit of usage, and routers read the model at any usage from 0 to 1: a
#: vLLM worker's fit from steps at usages 0.005-0.02 predicted an idle step at twice the steps' mean.
LINEAR_USAGE_SPAN = 0.05
QUADRATIC_USAGE_SPAN = 0.25


def fit(steps: Iterable[tuple[int, bool, float, float]]) -> TimingModel | None:
    """The least-squares model of ``steps``, (tokens, decoding, usage, ms) tuples, with ``p1`` and
    ``p2`` kept at 0 or above (the most negative one is dropped and the rest refitted, until none is
    negative; prefill made proportional to the prompt when neither is left) and the usage terms left at
    0 when the decoding steps' usages span too little to show them (:data:`LINEAR_USAGE_SPAN`); None when
    they cannot tell its parts apart (no step with prefill, or none with decode, leaves those at 0)."""
    data = np.asarray(list(steps), dtype=np.float64)
    if data.size == 0:
        return None
    x = features(data[:, 0], data[:, 1] > 0, data[:, 2])
    scale = np.abs(x).max(axis=0)
    used = scale > 0
    if not used.any():
        return None
    usage = data[data[:, 1] > 0, 2]
    span = float(usage.max() - usage.min()) if usage.size else 0.0
    used[4] &= span >= LINEAR_USAGE_SPAN
    used[5] &= span >= QUADRATIC_USAGE_SPAN
    while True:
        coef = np.zeros(FIELDS)
        sol, *_ = np.linalg.lstsq(x[:, used] / scale[used], data[:, 3], rcond=None)
        coef[used] = sol / scale[used]
        negative = [i for i in _NON_NEGATIVE if used[i] and coef[i] < 0]
        if not negative:
            return TimingModel((coef[0], coef[1], coef[2]), (coef[3], coef[4], coef[5]))
        used[min(negative, key=lambda i: coef[i] * scale[i])] = False
        if used[0] and not used[1] and not used[2]:
            used[0], used[1] = False, True
