"""Dynamo 1.6.1's planner, driven tick by tick on a load trace: runs only in a Dynamo venv.

    python bench/planner_dynamo_replay.py < request.json > decisions.json

Started by ``bench.planner_dynamo`` (which writes the request and the profile files); this file
imports ``dynamo.planner`` and nothing of Sluice's, so the Sluice venv never imports Dynamo.

What runs is Dynamo's own offline replay entry point, the one its Rust replay loop calls:
``dynamo.planner.offline.replay_adapter.create_replay_planner_adapter`` (the builtin
``LocalPlannerOrchestrator`` with its load-predict and throughput-propose plugins, the
``PlannerScalingState`` throughput mixin, its GPU budget and endpoint floors), bootstrapped the way
``dynamo.replay.planner.prepare_planner_replay`` does: ``advisory=True``, worker capabilities per
pool, then ``adapter.install_benchmark_fpms`` with FPMs made by Dynamo's own profile-file reader
``dynamo.planner.monitoring.perf_metrics._convert_profiling_data_to_fpms`` (its "thorough mode",
``profile_results_dir``). Here, not Rust, plays the replay loop: before each tick it hands the
adapter ``result['traffic']`` (the trace's requests, mean ISL and OSL over the time since the last
tick) and the pool sizes, which follow each decision at once (no start-up delay); no forward-pass
metrics (the trace has none), so the planner's online FPM tuning never runs.

Why a shim: ``dynamo.planner.core.perf_model`` imports ``aisimulate_core`` at module level, and 1.6.1
pins ``aisimulate==0.13.0``, an sdist stub (``wheel_stub``) that downloads the real wheel from
NVIDIA's own index at install time, unreachable here. Its predecessor ``aiconfigurator-core==0.12.0``
(on PyPI, NVIDIA's same Rust estimator before the rename) has the same ``RustForwardPassPerfModel``
instance API that Dynamo's ``engine_query`` calls (``estimate_forward_pass_time_ms``,
``tune_with_fpms``, ``diagnostics``). :func:`install_aisimulate_core_shim` registers an
``aisimulate_core`` module whose ``RustForwardPassPerfModel.best_available(config)`` answers
Dynamo's only un-profiled request, ``estimation_mode="fpm_regression"``, with
``aiconfigurator_core``'s ``from_regression(options)``, passing the options Dynamo builds
(``max_observations``, ``min_observations``, ``bucket_count``, ``max_num_tokens``,
``max_batch_size``, ``max_kv_tokens``) unchanged. Any other estimation mode raises ImportError,
which Dynamo treats as "perf model unavailable".

Request (stdin, JSON): ``mode`` ("disagg" | "agg"), ``ttft_ms``, ``itl_ms``, ``interval_s``
(integer), ``trace`` ([{duration_s, rate, isl, osl}], every duration ``interval_s``),
``profile_dir`` (Dynamo's profile files), ``capabilities`` ({max_num_batched_tokens,
max_num_seqs, max_kv_tokens, block_size}), ``initial`` ({prefill, decode}), ``min_endpoint``,
``max_gpu_budget`` (-1: none), ``max_step`` (Dynamo's ``max_throughput_scaling_replicas``),
``load_predictor``. Reply (stdout, JSON): ``ticks`` (each tick's time, traffic, pool sizes before and after, and Dynamo's
own diagnostics: predicted load, one engine's sustainable req/s per pool, decision reason) and
``bootstrap`` (FPM counts, perf-model diagnostics).
"""

from __future__ import annotations

import json
import logging
import sys
import types
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class _ForwardPassPerfModelConfig:
    """The fields of aisimulate_core's config that Dynamo's ``ais_adapter`` reads or writes."""

    model: str
    system: str
    backend: str
    worker_type: str
    estimation_mode: str = "fpm_regression"
    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    kv_block_size: int | None = None
    nextn: int = 0
    estimator_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_legacy_engine_config(
        cls, legacy: dict[str, Any], worker_type: str, options: dict[str, Any]
    ) -> types.SimpleNamespace:
        return types.SimpleNamespace(estimator_config={"legacy_options": dict(options)})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _RustForwardPassPerfModel:
    @staticmethod
    def best_available(config: dict[str, Any]) -> Any:
        from aiconfigurator_core.sdk import RustForwardPassPerfModel

        if config.get("estimation_mode") != "fpm_regression":
            raise ImportError(
                f"estimation_mode {config.get('estimation_mode')!r} needs aisimulate, not installed"
            )
        return RustForwardPassPerfModel.from_regression(config["estimator_config"]["legacy_options"])


