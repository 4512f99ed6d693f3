"""What the planner decided and why, as it is logged, exported and kept in Redis (``Keys.planner_decisions``,
read by ``sluice planner status``, ``sluice status`` and an external orchestrator with the virtual
connector), and the state a restarted planner resumes from (``Keys.planner_state``)."""

from __future__ import annotations

import msgspec


class Traffic(msgspec.Struct, frozen=True, omit_defaults=True):
    """One model's load: observed over the last interval, or predicted for the next."""

    rate: float
    isl: float | None = None
    osl: float | None = None
    ttft_s: float | None = None
    itl_s: float | None = None
    #: The decode's token-weighted context (planner.observe.TrafficSample.context).
    context: float | None = None


class ModelView(msgspec.Struct, frozen=True, omit_defaults=True):
    model: str
    observed: Traffic | None = None
    predicted: Traffic | None = None
    #: ``sla`` mode: observed over expected TTFT and ITL, and the workers' step-time models over the
    #: profile's (planner.modes.Corrections; 1.0: the profile holds).
    prefill_correction: float = 1.0
    decode_correction: float = 1.0
    prefill_model_correction: float = 1.0
    decode_model_correction: float = 1.0


class PoolDecision(msgspec.Struct, frozen=True, omit_defaults=True):
    model: str
    pool: str
    #: Workers taking requests and draining, and what the connector had been asked for.
    live: int
    draining: int
    requested: int
    #: What the mode wanted, and what the planner asked for after bounds, hysteresis and the budget.
    wanted: int
    target: int
    #: ``up``, ``down`` or ``hold``.
    action: str
    reason: str
    kv_usage: float = 0.0
    pending: int = 0
    expected_ttft_s: float | None = None
    expected_itl_s: float | None = None
    #: A size the pool was held from this tick: the floor within the cooldown of a shrink, or a growth
    #: the budget cut (a fast tick is kept for these as for an action, so a run's record tells which
    #: rule acted); None: nothing held.
    held: int | None = None


class Decision(msgspec.Struct, frozen=True, omit_defaults=True):
    at: float
    #: ``interval`` (an adjustment) or ``fast`` (the burst path between adjustments).
    kind: str
    mode: str
    connector: str
    tick: int
    models: list[ModelView]
    pools: list[PoolDecision]
    version: int = 1

    @property
    def actions(self) -> list[PoolDecision]:
        return [p for p in self.pools if p.action != "hold"]

    @property
    def holds(self) -> list[PoolDecision]:
        return [p for p in self.pools if p.held is not None]


class PlannerState(msgspec.Struct, omit_defaults=True):
    """What a restarted planner resumes from: the interval count, each pool's hysteresis memory, each
    model's recent observations (the predictors are fed them again) and corrections."""

    at: float = 0.0
    tick: int = 0
    #: ``model/pool`` -> [last interval it grew, the wishes of the latest intervals that wanted fewer].
    memory: dict[str, tuple[int, list[int]]] = msgspec.field(default_factory=dict)
    #: ``model/pool`` -> [the last interval it shrank, the size it shrank from] (absent from an older state: none).
    shrunk: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    #: model -> observations, oldest first, each [rate, isl or -1, osl or -1].
    history: dict[str, list[tuple[float, float, float]]] = msgspec.field(default_factory=dict)
    #: model -> the decode's context of each of those observations (-1: unknown; an older state: none).
    contexts: dict[str, list[float]] = msgspec.field(default_factory=dict)
    #: model -> its corrections: prefill, decode, prefill_model, decode_model (an older state: the first two).
    corrections: dict[str, tuple[float, ...]] = msgspec.field(default_factory=dict)
    version: int = 1


def encode(value: msgspec.Struct) -> bytes:
    return msgspec.json.encode(value)


def decode_decision(raw: bytes | str) -> Decision:
    return msgspec.json.decode(raw, type=Decision)


def decode_state(raw: bytes | str) -> PlannerState:
    return msgspec.json.decode(raw, type=PlannerState)
