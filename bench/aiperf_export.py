"""Reading what ``aiperf profile`` exports: one :class:`AiperfRow` per profiled concurrency.

Usage::

    rows = read_rows(Path("bench/results/aiperf"))

aiperf writes its summary of a run to ``profile_export_aiperf.json`` in the artifact directory,
or, when ``--concurrency`` lists several levels (a sweep), to ``concurrency_<N>/`` below it, one
directory per level; ``phases/`` and ``aggregate/`` hold per-phase and cross-run copies, not read
here. The file (schema 1.4 in aiperf 0.13.0) maps each metric's tag to ``{"unit", "avg", "p50",
"p99", ...}``; ``input_config.phases`` holds the phase settings (the profiling phase's
``concurrency``); ``error_request_count`` appears only when some request failed.
``tests/bench/test_aiperf_export.py`` reads a recorded 0.13.0 export, so a change of these names
in a later aiperf fails there first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXPORT_NAME = "profile_export_aiperf.json"


class AiperfExportError(ValueError):
    """An export lacks what a row needs (an aiperf whose schema differs from 0.13.0's)."""


@dataclass(frozen=True, slots=True)
class AiperfRow:
    """One profiled concurrency level; latencies in ms, throughputs per second of the run."""

    concurrency: int
    requests: int
    errors: int
    duration_s: float
    request_throughput: float
    output_token_throughput: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_p50: float
    itl_ms_p99: float
    isl_avg: float
    osl_avg: float


def _metric(export: dict[str, Any], tag: str, stat: str, unit: str) -> float:
    try:
        metric = export[tag]
        value = metric[stat]
    except (KeyError, TypeError):
        raise AiperfExportError(f"the export has no {tag}.{stat}") from None
    if metric.get("unit") != unit:
        raise AiperfExportError(f"{tag} is in {metric.get('unit')!r}, expected {unit!r}")
    return float(value)


def _profiling_concurrency(export: dict[str, Any]) -> int:
    phases = export.get("input_config", {}).get("phases", [])
    for phase in phases:
        if phase.get("kind") == "profiling" and phase.get("concurrency") is not None:
            return int(phase["concurrency"])
    raise AiperfExportError("the export names no profiling phase with a concurrency")


def parse_export(export: dict[str, Any]) -> AiperfRow:
    """The row of one ``profile_export_aiperf.json``, already decoded."""
    errors = export.get("error_request_count", {}).get("avg", 0)
    return AiperfRow(
        concurrency=_profiling_concurrency(export),
        requests=int(_metric(export, "request_count", "avg", "requests")),
        errors=int(errors),
        duration_s=_metric(export, "benchmark_duration", "avg", "sec"),
        request_throughput=_metric(export, "request_throughput", "avg", "requests/sec"),
        output_token_throughput=_metric(export, "output_token_throughput", "avg", "tokens/sec"),
        ttft_ms_p50=_metric(export, "time_to_first_token", "p50", "ms"),
        ttft_ms_p99=_metric(export, "time_to_first_token", "p99", "ms"),
        itl_ms_p50=_metric(export, "inter_token_latency", "p50", "ms"),
        itl_ms_p99=_metric(export, "inter_token_latency", "p99", "ms"),
        isl_avg=_metric(export, "input_sequence_length", "avg", "tokens"),
        osl_avg=_metric(export, "output_sequence_length", "avg", "tokens"),
    )


def export_files(artifacts: Path) -> list[Path]:
    """The run summaries under ``artifacts``: its own (one level) and its subdirectories' (a sweep)."""
    return sorted([*artifacts.glob(EXPORT_NAME), *artifacts.glob(f"*/{EXPORT_NAME}")])


def read_rows(artifacts: Path) -> list[AiperfRow]:
    """Every level's row, by concurrency; fails when aiperf exported nothing there."""
    files = export_files(artifacts)
    if not files:
        raise AiperfExportError(f"no {EXPORT_NAME} under {artifacts}")
    return sorted((parse_export(json.loads(f.read_text())) for f in files), key=lambda r: r.concurrency)


def aiperf_version(artifacts: Path) -> str | None:
    """The aiperf release that wrote the exports (every export names it)."""
    for f in export_files(artifacts):
        return json.loads(f.read_text()).get("aiperf_version")
    return None