def install_aisimulate_core_shim() -> None:
    """Register ``aisimulate_core``, ``.sdk`` and ``._native`` unless the real package imports."""
    try:
        import aisimulate_core.sdk  # noqa: F401

        return
    except ImportError:
        pass
    root, sdk, native = (types.ModuleType(n) for n in ("aisimulate_core", "aisimulate_core.sdk", "aisimulate_core._native"))
    sdk.ForwardPassPerfModelConfig = _ForwardPassPerfModelConfig  # type: ignore[attr-defined]
    sdk.RustForwardPassPerfModel = _RustForwardPassPerfModel  # type: ignore[attr-defined]
    native.RustForwardPassPerfModel = _RustForwardPassPerfModel  # type: ignore[attr-defined]
    root.sdk, root._native = sdk, native  # type: ignore[attr-defined]
    root.__path__ = []
    sys.modules.update({"aisimulate_core": root, "aisimulate_core.sdk": sdk, "aisimulate_core._native": native})


def _window(trace: list[dict[str, float]], start_s: float, end_s: float) -> dict[str, float]:
    """The trace's traffic in [start_s, end_s): requests (rate x overlap), request-weighted ISL/OSL."""
    num = isl = osl = 0.0
    t = 0.0
    for it in trace:
        overlap = max(0.0, min(end_s, t + it["duration_s"]) - max(start_s, t))
        n = it["rate"] * overlap
        num, isl, osl = num + n, isl + n * it["isl"], osl + n * it["osl"]
        t += it["duration_s"]
    return {
        "duration_s": end_s - start_s,
        "num_req": num,
        "shape_count": num,
        "avg_isl": isl / num if num else 0.0,
        "avg_osl": osl / num if num else 0.0,
    }


