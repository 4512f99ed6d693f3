"""An engine's performance profile: what one worker of a model does, measured by ``sluice profile``
(planner.profiler) and read by the planner's ``sla`` mode.

Two tables, both of one worker alone:

* prefill: the time to first token of one prompt of ``isl`` tokens on an idle worker (nothing cached);
  a prefill worker's throughput at that length is ``isl / ttft_s`` prompt tokens per second;
* decode: the inter-token latency with ``batch`` streams decoding together, each holding ``context``
  tokens of KV; a decode worker's throughput there is ``batch / itl_s`` tokens per second.

Between measured points the tables are interpolated linearly (prefill along ``isl``; decode along
``batch`` within each measured context, then along ``context``), and held at their ends beyond them.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path

from pydantic import BaseModel, Field


class PrefillPoint(BaseModel):
    isl: int = Field(ge=1)
    ttft_s: float = Field(gt=0)


class DecodePoint(BaseModel):
    batch: int = Field(ge=1)
    context: int = Field(ge=1)
    itl_s: float = Field(gt=0)


class Profile(BaseModel):
    """One engine and model's profile, as ``sluice profile`` writes it (JSON)."""

    version: int = 1
    engine: str
    model: str
    #: When it was measured (unix seconds) and on what (free text: CPU, GPU, settings that matter).
    created_at: float = 0.0
    hardware: str = ""
    #: KV capacity of one worker in tokens (``kv_blocks * block_size``): no batch holds more.
    kv_tokens: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    prefill: list[PrefillPoint] = Field(min_length=1)
    decode: list[DecodePoint] = Field(min_length=1)
    #: The engine's step-time model fitted from the profile's own steps (core.timing, ``p0,p1,p2,d0,d1,d2``;
    #: "" when the engine reports no steps): the planner compares the workers' live models with it.
    timing: str = ""

    @classmethod
    def load(cls, path: Path) -> Profile:
        return cls.model_validate_json(path.read_text())

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2) + "\n")

    # ---- prefill ----
    def ttft_s(self, isl: float) -> float:
        """Expected TTFT of one ``isl``-token prompt on an idle worker."""
        points = sorted(self.prefill, key=lambda p: p.isl)
        return _interpolate([p.isl for p in points], [p.ttft_s for p in points], isl)

    # ---- decode ----
    def itl_s(self, batch: float, context: float) -> float:
        """Expected inter-token latency with ``batch`` streams of ``context`` tokens each."""
        contexts = sorted({p.context for p in self.decode})
        values = []
        for c in contexts:
            row = sorted((p for p in self.decode if p.context == c), key=lambda p: p.batch)
            values.append(_interpolate([p.batch for p in row], [p.itl_s for p in row], batch))
        return _interpolate(contexts, values, context)

    def max_batch(self, context: float) -> int:
        """The most streams of ``context`` tokens one worker holds: its batch size and its KV capacity."""
        return max(1, min(self.max_num_seqs, int(self.kv_tokens // max(context, 1.0))))

    def decode_batch_within(self, itl_target_s: float, context: float, correction: float = 1.0) -> int:
        """The largest batch whose ITL (times ``correction``, observed over expected) stays within
        ``itl_target_s`` at ``context``; 0 when even one stream misses it."""
        lo, hi = 0, self.max_batch(context)
        while lo < hi:  # itl grows with the batch: binary search for the last batch within the target
            mid = (lo + hi + 1) // 2
            if self.itl_s(mid, context) * correction <= itl_target_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def decode_tokens_per_s(self, itl_target_s: float, context: float, correction: float = 1.0) -> float:
        """A decode worker's throughput within the ITL target: ``batch / itl`` at the largest batch that
        meets it (the throughput of one stream when none does: the worker cannot do better)."""
        batch = max(1, self.decode_batch_within(itl_target_s, context, correction))
        return batch / (self.itl_s(batch, context) * correction)


def _interpolate(xs: list[int] | list[float], ys: list[float], x: float) -> float:
    """Linear interpolation of sorted ``xs``; the end values beyond them."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1


def replicas_for(need: float) -> int:
    """Whole workers for a fractional need (a tiny excess over a whole number is rounding, not load)."""
    return max(0, math.ceil(need - 1e-9))
