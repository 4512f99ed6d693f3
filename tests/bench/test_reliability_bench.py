"""The reliability bench at toy size, every part in one run: real Redis, a frontend and mocker
workers as subprocesses; the figures the bench reports hold what the platform promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reliability_bench import main

pytestmark = pytest.mark.e2e

TOY = ["--requests", "4", "--max-tokens", "100", "--kill-after", "5",
       "--soak-seconds", "3", "--concurrency", "16", "--soak-warmup", "1", "--soak-speedup", "1",
       "--soak-max-tokens", "8",
       "--restarts", "1", "--outage-s", "0.5", "--streams", "2", "--stream-tokens", "200",
       "--settle-s", "1"]


def test_every_part_runs_and_reports(tmp_path: Path) -> None:
    out = main([*TOY, "--out", str(tmp_path / "reliability.json")])
    assert json.loads((tmp_path / "reliability.json").read_text())["parts"] == ["migration", "soak", "redis"]

    mig = out["migration"]
    assert mig["errors"] == 0 and mig["reference_errors"] == 0
    assert mig["migrations"] == 2  # the victim's two requests, one mid-stream, one not yet started
    assert mig["token_exact"] == mig["compared"] == 4
    groups = {g["group"]: g for g in mig["groups"]}
    assert groups["migrated mid-stream"]["streams"] == groups["migrated before its first token"]["streams"] == 1
    # A migration waits for the lost worker's lease (3 s) to expire.
    assert groups["migrated mid-stream"]["longest_pause_ms"]["p50"] > 1000
    assert groups["migrated before its first token"]["extra_ttft_ms"]["p50"] > 1000

    soak = out["soak"]
    assert soak["errors"] == 0 and soak["requests"] >= 16
    assert soak["measured_requests"] > 0 and soak["rss_warm_mib"] > 0 and soak["rss_end_mib"] > 0

    rr = out["redis"]
    assert len(rr["recovery_s"]["each"]) == 1
    assert rr["outage_probes"] > 0
    assert rr["outage_503"] == rr["outage_503_with_retry_after"] == rr["outage_probes"]