def run(req: dict[str, Any]) -> dict[str, Any]:
    install_aisimulate_core_shim()
    from dynamo.planner.config.defaults import SubComponentType
    from dynamo.planner.config.planner_config import PlannerConfig
    from dynamo.planner.core.types import EngineCapabilities, WorkerCapabilities
    from dynamo.planner.monitoring.perf_metrics import _convert_profiling_data_to_fpms
    from dynamo.planner.offline.replay_adapter import create_replay_planner_adapter

    mode, caps_in = req["mode"], req["capabilities"]
    config = PlannerConfig(
        mode=mode,
        environment="virtual",
        backend="mocker",
        optimization_target="sla",
        enable_throughput_scaling=True,
        enable_load_scaling=False,
        advisory=True,
        ttft_ms=req["ttft_ms"],
        itl_ms=req["itl_ms"],
        throughput_adjustment_interval_seconds=req["interval_s"],
        load_adjustment_interval_seconds=req["interval_s"],  # load scaling is off; the pipeline
        scheduling={"scale_interval_seconds": float(req["interval_s"])},  # ticks once an interval
        load_predictor=req["load_predictor"],
        min_endpoint=req["min_endpoint"],
        max_gpu_budget=req["max_gpu_budget"],
        max_throughput_scaling_replicas=req["max_step"],
        prefill_engine_num_gpu=1,
        decode_engine_num_gpu=1,
        profile_results_dir=req["profile_dir"],
        metric_reporting_prometheus_port=0,
        control_api_port=0,
        served_model_name="sluice-bench",
    )

    def engine() -> EngineCapabilities:
        return EngineCapabilities(
            num_gpu=1,
            max_num_batched_tokens=caps_in["max_num_batched_tokens"],
            max_num_seqs=caps_in["max_num_seqs"],
            max_kv_tokens=caps_in["max_kv_tokens"],
            kv_cache_block_size=caps_in["block_size"],
        )

    disagg = mode == "disagg"
    caps = WorkerCapabilities(prefill=engine(), decode=engine()) if disagg else WorkerCapabilities(decode=engine())
    adapter = create_replay_planner_adapter(planner_config=config, capabilities=caps, capture_details=False)
    prefill_fpms = _convert_profiling_data_to_fpms(req["profile_dir"], SubComponentType.PREFILL)
    decode_fpms = _convert_profiling_data_to_fpms(req["profile_dir"], SubComponentType.DECODE)
    if disagg:
        adapter.install_benchmark_fpms(prefill_fpms=prefill_fpms, decode_fpms=decode_fpms)
    else:  # as dynamo.replay.planner does for agg: both benchmark sets into the one regression
        adapter.install_benchmark_fpms(agg_fpms=prefill_fpms + decode_fpms)

    seen: list[Any] = []
    tick_engine = adapter._engine.tick  # private: wrapped only to read each tick's diagnostics

    async def tick_and_record(tick: Any, tick_input: Any) -> Any:
        effects = await tick_engine(tick, tick_input)
        seen.append(effects.diagnostics)
        return effects

    adapter._engine.tick = tick_and_record

    trace = req["trace"]
    end_s = sum(it["duration_s"] for it in trace)
    counts = {"prefill": req["initial"]["prefill"] if disagg else 0, "decode": req["initial"]["decode"]}
    ticks: list[dict[str, Any]] = []
    with adapter:
        at_ms = adapter.initial_tick_ms()
        last_s = 0.0
        ordinal = 0
        while at_ms is not None and at_ms / 1000.0 <= end_s + 1e-9:
            now_s = at_ms / 1000.0
            traffic = _window(trace, last_s, now_s)
            ids = {k: list(range(v)) for k, v in counts.items()}
            decision = adapter.on_tick(
                {
                    "tick_ordinal": ordinal,
                    "now_ms": at_ms,
                    "active_prefill_count": counts["prefill"],
                    "active_decode_count": counts["decode"],
                    "active_prefill_ids": ids["prefill"],
                    "active_decode_ids": ids["decode"],
                    "prefill_fpm_snapshots": [],
                    "decode_fpm_snapshots": [],
                    "traffic": traffic,
                }
            )
            before = dict(counts)
            if decision["target_prefill"] is not None and disagg:
                counts["prefill"] = decision["target_prefill"]
            if decision["target_decode"] is not None:
                counts["decode"] = decision["target_decode"]
            diag = seen[-1]
            ticks.append({
                "at_s": now_s, "traffic": traffic, "before": before, "after": dict(counts),
                "predicted": {"num_req": diag.predicted_num_req, "isl": diag.predicted_isl, "osl": diag.predicted_osl},
                "engine_rps": {"prefill": diag.engine_rps_prefill, "decode": diag.engine_rps_decode},
                "reason": {"all": diag.throughput_decision_reason, "prefill": diag.throughput_decision_reason_prefill,
                           "decode": diag.throughput_decision_reason_decode},
            })
            last_s, ordinal, at_ms = now_s, ordinal + 1, decision["next_tick_ms"]
        diagnostics = _perf_model_diagnostics(adapter, disagg)
    return {
        "ticks": ticks,
        "bootstrap": {
            "prefill_fpms": len(prefill_fpms),
            "decode_fpms": len(decode_fpms),
            "perf_model": diagnostics,
        },
    }


def _perf_model_diagnostics(adapter: Any, disagg: bool) -> dict[str, Any]:
    """Each regression's readiness, read through Dynamo's orchestrator (private, best effort)."""
    out: dict[str, Any] = {}
    orchestrator = getattr(adapter._engine, "_orchestrator", None)
    for role in ("prefill", "decode") if disagg else ("agg",):
        model = orchestrator.get_regression(role) if orchestrator is not None else None
        engine_model = getattr(model, "_engine_model", None)
        out[role] = engine_model.diagnostics() if engine_model is not None else None
    return out


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    json.dump(run(json.load(sys.stdin)), sys.stdout)


if __name__ == "__main__":
    main()
