"""KV tiers benchmark, the mocker part: `make bench-kvbm` (or `python -m bench.kvbm_bench`).

Four mocker workers on a virtual clock (bench.router_quality's harness: the real scheduler, paged KV
cache, KV relay, Redis prefix index and routing script; model time is the loop's time) replay a
multi-turn, long-context chat whose working set is several times the fleet's device KV: conversations
come back after think times long enough for other traffic to have evicted them. The same trace runs with

* ``off``: no tiers (what Sluice did before);
* ``host``, ``host+disk``, ``host+disk+shared``: the tiers of workers.kvbm under every mocker (real
  stores of stand-in blocks: the host tier in memory, the disk tier in a temporary directory per worker,
  the shared tier in the benchmark's Redis), onboard time simulated from the tiers' bandwidths and
  latencies (core.settings.KvbmSettings, printed with the results), routed as the deployment routes;
* ``all tiers, half credit`` and ``all tiers, full credit``: the same tiers, the router crediting the
  blocks they hold by half or all of each worker's published credit (``tier_credit_scale`` 0.5 and 1;
  the deployment's default, 0, weighs device blocks only, as every other row does), to show what the
  credit buys;
* ``all tiers, time cost``: the same tiers routed with the ``time`` cost (router.time_cost), device blocks
  alone credited, and ``all tiers, time cost, half credit``: that cost with half the tiers' credit;
* ``host+disk, time cost`` and ``host+disk, time cost, half credit``: the same two routings with the local
  tiers alone (no shared tier: only the worker that offloaded a block can onboard it);
* ``all tiers, oracle`` and ``host+disk, oracle``: the same tiers routed by a reference no router could run
  (bench.oracle_policy: each engine's real cache and queue, the shortest predicted first step), counting
  device blocks alone, and ``..., oracle, tiers``: the same reference also counting what each engine's tiers
  would onboard and the read's time, to show what knowing the tiers can buy a router on this trace;

and the routing-quality workload of bench.router_quality (its defaults: a cache that holds the working
set better) with all tiers, routed on device blocks alone and with half and full credit.

Reports per run: TTFT mean, p90 and mean over return turns (every turn after a conversation's first),
the share of prompt tokens cached or onboarded, blocks onboarded per tier, output tokens per model second,
and a digest (repeated runs reproduce it). Prints a table and the ratios against ``off`` and against
``host+disk+shared`` (the same tiers, device blocks alone credited); writes bench/results/kvbm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import redis
from rich.console import Console
from rich.table import Table

from bench.chat_workloads import shared_workload, working_set_tokens
from bench.devstack import RedisServer
from bench.router_quality import TierSetup, simulate
from bench.virtual_clock import VirtualClockLoop
from core.messages import SamplingParams
from core.settings import KvbmSettings, MockerSettings, RouterSettings
from workers.engines.base import EngineRequest
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.tiers import MockerTiers
from workers.kvbm.frame import frame_size
from workers.kvbm.tiers import KvTiers

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = ("off", "host", "host+disk", "host+disk+shared", "all tiers, half credit", "all tiers, full credit",
           "all tiers, time cost", "all tiers, time cost, half credit", "host+disk, time cost",
           "host+disk, time cost, half credit", "all tiers, oracle", "all tiers, oracle, tiers", "host+disk, oracle",
           "host+disk, oracle, tiers")
#: The rows routed by a reference no router could run (bench.oracle_policy: the engines' real state, the
#: shortest predicted first step), without and with what each engine's tiers would onboard: whether
#: knowing the tiers can pay on this trace at all. The others route with the ``kv`` policy.
POLICY = {"all tiers, oracle": "oracle", "all tiers, oracle, tiers": "oracle, tiers",
          "host+disk, oracle": "oracle", "host+disk, oracle, tiers": "oracle, tiers"}
#: The routing of the rows that change it (RouterSettings fields); the others route as the deployment
#: does (the block cost, device blocks alone credited).
ROUTING: dict[str, dict[str, Any]] = {
    "all tiers, half credit": {"tier_credit_scale": 0.5},
    "all tiers, full credit": {"tier_credit_scale": 1.0},
    "all tiers, time cost": {"cost": "time"},
    "all tiers, time cost, half credit": {"cost": "time", "tier_credit_scale": 0.5},
    "host+disk, time cost": {"cost": "time"},
    "host+disk, time cost, half credit": {"cost": "time", "tier_credit_scale": 0.5},
}


def _tiers(name: str, kvbm: KvbmSettings) -> TierSetup | None:
    if name == "off":
        return None
    presets: dict[str, dict[str, Any]] = {"host": {"disk_bytes": 0, "redis_url": None}, "host+disk": {"redis_url": None}}
    on = presets.get(name.split(",")[0], {})
    return TierSetup(kvbm.model_copy(update=on))


def _router(name: str) -> RouterSettings:
    """The deployment's routing, changed as the row says (:data:`ROUTING`)."""
    return RouterSettings(**ROUTING.get(name, {}))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[7, 8])
    ap.add_argument("--kv-blocks", type=int, default=1024, help="device KV per worker (blocks of 16 tokens)")
    ap.add_argument("--host-x", type=float, default=4.0, help="host tier per worker, in device caches")
    ap.add_argument("--disk-x", type=float, default=16.0, help="disk tier per worker, in device caches")
    ap.add_argument("--users-per-worker", type=int, default=20)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--think-s", type=float, default=60.0, help="mean model seconds before a conversation returns")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--no-quality", action="store_true", help="skip the routing-quality workload")
    ap.add_argument("--out", type=Path, default=RESULTS / "kvbm.json")
    return ap


