"""Reliability under failure and load: `make bench-reliability` (or `python -m bench.reliability_bench`).

Three parts, each on its own private Redis and mocker stack (``--parts`` picks; all by default):

- ``migration``: two workers (speedup 1), ``--requests`` greedy streams pinned alternately to
  each; one worker is killed (SIGKILL) mid-stream and its streams move to the other. Compared
  with an undisturbed run of the same requests: token-exact text, extra TTFT of the requests that
  had not streamed yet, the longest pause, total time; migrations from the frontend's counter.
- ``soak``: ``--concurrency`` concurrent streams on one frontend for ``--soak-seconds``: errors,
  requests, TTFT and total time, the frontend's RSS after the warm-up against the end.
- ``redis``: Redis stopped (SHUTDOWN NOSAVE) and started again on its port ``--restarts`` times
  under a few open streams: time from Redis back to the first request served, and the 503s with
  Retry-After that requests get while it is away.

Prints a table per part; writes bench/results/reliability.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.reliability import migration, redis_restart, soak

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = ("migration", "soak", "redis")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--requests", type=int, default=32, help="migration: streams in each run, half on each worker")
    ap.add_argument("--max-tokens", type=int, default=400, help="migration: tokens per stream")
    ap.add_argument("--kill-after", type=int, default=100,
                    help="migration: pieces of text the victim's first-wave streams have received when it is killed")
    ap.add_argument("--soak-seconds", type=float, default=60.0, help="soak: length of the load")
    ap.add_argument("--concurrency", type=int, default=2000, help="soak: concurrent streams")
    ap.add_argument("--soak-warmup", type=float, default=20.0,
                    help="soak: not measured; the clients start over its first half; then the RSS reference")
    ap.add_argument("--soak-workers", type=int, default=2, help="soak: mocker workers")
    ap.add_argument("--soak-speedup", type=float, default=0.04,
                    help="soak: mocker speed (1: the timing model; slower keeps streams open longer)")
    ap.add_argument("--soak-max-tokens", type=int, default=32, help="soak: tokens per stream")
    ap.add_argument("--restarts", type=int, default=5, help="redis: how many stop/start cycles")
    ap.add_argument("--outage-s", type=float, default=2.0, help="redis: how long Redis stays away each time")
    ap.add_argument("--streams", type=int, default=4, help="redis: clients keeping a stream open")
    ap.add_argument("--stream-tokens", type=int, default=2000, help="redis: tokens per client stream")
    ap.add_argument("--settle-s", type=float, default=3.0, help="redis: seconds served between restarts")
    ap.add_argument("--out", type=Path, default=RESULTS / "reliability.json")
    return ap


def _f(value: object, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _pp(d: dict | None) -> str:
    return "-" if d is None else f"{_f(d['p50'])} / {_f(d['p99'])}"


def migration_table(r: dict) -> Table:
    c = r["config"]
    t = Table(title=f"Migration: 2 mocker workers (speedup 1), {c['requests']} streams of {c['max_tokens']} tokens, "
                    f"one worker SIGKILLed; {_f(r['migrations'], 0)} migrations (frontend counter), "
                    f"{r['token_exact']}/{r['compared']} texts token-exact, {r['errors']} errors; "
                    f"migrated/undisturbed total time (p50) {_f(r['migrated_over_undisturbed_total'], 2)}x")
    for col in ("streams", "TTFT ms p50/p99", "extra TTFT ms p50/p99", "longest pause ms p50/p99",
                "total ms p50/p99", "total vs same request undisturbed (p50)"):
        t.add_column(col, justify="right")
    t.add_column("group", justify="left")
    for g in r["groups"]:
        t.add_row(str(g["streams"]), _pp(g["ttft_ms"]), _pp(g["extra_ttft_ms"]), _pp(g["longest_pause_ms"]),
                  _pp(g["total_ms"]), f"{_f(g['total_vs_reference_p50'], 2)}x", g["group"])
    return t


def soak_table(r: dict) -> Table:
    c = r["config"]
    t = Table(title=f"Soak: {c['concurrency']} concurrent streams, {_f(c['seconds'], 0)} s, one frontend, "
                    f"{c['workers']} mocker workers (speedup {c['speedup']}), {c['max_tokens']} tokens each; "
                    f"settings {', '.join(f'{k}={v}' for k, v in c['env'].items())}")
    for col in ("requests", "errors", "req/s", "TTFT ms p50/p99", "total ms p50/p99", "frontend CPU %",
                "RSS MiB warm", "RSS MiB end", "RSS growth", "RSS MiB idle"):
        t.add_column(col, justify="right")
    growth = r["rss_growth"]
    t.add_row(str(r["requests"]), str(r["errors"]), _f(r["req_per_s"]), _pp(r["ttft_ms"]), _pp(r["total_ms"]),
              _f(r["frontend_cpu_percent"], 0), _f(r["rss_warm_mib"]), _f(r["rss_end_mib"]),
              "-" if growth is None else f"{growth * 100:+.1f}%", _f(r["rss_idle_mib"]))
    return t


def redis_table(r: dict) -> Table:
    c = r["config"]
    t = Table(title=f"Redis restarts: {c['restarts']} x SHUTDOWN NOSAVE for {_f(c['outage_s'])} s and start on the same "
                    f"port, {c['streams']} clients streaming; stream outcomes {r['stream_outcomes']}")
    for col in ("recovery s p50", "recovery s max", "outage probes", "503", "503 with Retry-After",
                "other statuses", "503 latency ms p50/p99", "503 latency ms max", "streams open at each stop",
                "failed probes while recovering"):
        t.add_column(col, justify="right")
    t.add_row(_f(r["recovery_s"]["p50"], 2), _f(r["recovery_s"]["max"], 2), str(r["outage_probes"]),
              str(r["outage_503"]), str(r["outage_503_with_retry_after"]), str(r["outage_other_statuses"] or "-"),
              _pp(r["outage_503_ms"]), _f(r["outage_503_ms"]["max"]), str(r["streams_in_flight_at_stop"]),
              str(r["recovery_probe_failures"] or "-"))
    return t


def _runners(args: argparse.Namespace) -> dict[str, tuple[Callable[[], dict], Callable[[dict], Table]]]:
    return {
        "migration": (lambda: migration.measure(migration.MigrationConfig(
            requests=args.requests, max_tokens=args.max_tokens, kill_after=args.kill_after)), migration_table),
        "soak": (lambda: soak.measure(soak.SoakConfig(
            seconds=args.soak_seconds, concurrency=args.concurrency, warmup_s=args.soak_warmup,
            workers=args.soak_workers, speedup=args.soak_speedup, max_tokens=args.soak_max_tokens)), soak_table),
        "redis": (lambda: redis_restart.measure(redis_restart.RestartConfig(
            restarts=args.restarts, outage_s=args.outage_s, streams=args.streams,
            stream_tokens=args.stream_tokens, settle_s=args.settle_s)),
                  redis_table),
    }


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    console = Console(width=200)
    out: dict = {"time": time.time(), "parts": args.parts}
    runners = _runners(args)
    for part in PARTS:
        if part in args.parts:
            console.print(f"reliability: {part}...")
            measure, table = runners[part]
            out[part] = measure()
            console.print(table(out[part]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
