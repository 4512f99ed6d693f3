"""Load predictors: each interval the planner feeds one observed value (request rate, mean input
length, mean output length) and asks for the next interval's.

Contract (:class:`Predictor`): ``observe(value)`` appends one interval's observation; ``predict()``
returns the expected value of the next interval, never negative, and 0.0 before any observation.
A predictor is deterministic for a given sequence of observations. ``observe`` refuses a value that
is not finite (``ValueError``): one NaN would otherwise sit in every later prediction of the window.

Which to use: ``constant`` for steady load, ``moving_average`` for noisy load without a trend,
``arima`` for trends and seasonality given enough history, ``kalman`` for smooth ramps from few
points. :func:`make_predictor` builds one by :data:`PredictorKind`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

PredictorKind = Literal["constant", "moving_average", "arima", "kalman"]

log = logging.getLogger(__name__)


class Predictor(Protocol):
    def observe(self, value: float) -> None: ...

    def predict(self) -> float: ...


def _checked(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"a predictor observes finite values, not {value!r}")
    return float(value)


class ConstantPredictor:
    """Predicts the last observation (clamped at 0): the next interval looks like this one.

    Best for steady load, and the reference the others must beat: it reacts to a change one
    interval late and follows every spike of noise.
    """

    def __init__(self) -> None:
        self._last: float | None = None

    def observe(self, value: float) -> None:
        self._last = _checked(value)

    def predict(self) -> float:
        return 0.0 if self._last is None else max(0.0, self._last)


class MovingAveragePredictor:
    """Predicts the mean of the last ``window`` observations (fewer until ``window`` have arrived).

    Best for noisy load without a trend: averaging ``window`` points divides the noise's variance by
    ``window``. On a ramp it lags by ``(window - 1) / 2`` intervals of slope.
    """

    def __init__(self, window: int = 5) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self._values: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self._values.append(_checked(value))

    def predict(self) -> float:
        if not self._values:
            return 0.0
        return max(0.0, math.fsum(self._values) / len(self._values))


class ArimaPredictor:
    """Predicts with an ARIMA(p, d, q) model (statsmodels) fitted by maximum likelihood to the last
    ``window`` observations; the prediction is its one-step-ahead forecast, clamped at 0.

    Best for trends and seasonality once there is history to fit. With ``drift`` (the default) the
    model has a polynomial trend of degree ``d`` (for d=1, a constant in the differenced series),
    without which a d=1 model does not represent a ramp's slope and mostly fails to converge on one.

    It falls back to a moving average of the last ``fallback_window`` observations while it has
    fewer than ``min_points`` observations, and whenever the fit raises, warns that it did not
    converge, or forecasts NaN. A noiseless series (constant, zero, an exact ramp) has no likelihood
    maximum (zero innovation variance): the fit mostly reports non-convergence there, and otherwise
    forecasts within about 1e-5 of the exact value (the clamp keeps a zero series' -5e-6 at 0).

    A fit runs at most once per new observation: ``predict`` caches its forecast until ``observe``.
    statsmodels is imported at the first fit (importing it takes over a second), and its warnings are
    silenced only around the fit (``warnings.catch_warnings``, which swaps the process's filters for
    that time, so fit from one thread).
    """

    def __init__(
        self,
        order: tuple[int, int, int] = (1, 1, 1),
        window: int = 60,
        min_points: int = 12,
        fallback_window: int = 5,
        drift: bool = True,
    ) -> None:
        # After d differences a fit needs a point per AR/MA coefficient, the trend and the variance.
        floor = sum(order) + 2
        if not floor <= min_points <= window:
            raise ValueError(f"need {floor} <= min_points <= window for ARIMA{order}, not {min_points=}, {window=}")
        self._order = order
        self._trend = [0] * order[1] + [1] if drift else None
        self._min_points = min_points
        self._values: deque[float] = deque(maxlen=window)
        self._fallback = MovingAveragePredictor(fallback_window)
        self._forecast: float | None = None

    def observe(self, value: float) -> None:
        value = _checked(value)
        self._values.append(value)
        self._fallback.observe(value)
        self._forecast = None

    def predict(self) -> float:
        if self._forecast is None:
            self._forecast = self._fit()
        return self._forecast

    def _fit(self) -> float:
        if len(self._values) < self._min_points:
            return self._fallback.predict()
        forecast = _arima_forecast(self._values, self._order, self._trend)
        if forecast is None:
            return self._fallback.predict()
        return max(0.0, forecast)


def _arima_forecast(values: Sequence[float], order: tuple[int, int, int], trend: list[int] | None) -> float | None:
    """The one-step-ahead forecast of an ARIMA fit to ``values``, or None when the fit raises, does
    not converge or forecasts NaN. ``cov_type="none"`` skips the parameters' standard errors (a
    numerical Hessian, a large part of a fit's time), which a forecast does not use."""
    from statsmodels.tools.sm_exceptions import ConvergenceWarning
    from statsmodels.tsa.arima.model import ARIMA

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fitted = ARIMA(np.asarray(values, dtype=np.float64), order=order, trend=trend).fit(
                cov_type="none", low_memory=True
            )
            forecast = float(fitted.forecast(1)[0])
        except Exception as exc:  # degenerate windows raise IndexError, ValueError, LinAlgError, ...
            log.debug("ARIMA%s fit on %d points failed, falling back: %r", order, len(values), exc)
            return None
    if any(issubclass(w.category, ConvergenceWarning) for w in caught) or not math.isfinite(forecast):
        return None
    return forecast


@dataclass(frozen=True)
class TrendState:
    """A local-linear-trend Kalman filter's estimate after an observation: ``mean = [level, slope]``
    and the covariance ``cov`` (2x2) of its error."""

    mean: NDArray[np.float64]
    cov: NDArray[np.float64]

    @property
    def forecast(self) -> float:
        """The next interval's expected observation: ``level + slope``."""
        return float(self.mean[0] + self.mean[1])


_TRANSITION = np.array([[1.0, 1.0], [0.0, 1.0]])
_OBSERVATION = np.array([1.0, 0.0])


def trend_start(first: float, second: float, process_var: float, measurement_var: float) -> TrendState:
    """The filter's state after its first two observations ``z1, z2``, without a prior (the exact
    diffuse start): ``level = z2``, ``slope = z2 - z1``, with error covariance

        cov = [[R, R], [R, 2R + 2q]]

    (the level's error is z2's noise; the slope's is the difference of two observations' noise plus
    one step of level and slope disturbance). The start is scale-free: no large prior variance."""
    r, q = measurement_var, process_var
    return TrendState(
        mean=np.array([second, second - first]),
        cov=np.array([[r, r], [r, 2.0 * r + 2.0 * q]]),
    )


def trend_step(state: TrendState, z: float, process_var: float, measurement_var: float) -> TrendState:
    """One step of the local-linear-trend Kalman filter: predict ``state`` one interval ahead, then
    correct with the observation ``z``. A pure function of its arguments.

    The model: ``level' = level + slope + eta``, ``slope' = slope + zeta``, ``z = level + eps``, with
    ``eta, zeta ~ N(0, q)`` and ``eps ~ N(0, R)``, ``q = process_var``, ``R = measurement_var``. With
    ``F = [[1, 1], [0, 1]]``, ``H = [1, 0]``, ``Q = q I``:

        predict:  x- = F x,             P- = F P F^T + Q
        correct:  S = H P- H^T + R,     K = P- H^T / S
                  x = x- + K (z - H x-),
                  P = (I - K H) P- (I - K H)^T + R K K^T     (Joseph form: stays symmetric, PSD)

    Only the ratio ``q / R`` shapes the estimates: a larger one follows changes faster and noise more.
    """
    mean = _TRANSITION @ state.mean
    cov = _TRANSITION @ state.cov @ _TRANSITION.T + process_var * np.eye(2)
    innovation_var = float(_OBSERVATION @ cov @ _OBSERVATION) + measurement_var
    gain = cov @ _OBSERVATION / innovation_var
    mean = mean + gain * (z - float(_OBSERVATION @ mean))
    keep = np.eye(2) - np.outer(gain, _OBSERVATION)
    cov = keep @ cov @ keep.T + measurement_var * np.outer(gain, gain)
    return TrendState(mean=mean, cov=cov)


class KalmanPredictor:
    """Predicts with a local-linear-trend Kalman filter (level and slope; :func:`trend_step`): the
    next interval's ``level + slope``, clamped at 0.

    Best for smooth ramps: it estimates the slope, so on a steady ramp its error goes to zero where a
    moving average lags behind, and it needs two points, not a model fit. ``process_var`` and
    ``measurement_var`` are the variances of the level/slope disturbances and of the observation
    noise; only their ratio matters: raise ``process_var`` to follow changes faster, raise
    ``measurement_var`` to smooth more. After one observation it predicts that observation.
    """

    def __init__(self, process_var: float = 0.1, measurement_var: float = 1.0) -> None:
        if not (process_var > 0 and measurement_var > 0):
            raise ValueError(f"variances must be positive, not {process_var=}, {measurement_var=}")
        self._process_var = process_var
        self._measurement_var = measurement_var
        self._first: float | None = None
        self._state: TrendState | None = None

    def observe(self, value: float) -> None:
        value = _checked(value)
        if self._first is None:
            self._first = value
        elif self._state is None:
            self._state = trend_start(self._first, value, self._process_var, self._measurement_var)
        else:
            self._state = trend_step(self._state, value, self._process_var, self._measurement_var)

    def predict(self) -> float:
        if self._state is not None:
            return max(0.0, self._state.forecast)
        return 0.0 if self._first is None else max(0.0, self._first)


_PREDICTORS: dict[PredictorKind, Callable[..., Predictor]] = {
    "constant": ConstantPredictor,
    "moving_average": MovingAveragePredictor,
    "arima": ArimaPredictor,
    "kalman": KalmanPredictor,
}


def make_predictor(kind: PredictorKind, **options: object) -> Predictor:
    """A new predictor of ``kind``, built with ``options`` (its class's keyword arguments)."""
    try:
        factory = _PREDICTORS[kind]
    except KeyError:
        raise ValueError(f"unknown predictor kind {kind!r}; known: {', '.join(_PREDICTORS)}") from None
    return factory(**options)