def _row(config: str, workload: str, r: dict) -> dict:
    return {"config": config, "workload": workload} | {
        k: r[k] for k in ("seed", "requests", "hit_ratio", "ttft_mean_ms", "ttft_p90_ms", "ttft_return_mean_ms",
                          "tier_hit_blocks", "output_tokens_per_model_s", "model_s", "wall_s", "digest")}


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    mocker = MockerSettings(speedup=1.0, kv_blocks=args.kv_blocks, block_size=16, max_num_seqs=256,
                            max_num_batched_tokens=8192)
    device_bytes = args.kv_blocks * frame_size(mocker.kv_bytes_per_block)
    console = Console(width=160) if not Console().is_terminal else Console()
    rows: list[dict] = []
    server = RedisServer().start()
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-kvbm-bench-") as tmp:
            kvbm = KvbmSettings(host_bytes=int(args.host_x * device_bytes), disk_dir=Path(tmp),
                                disk_bytes=int(args.disk_x * device_bytes), redis_url=server.url.replace("/0", "/1"))
            for seed in args.seeds:
                workload = shared_workload(
                    args.workers, seed, users_per_worker=args.users_per_worker, turns=args.turns,
                    duration_s=args.duration_s, system_tokens=1500, users_per_system=8, first_tokens=(1000, 4000),
                    user_tokens=(50, 500), output_tokens=(100, 300), think_s=args.think_s)
                ws = working_set_tokens(workload, 200) / (args.workers * args.kv_blocks * 16)
                console.print(f"long-context W={args.workers} seed {seed}: {sum(map(len, workload.conversations))} "
                              f"requests, working set ~{ws:.1f}x the fleet's device KV")
                for config in args.configs:
                    _fresh(server, Path(tmp))
                    r = simulate(server.url, POLICY.get(config, "kv"), workload, args.workers, mocker, seed,
                                 _router(config), tiers=_tiers(config, kvbm))
                    rows.append(_row(config, "long-context", r) | {"working_set_over_fleet_kv": ws})
                    _print(console, rows[-1])
                _fresh(server, Path(tmp))
                down = RedisServer().start()
                try:
                    stopped_at = args.duration_s / 2

                    async def stop_shared(server: RedisServer = down, at_s: float = stopped_at) -> None:
                        await asyncio.sleep(at_s)
                        server.stop()

                    r = simulate(server.url, "kv", workload, args.workers, mocker, seed, RouterSettings(),
                                 tiers=_tiers("host+disk+shared", kvbm.model_copy(update={"redis_url": down.url})),
                                 meanwhile=stop_shared)
                finally:
                    down.stop()
                rows.append(_row("shared tier stopped mid-run", "long-context", r) | {
                    "expected_requests": sum(map(len, workload.conversations)), "stopped_at_model_s": stopped_at})
                _print(console, rows[-1])
                if args.no_quality:
                    continue
                quality_mocker = mocker.model_copy(update={"kv_blocks": 4096})
                quality_bytes = 4096 * frame_size(mocker.kv_bytes_per_block)
                qkvbm = kvbm.model_copy(update={"host_bytes": int(args.host_x * quality_bytes),
                                                "disk_bytes": int(args.disk_x * quality_bytes)})
                quality = shared_workload(args.workers, seed, users_per_worker=12, turns=8, duration_s=60.0,
                                          system_tokens=1500, users_per_system=8, first_tokens=(1000, 6000),
                                          user_tokens=(50, 500), output_tokens=(100, 300), think_s=6.0)
                for config in ("off", "host+disk+shared", "all tiers, half credit", "all tiers, full credit",
                               "all tiers, time cost", "all tiers, time cost, half credit", "host+disk, time cost",
                               "host+disk, time cost, half credit"):
                    _fresh(server, Path(tmp))
                    r = simulate(server.url, "kv", quality, args.workers, quality_mocker, seed, _router(config),
                                 tiers=_tiers(config, qkvbm))
                    rows.append(_row(config, "routing-quality", r))
                    _print(console, rows[-1])
            _fresh(server, Path(tmp))
            cases = _cases(mocker.model_copy(update={"kv_blocks": 4096}), kvbm)
    finally:
        server.stop()
    ratios = _ratios(rows)
    _report(console, rows, ratios)
    console.print(f"cross-worker: next turn on another worker, {CASE_PROMPT_TOKENS}-token history: TTFT "
                  f"{cases['cross_worker']['shared tier']['ttft_ms']:.0f} ms onboarded from the shared tier against "
                  f"{cases['cross_worker']['recompute']['ttft_ms']:.0f} ms recomputed: {cases['cross_worker']['ratio']:.2f}x")
    console.print(f"restart: a known {CASE_PROMPT_TOKENS}-token prompt on a restarted worker, TTFT "
                  f"{cases['restart']['restarted_ttft_ms']:.0f} ms from its disk tier against "
                  f"{cases['restart']['cold_ttft_ms']:.0f} ms cold: {cases['restart']['ratio']:.2f}x")
    out = {"benchmark": "kvbm", "engine": "mocker", "clock": "virtual", "host": platform.node(),
           "python": platform.python_version(), "config": {k: str(v) for k, v in vars(args).items()},
           "mocker": mocker.model_dump(), "tiers": kvbm.model_dump(mode="json"), "rows": rows, "ratios": ratios, "cases": cases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {args.out}")
    return out


# ---- single-prompt cases: a conversation moved to another worker, a restarted worker --------------------
CASE_PROMPT_TOKENS = 4000


def _engine(mocker: MockerSettings, kvbm: KvbmSettings) -> MockerEngine:
    store = KvTiers(kvbm, scope=f"case-{mocker.block_size}", block_bytes=mocker.kv_bytes_per_block, inline=True)
    return MockerEngine("case-model", mocker, context_length=32_768, tiers=MockerTiers(store, mocker, kvbm))


async def _ttft_ms(engine: MockerEngine, prompt: list[int]) -> tuple[float, int]:
    """Model ms to the first token of ``prompt`` on ``engine``, and its cached (or onboarded) tokens."""
    loop = asyncio.get_running_loop()
    start, first, cached = loop.time(), None, 0
    async for out in engine.generate(EngineRequest(f"case-{random.getrandbits(32)}", prompt,
                                                   SamplingParams(max_tokens=4, ignore_eos=True))):
        if first is None and out.token_ids:
            first = loop.time()
        if out.usage is not None:
            cached = out.usage.cached_tokens
    assert first is not None
    return (first - start) * 1000, cached


async def _cross_worker(mocker: MockerSettings, kvbm: KvbmSettings) -> dict:
    """A conversation's first turn on one worker, its next on another (the first drained): with the shared
    tier the second worker onboards the history the first offloaded; without, it recomputes it."""
    rng = random.Random(11)
    history = [rng.randrange(100, 49_000) for _ in range(CASE_PROMPT_TOKENS)]
    out: dict[str, Any] = {}
    local = kvbm.model_copy(update={"disk_bytes": 0})  # the workers' disk directories would be one here
    for name, tiers in (("recompute", local.model_copy(update={"redis_url": None})), ("shared tier", local)):
        first, second = _engine(mocker, tiers), _engine(mocker, tiers)
        await first.start()
        await second.start()
        await _ttft_ms(first, history)
        ttft, cached = await _ttft_ms(second, [*history, *rng.sample(range(100, 49_000), 50)])
        out[name] = {"ttft_ms": ttft, "cached_tokens": cached}
        await first.shutdown()
        await second.shutdown()
    out["ratio"] = out["shared tier"]["ttft_ms"] / out["recompute"]["ttft_ms"]
    return out


async def _restart(mocker: MockerSettings, kvbm: KvbmSettings) -> dict:
    """A known prompt on a worker, then on the same worker restarted with its disk tier (a new engine on the
    same directory): its TTFT against the cold one."""
    prompt = [random.Random(12).randrange(100, 49_000) for _ in range(CASE_PROMPT_TOKENS)]
    disk_only = kvbm.model_copy(update={"host_bytes": 0, "redis_url": None})
    before = _engine(mocker, disk_only)
    await before.start()
    cold, _ = await _ttft_ms(before, prompt)
    await before.shutdown()
    after = _engine(mocker, disk_only)
    await after.start()
    warm, cached = await _ttft_ms(after, prompt)
    await after.shutdown()
    return {"cold_ttft_ms": cold, "restarted_ttft_ms": warm, "cached_tokens": cached, "ratio": warm / cold}


def _cases(mocker: MockerSettings, kvbm: KvbmSettings) -> dict:
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return {"cross_worker": runner.run(_cross_worker(mocker, kvbm)), "restart": runner.run(_restart(mocker, kvbm))}


def _fresh(server: RedisServer, disk_root: Path) -> None:
    """Every run starts cold: no disk tier files, no shared tier blocks."""
    for child in disk_root.iterdir():
        shutil.rmtree(child, ignore_errors=True)
    redis.Redis.from_url(server.url.replace("/0", "/1")).flushdb()


def _print(console: Console, row: dict) -> None:
    hits = " ".join(f"{t} {n}" for t, n in row["tier_hit_blocks"].items() if n)
    console.print(f"{row['workload']:15s} seed {row['seed']} {row['config']:28s} hit {row['hit_ratio']:.3f} TTFT mean "
                  f"{row['ttft_mean_ms']:.0f} p90 {row['ttft_p90_ms']:.0f} return {row['ttft_return_mean_ms']:.0f} ms "
                  f"| onboarded blocks: {hits or '-'} | {row['output_tokens_per_model_s']:.0f} tok/s "
                  f"({row['wall_s']:.0f} wall s, {row['digest']})")


def _mean(rows: list[dict], workload: str, config: str, key: str) -> float | None:
    xs = [r[key] for r in rows if r["workload"] == workload and r["config"] == config]
    return float(np.mean(xs)) if xs else None


def _ratios(rows: list[dict]) -> dict[str, float]:
    """Per workload, each config's mean TTFT (and return-turn TTFT) over ``off``'s, over
    ``host+disk+shared``'s (the same tiers routed on device blocks alone) and over ``all tiers, time
    cost``'s (the same with the time cost) (means over seeds)."""
    out: dict[str, float] = {}
    for workload in sorted({r["workload"] for r in rows}):
        for base in ("off", "host+disk+shared", "all tiers, time cost", "host+disk, time cost", "all tiers, oracle",
                     "host+disk, oracle"):
            for config in sorted({r["config"] for r in rows if r["workload"] == workload} - {base, "off"}):
                for key in ("ttft_mean_ms", "ttft_return_mean_ms"):
                    a, b = _mean(rows, workload, config, key), _mean(rows, workload, base, key)
                    if a is not None and b:
                        out[f"{workload}: {config} / {base} {key}"] = a / b
    return out


def _report(console: Console, rows: list[dict], ratios: dict[str, float]) -> None:
    table = Table(title="KV tiers on 4 mockers (virtual clock, model ms; mean over seeds)")
    for col in ("workload", "config", "cached/onboarded", "TTFT mean", "TTFT p90", "return-turn TTFT",
                "host/disk/shared blocks", "out tok/s"):
        table.add_column(col, justify="left" if col in ("workload", "config") else "right")
    for workload in dict.fromkeys(r["workload"] for r in rows):
        for config in dict.fromkeys(r["config"] for r in rows if r["workload"] == workload):
            mine = [r for r in rows if r["workload"] == workload and r["config"] == config]
            hits = "/".join(str(int(np.mean([r["tier_hit_blocks"][t] for r in mine]))) for t in ("host", "disk", "shared"))
            table.add_row(workload, config, *(f"{_mean(rows, workload, config, k):{f}}" for k, f in (
                ("hit_ratio", ".3f"), ("ttft_mean_ms", ".0f"), ("ttft_p90_ms", ".0f"), ("ttft_return_mean_ms", ".0f"))),
                hits, f"{_mean(rows, workload, config, 'output_tokens_per_model_s'):.0f}")
    console.print(table)
    for name, value in ratios.items():
        console.print(f"{name}: {value:.2f}")


if __name__ == "__main__":
    main()
