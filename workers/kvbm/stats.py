"""What the tiers did, counted: per tier blocks held, hits, offloaded and onboarded bytes, onboard
latencies, recomputes by reason, and what they cost the engine (seconds inside its steps, CPU seconds of
the offload thread). Thread-safe; the worker's metrics read it (workers.metrics)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

#: Why a block a tier was expected to give was recomputed instead.
RecomputeReason = str  # "corrupt" | "timeout" | "down"
#: Upper bounds (seconds) of the onboard latency histogram.
ONBOARD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class TierStats:
    hits: Counter[str] = field(default_factory=Counter)
    offloaded_bytes: Counter[str] = field(default_factory=Counter)
    onboarded_bytes: Counter[str] = field(default_factory=Counter)
    recomputes: Counter[str] = field(default_factory=Counter)
    offloads_dropped: int = 0
    #: Per tier: (count, sum of seconds, count per bucket of ONBOARD_BUCKETS_S, +Inf last).
    onboard_seconds: dict[str, list[float]] = field(default_factory=dict)
    #: Seconds the engine's steps spent in the tiers' connector (both of vLLM's sides: block copies,
    #: onboard reads, the scheduler side's planning), on the step's critical path.
    step_seconds: float = 0.0
    #: CPU seconds of the offload thread (sealing and writing blocks), beside the engine's own threads.
    offload_cpu_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def hit(self, tier: str, blocks: int, nbytes: int) -> None:
        with self._lock:
            self.hits[tier] += blocks
            self.onboarded_bytes[tier] += nbytes

    def offloaded(self, tier: str, nbytes: int) -> None:
        with self._lock:
            self.offloaded_bytes[tier] += nbytes

    def recomputed(self, reason: RecomputeReason, blocks: int = 1) -> None:
        with self._lock:
            self.recomputes[reason] += blocks

    def dropped(self, blocks: int) -> None:
        with self._lock:
            self.offloads_dropped += blocks

    def onboard_took(self, tier: str, seconds: float) -> None:
        with self._lock:
            row = self.onboard_seconds.setdefault(tier, [0.0, 0.0] + [0.0] * (len(ONBOARD_BUCKETS_S) + 1))
            row[0] += 1
            row[1] += seconds
            for i, bound in enumerate(ONBOARD_BUCKETS_S):
                if seconds <= bound:
                    row[2 + i] += 1
                    break
            else:
                row[-1] += 1

    def in_step(self, seconds: float) -> None:
        with self._lock:
            self.step_seconds += seconds

    def offload_cpu(self, seconds: float) -> None:
        with self._lock:
            self.offload_cpu_seconds += seconds

    def snapshot(self) -> TierStats:
        """A copy of the counters as they are now (picklable: it crosses processes, workers.engines.vllm)."""
        with self._lock:
            return TierStats(Counter(self.hits), Counter(self.offloaded_bytes), Counter(self.onboarded_bytes),
                             Counter(self.recomputes), self.offloads_dropped,
                             {t: list(row) for t, row in self.onboard_seconds.items()}, self.step_seconds,
                             self.offload_cpu_seconds)

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in vars(self).items() if k != "_lock"}

    def __setstate__(self, state: dict[str, object]) -> None:
        vars(self).update(state)
        self._lock = threading.Lock()
