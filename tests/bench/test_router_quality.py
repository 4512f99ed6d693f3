"""The routing-quality bench on the virtual clock, at toy size: real Redis, KvPolicy, KV relay and mockers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.chat_workloads import shared_workload
from bench.devstack import RedisServer
from bench.router_quality import main, run_policy, simulate
from core.settings import MockerSettings, RouterSettings

MOCKER = MockerSettings(kv_blocks=1024, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192)
TOY = ["--workers", "2", "--users-per-worker", "4", "--turns", "4", "--duration-s", "5", "--unique-per-worker", "4",
       "--seeds", "7", "8", "--extra-kv-weights"]


def _toy_shared(seed: int):  # noqa: ANN202
    return shared_workload(2, seed, users_per_worker=4, turns=4, duration_s=5, system_tokens=1500, users_per_system=8,
                           first_tokens=(1000, 6000), user_tokens=(50, 500), output_tokens=(100, 300), think_s=6.0)


def test_the_bench_serves_every_request_and_kv_hits_more_on_shared_prefixes(tmp_path: Path) -> None:
    out = main([*TOY, "--out", str(tmp_path / "quality.json")])
    results = out["results"]
    assert {(r["workload"], r["policy"], r["seed"]) for r in results} == {
        (w, p, s) for w in ("shared", "unique") for p in ("kv", "round_robin", "random", "least_loaded", "oracle") for s in (7, 8)}
    for r in results:
        expected = sum(map(len, _toy_shared(r["seed"]).conversations)) if r["workload"] == "shared" else 2 * 4
        assert r["requests"] == expected
        assert 0.0 <= r["hit_ratio"] <= 1.0
        assert r["ttft_mean_ms"] >= r["ttft_virtual_mean_ms"] > 16.5  # at least one prefill step
        if r["workload"] == "unique":
            assert r["hit_ratio"] == 0.0
    hit = {(r["workload"], r["policy"], r["seed"]): r["hit_ratio"] for r in results}
    for seed in (7, 8):
        assert hit[("shared", "kv", seed)] > hit[("shared", "round_robin", seed)]
    shared = out["targets"]["2"]["kv"]["shared_kv_over_round_robin_ttft"]
    assert set(shared["per_seed"]) == {"7", "8"}
    assert shared["mean"] == pytest.approx(sum(shared["per_seed"].values()) / 2)
    assert json.loads((tmp_path / "quality.json").read_text())["targets"] == out["targets"]


def test_a_run_repeats_exactly(bench_redis: RedisServer) -> None:
    """Same trace, same seed: the same decisions, cache hits and virtual TTFTs (the run's digest)."""
    runs = [simulate(bench_redis.url, "kv", _toy_shared(7), 2, MOCKER, 7, RouterSettings()) for _ in range(2)]
    assert runs[0]["digest"] == runs[1]["digest"]
    assert runs[0]["ttft_virtual_mean_ms"] == runs[1]["ttft_virtual_mean_ms"]


async def test_run_policy_refuses_a_real_time_loop(bench_redis: RedisServer) -> None:
    with pytest.raises(TypeError, match="VirtualClockLoop"):
        await run_policy(bench_redis.url, "kv", _toy_shared(7), 2, MOCKER, 7, RouterSettings())
