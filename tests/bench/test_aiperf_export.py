"""Reading aiperf's exports into the bench's rows, on exports recorded from a real `make
bench-aiperf` run (aiperf 0.13.0, a sweep over concurrency 1 and 8 of a private mocker stack;
trimmed to the metrics and settings they need): a later aiperf that renames what the rows read
fails here. Neither installs nor runs aiperf."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.aiperf_bench import _parser, aiperf_command, aiperf_env
from bench.aiperf_export import AiperfExportError, AiperfRow, aiperf_version, parse_export, read_rows

RECORDED = Path(__file__).parent / "data" / "aiperf"


def _export(concurrency: int) -> dict:
    return json.loads((RECORDED / f"concurrency_{concurrency}" / "profile_export_aiperf.json").read_text())


def test_a_sweep_gives_one_row_per_level_with_the_recorded_figures() -> None:
    assert read_rows(RECORDED) == [
        AiperfRow(concurrency=1, requests=12, errors=0, duration_s=5.071490304,
                  request_throughput=2.3568258572050165, output_token_throughput=150.83685486112105,
                  ttft_ms_p50=34.2943415, ttft_ms_p99=46.039009539999995,
                  itl_ms_p50=5.959747023809524, itl_ms_p99=6.383529022380952, isl_avg=330.0, osl_avg=64.0),
        AiperfRow(concurrency=8, requests=59, errors=0, duration_s=5.48575744,
                  request_throughput=10.741793383963449, output_token_throughput=687.4747765736607,
                  ttft_ms_p50=105.643017, ttft_ms_p99=201.86309284000006,
                  itl_ms_p50=8.765743460317461, itl_ms_p99=10.432858465714284, isl_avg=330.0, osl_avg=64.0),
    ]
    assert aiperf_version(RECORDED) == "0.13.0"


def test_a_single_level_exports_at_the_top_of_the_artifact_directory(tmp_path: Path) -> None:
    shutil.copy(RECORDED / "concurrency_8" / "profile_export_aiperf.json", tmp_path)
    (tmp_path / "phases" / "profiling").mkdir(parents=True)  # aiperf's per-phase copies are not runs
    shutil.copy(RECORDED / "concurrency_1" / "profile_export_aiperf.json", tmp_path / "phases" / "profiling")
    assert [r.concurrency for r in read_rows(tmp_path)] == [8]


def test_failed_requests_are_counted_when_aiperf_reports_them() -> None:
    export = _export(8)
    assert parse_export(export).errors == 0  # aiperf leaves the metric out when nothing failed
    export["error_request_count"] = {"unit": "requests", "avg": 3.0}
    assert parse_export(export).errors == 3


@pytest.mark.parametrize("change", [
    lambda e: e.pop("time_to_first_token"),
    lambda e: e["inter_token_latency"].pop("p99"),
    lambda e: e["request_throughput"].update(unit="requests/min"),
    lambda e: e["input_config"].update(phases=[p for p in e["input_config"]["phases"] if p["kind"] != "profiling"]),
])
def test_an_export_of_another_shape_is_refused(change) -> None:  # noqa: ANN001
    export = _export(1)
    change(export)
    with pytest.raises(AiperfExportError):
        parse_export(export)


def test_no_export_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AiperfExportError, match="no profile_export_aiperf.json"):
        read_rows(tmp_path)


def test_the_command_profiles_the_streaming_chat_endpoint_with_the_local_tokenizer(tmp_path: Path) -> None:
    args = _parser().parse_args(["--concurrency", "2", "16"])
    cmd = aiperf_command(args, "http://127.0.0.1:8000", tmp_path, ["--api-key", "sk-x"])
    assert cmd[1] == "profile" and "--streaming" in cmd
    assert cmd[cmd.index("--endpoint-type") + 1] == "chat"
    assert cmd[cmd.index("--tokenizer") + 1] == str(tmp_path)
    assert cmd[cmd.index("--concurrency") + 1] == "2,16"
    assert cmd[cmd.index("--model") + 1] == "smollm2"
    assert Path(cmd[cmd.index("--artifact-dir") + 1]).parts[-3:] == ("bench", "results", "aiperf")
    assert cmd[-2:] == ["--api-key", "sk-x"]


def test_aiperf_runs_without_the_offline_switch_that_breaks_local_tokenizers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = aiperf_env()
    assert "HF_HUB_OFFLINE" not in env
    assert env["HF_ENDPOINT"].startswith("http://127.0.0.1:")
