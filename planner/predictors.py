"""Load predictors: each interval the planner feeds one observed value (request rate, mean input
length, mean output length) and asks for the next interval's.

Contract (:class:`Predictor`): ``observe(value)`` appends one interval's observation; ``predict()``
returns the expected value of the next interval, never negative, and 0.0 before any observation.
A predictor is deterministic for a given sequence of observations.
"""

from __future__ import annotations

from typing import Literal, Protocol

PredictorKind = Literal["constant", "moving_average", "arima", "kalman"]


class Predictor(Protocol):
    def observe(self, value: float) -> None: ...

    def predict(self) -> float: ...
