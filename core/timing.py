"""A worker's step-time model, as it travels: what workers fit (workers.timing_model) and routers
read (router.time_cost), in the shape of the mocker's published model::

    step_ms(t, decoding, u) = [t > 0] (p0 + p1 t + p2 t²) + [decoding] (d0 + d1 u + d2 u²)
"""

from __future__ import annotations

from dataclasses import dataclass

#: Coefficients: p0, p1, p2, d0, d1, d2.
FIELDS = 6


@dataclass(frozen=True, slots=True)
class TimingModel:
    prefill: tuple[float, float, float]
    decode: tuple[float, float, float]

    def prefill_ms(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        p0, p1, p2 = self.prefill
        return p0 + p1 * tokens + p2 * tokens * tokens

    def decode_ms(self, usage: float) -> float:
        d0, d1, d2 = self.decode
        return d0 + d1 * usage + d2 * usage * usage

    def step_ms(self, tokens: float, decoding: bool, usage: float) -> float:
        return self.prefill_ms(tokens) + (self.decode_ms(usage) if decoding else 0.0)

    def encode(self) -> str:
        """``p0,p1,p2,d0,d1,d2`` (``repr`` of each float: decoded exactly)."""
        return ",".join(repr(float(v)) for v in (*self.prefill, *self.decode))

    @classmethod
    def decode_text(cls, text: str) -> TimingModel | None:
        """The model :meth:`encode` wrote (None for "" or anything else)."""
        parts = text.split(",") if text else []
        if len(parts) != FIELDS:
            return None
        try:
            v = [float(p) for p in parts]
        except ValueError:
            return None
        return cls((v[0], v[1], v[2]), (v[3], v[4], v[5]))

    @property
    def coefficients(self) -> tuple[float, ...]:
        return (*self.prefill, *self.decode)
