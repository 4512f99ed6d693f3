"""KV-aware routing's default cost: the predicted time to first token on each worker, in ms.

Each worker measures its own step time (workers.timing_model) and publishes the fit with its load:
``pre(t) = max(0, p0 + p1 t + p2 t²)`` for ``t`` prompt tokens in a step, ``dec(u) = max(0, d0 + d1 u
+ d2 u²)`` at KV usage ``u``. For candidate ``w`` (block size ``B``, per-step token budget ``M``,
``K`` KV blocks, ``R`` running requests), a prompt of ``prompt`` blocks of which it holds ``overlap``::

    own      = max(1, (prompt − overlap) × B)     tokens it must compute (the last one always is)
    queued   = queued_w × B                       prefill already routed there, first token not out
    busy     = max(active_w, predicted_w)          blocks decoding (heartbeat; the routers' sums)
    prefill(n) = (k − 1) × pre(M) + pre(n − (k − 1) M),  k = ceil(n / M)   (n tokens over k steps)
    dec      = dec(min(1, busy / K)) if busy > 0 else 0
    ttft     = prefill(queued + own) + k × dec + dec / 2     (each prefill step also decodes the running
                                                               requests; half a step already in progress)
    slowdown = R × (prefill(queued + own) − prefill(queued))  (the delay its prefill adds to each running decode)
    new      = prompt − device_overlap          blocks it allocates (a KV tier's onboarded ones included;
                                                ``overlap`` is the credited run, tier blocks weighed by credit)
    evicted  = max(0, new − (K − max(C, busy) − queued_w))   cached blocks it pushes out
                                                (C: blocks holding cached content; the rest are free)
    cost     = ttft + slowdown_weight × slowdown + eviction_weight × evicted × B × p1

The eviction term is what recomputing the cached blocks it evicts would cost (``p1`` per token) if
they are needed again, with ``eviction_weight`` the chance they are: on a worker whose cache is full
every block it computes pushes one out, so under KV pressure a miss costs more than its own
prefill, and keeping a prompt where its prefix already is keeps the other workers' caches intact. A worker that has not fitted its model
yet (too few steps) is predicted with the mocker's published one (:data:`DEFAULT_TIMING`).

The routing script in Redis (router/lua/decide.lua) computes it; this module packs the columns it
reads. tests/router/cost_oracle.py computes the same costs in numpy, in the same order of operations,
as the tests' oracle (they agree to the last bit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: The mocker's published model (workers/engines/mocker/timing.py, speedup 1):
#: ``p0, p1, p2, d0, d1, d2``.
DEFAULT_TIMING = (16.50142, 1.518344e-02, 4.209989e-07, 5.74, 54.01, -25.74)
#: A worker that does not say how many tokens one step computes is taken to compute this many.
DEFAULT_BUDGET = 8192
#: Per-candidate columns, in the order the script reads them.
COLUMNS = ("p0", "p1", "p2", "d0", "d1", "d2", "budget", "kv_blocks", "running", "block_size", "cached_blocks")


@dataclass(frozen=True, slots=True)
class TimeWeights:
    slowdown: float
    eviction: float


def timing_columns(timings: Sequence[tuple[float, ...] | None], budgets: Sequence[int], kv_blocks: Sequence[int],
                   running: Sequence[int], block_sizes: Sequence[int],
                   cached_blocks: Sequence[int] | None = None) -> np.ndarray:
    """The candidates' columns (one row each, :data:`COLUMNS`), defaults filled in."""
    n = len(budgets)
    coefficients = np.array([t if t is not None else DEFAULT_TIMING for t in timings], dtype=np.float64)
    return timing_matrix(coefficients.reshape(n, len(DEFAULT_TIMING)), budgets, kv_blocks, running, block_sizes,
                         cached_blocks if cached_blocks is not None else np.zeros(n))


def timing_matrix(coefficients: np.ndarray, budgets: Sequence[int] | np.ndarray, kv_blocks: Sequence[int] | np.ndarray,
                  running: Sequence[int] | np.ndarray, block_sizes: Sequence[int] | np.ndarray,
                  cached_blocks: Sequence[int] | np.ndarray) -> np.ndarray:
    """:func:`timing_columns` from aligned arrays, ``coefficients`` (one row of ``p0 .. d2`` per
    candidate) with the defaults already in: a budget of 0 reads as :data:`DEFAULT_BUDGET`, KV blocks
    count at least 1."""
    budget = np.asarray(budgets, dtype=np.float64)
    cols = np.column_stack([coefficients, np.where(budget != 0, budget, float(DEFAULT_BUDGET)),
                            np.maximum(np.asarray(kv_blocks, dtype=np.float64), 1.0),
                            np.asarray(running, dtype=np.float64), np.asarray(block_sizes, dtype=np.float64),
                            np.asarray(cached_blocks, dtype=np.float64)])
    # Single precision is plenty for a prediction and halves what the routers store per table (at 1,000
    # workers, 44 KB): the columns are rounded to it here, so the tests' oracle and the script compute on the same values.
    return cols.reshape(len(budget), len(COLUMNS)).astype(np.float32).astype(np.float64)
