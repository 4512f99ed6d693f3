"""What the planner sees each interval, read from what the platform already publishes.

* Traffic, per model (:class:`TrafficMeter`): every frontend process publishes its load counters with its
  lease (``router.frontends.LoadCounters``); two readings apart give the interval's request rate, mean
  input and output lengths, mean TTFT and mean ITL. Counters are kept per frontend: a frontend that
  started since the last reading counts whole, one that went is dropped (its last second is lost).
* Pools (:func:`pool_states`): each pool's live workers from their leases (draining ones apart), what
  their engines run and hold waiting, their mean KV usage and step-time models, and the tasks waiting in
  the pool's queue and the workers' own queues.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from core.timing import TimingModel
from planner.connectors.base import PoolRef
from router.cluster import ClusterSnapshot
from router.frontends import LOAD_FIELDS, LiveFrontend, LoadCounters


@dataclass(frozen=True, slots=True)
class TrafficSample:
    """One model's traffic over one interval (means are None when no request finished in it)."""

    duration_s: float
    arrived: int
    finished: int
    isl: float | None
    osl: float | None
    ttft_s: float | None
    itl_s: float | None
    #: The context the interval's decode steps held, weighted by tokens (router.frontends.LoadCounters);
    #: None: no token generated, or counters from a frontend that does not count it.
    context: float | None = None

    @property
    def rate(self) -> float:
        """Requests routed per second."""
        return self.arrived / self.duration_s if self.duration_s > 0 else 0.0


def sample_of(delta: LoadCounters, duration_s: float) -> TrafficSample:
    return TrafficSample(
        duration_s=duration_s, arrived=delta.arrived, finished=delta.finished,
        isl=delta.input_tokens / delta.finished if delta.finished else None,
        osl=delta.output_tokens / delta.finished if delta.finished else None,
        ttft_s=delta.ttft_s / delta.ttft_n if delta.ttft_n else None,
        itl_s=delta.decode_s / delta.gaps if delta.gaps else None,
        context=delta.context_tokens / delta.output_tokens if delta.output_tokens and delta.context_tokens else None)


def _minus(a: LoadCounters, b: LoadCounters) -> LoadCounters:
    out = LoadCounters()
    for name in LOAD_FIELDS:
        setattr(out, name, max(getattr(a, name) - getattr(b, name), 0))
    return out


def _add(into: LoadCounters, other: LoadCounters) -> None:
    for name in LOAD_FIELDS:
        setattr(into, name, getattr(into, name) + getattr(other, name))


class TrafficMeter:
    """Differences the frontends' counters between readings (see the module's docstring)."""

    def __init__(self) -> None:
        self._last: dict[str, dict[str, LoadCounters]] = {}
        self._last_at: float | None = None

    def read(self, frontends: Iterable[LiveFrontend], now: float) -> dict[str, TrafficSample] | None:
        """The traffic per model since the last reading; None at the first (it only sets the baseline)."""
        current = _counters(frontends)
        last, last_at = self._last, self._last_at
        self._last = {fid: counters for fid, (_, counters) in current.items()}
        self._last_at = now
        return None if last_at is None else _since(current, last, last_at, now)

    def peek(self, frontends: Iterable[LiveFrontend], now: float) -> dict[str, TrafficSample] | None:
        """The traffic per model since the last reading, leaving that reading the baseline (the fast path's
        look at the interval so far); None before the first reading."""
        if self._last_at is None:
            return None
        return _since(_counters(frontends), self._last, self._last_at, now)


def _counters(frontends: Iterable[LiveFrontend]) -> dict[str, tuple[float, dict[str, LoadCounters]]]:
    return {f.record.frontend_id: (f.record.started_at, {m: LoadCounters.from_list(v) for m, v in f.record.load.items()})
            for f in frontends}


def _since(current: dict[str, tuple[float, dict[str, LoadCounters]]], last: dict[str, dict[str, LoadCounters]],
           last_at: float, now: float) -> dict[str, TrafficSample]:
    totals: dict[str, LoadCounters] = {}
    for fid, (started_at, counters) in current.items():
        before = last.get(fid)
        if before is None and started_at < last_at:
            continue  # it was live but unseen (Redis was away): its counters hold more than this interval
        for model, now_counters in counters.items():
            delta = _minus(now_counters, before.get(model, LoadCounters())) if before else now_counters
            _add(totals.setdefault(model, LoadCounters()), delta)
    duration = max(now - last_at, 1e-6)
    return {model: sample_of(delta, duration) for model, delta in totals.items()}


@dataclass(frozen=True, slots=True)
class PoolState:
    """One pool as its workers' leases show it."""

    ref: PoolRef
    #: Workers taking requests, and workers draining (still finishing theirs).
    workers: int
    draining: int = 0
    #: Requests the engines run and hold waiting, and tasks waiting in the pool's and the workers' queues.
    running: int = 0
    waiting: int = 0
    queued: int = 0
    #: Mean KV usage (active / total blocks) over the workers taking requests.
    kv_usage: float = 0.0
    #: The workers' own step-time models (workers.timing_model), those that published one.
    timings: tuple[TimingModel, ...] = field(default=())

    @property
    def pending(self) -> int:
        """Requests not yet running: in the engines' waiting lists and in the queues."""
        return self.waiting + self.queued


def pool_states(snapshot: ClusterSnapshot, pool_queued: dict[PoolRef, int]) -> dict[PoolRef, PoolState]:
    """The state of each pool of ``pool_queued`` (the tasks waiting in each pool's shared queue, read apart:
    a pool without a live worker has no queue in the snapshot); a pool without a live worker is there,
    with 0 workers."""
    wanted = set(pool_queued)
    acc: dict[PoolRef, dict[str, list[Any]]] = {ref: {"live": [], "draining": []} for ref in wanted}
    for w in snapshot.workers:
        ref = PoolRef(w.record.model, w.record.pool)
        if ref in acc:
            acc[ref]["draining" if w.load.draining else "live"].append(w)
    depth = snapshot.queue_messages
    out: dict[PoolRef, PoolState] = {}
    for ref, groups in acc.items():
        live, draining = groups["live"], groups["draining"]
        own_queues = {w.record.queue for w in live}
        timings = tuple(t for t in (TimingModel.decode_text(w.load.timing) for w in live) if t is not None)
        out[ref] = PoolState(
            ref=ref, workers=len(live), draining=len(draining),
            running=sum(w.load.running for w in live), waiting=sum(w.load.waiting for w in live),
            queued=pool_queued[ref] + sum(depth.get(q, 0) for q in own_queues),
            kv_usage=sum(w.load.kv_usage for w in live) / len(live) if live else 0.0,
            timings=timings)
    return out
