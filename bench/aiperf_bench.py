"""Sluice measured by NVIDIA's aiperf: `make bench-aiperf` (or `python -m bench.aiperf_bench`).

Starts a private Redis and a mocker stack (one frontend, ``--workers`` mocker workers at the
timing model's speed), or targets ``--url``, a stack already running (`make bench-aiperf` passes
``SLUICE_BENCH_URL``, e.g. ``http://127.0.0.1:8000`` for `make run`). Then runs ``aiperf
profile`` from its own environment (``.venv-aiperf``, `make venv-aiperf`; ``--aiperf``) against
the OpenAI chat endpoint: streaming, the model ``--model``, the model's tokenizer directory (the one
``sluice models prepare smollm2`` makes; ``--tokenizer``), synthetic prompts of ``--isl`` tokens
and ``--osl`` output tokens (``ignore_eos``; counted from the server's usage, which is what the
engine generated, where re-tokenizing the text gives a token or two more or less), a warm-up of
``--warmup-requests`` and a profiling phase of ``--duration`` seconds at each ``--concurrency``
(aiperf's sweep). Arguments after ``--`` go to aiperf unchanged (``-- --api-key sk-...``).

aiperf's artifacts (its exports, console report and log per level) go to bench/results/aiperf/,
emptied first. Prints a table; writes bench/results/aiperf.json (``--out``): the figures of each
level, the aiperf version and the command line.

No network: aiperf is given the tokenizer as a local directory, which transformers reads without
the Hugging Face hub, and ``HF_ENDPOINT`` names a closed local port, so anything that would still
try the hub fails at once instead of reaching the internet. ``HF_HUB_OFFLINE`` would be the
natural switch, but aiperf 0.13.0 under it takes a local path for a hub repository id (its
offline loader calls ``snapshot_download(path)``) and fails; it is removed from aiperf's
environment for that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.aiperf_export import AiperfRow, aiperf_version, read_rows
from bench.devstack import REPO, Processes
from bench.reliability.stack import mocker_stack
from core.settings import Settings
from workers.models.prepare import prepare_model

RESULTS = Path(__file__).resolve().parent / "results"
ARTIFACTS = RESULTS / "aiperf"
MODEL = "smollm2"
#: Seconds aiperf waits for the requests still open when a level's duration ends.
GRACE_S = 10.0
#: Nothing listens on the discard port: a hub request fails at once (module docstring).
CLOSED_HUB = "http://127.0.0.1:9"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running stack's base URL, with or without /v1 (default: a private mocker stack)")
    ap.add_argument("--model", default=MODEL, help="the served model's name")
    ap.add_argument("--tokenizer", type=Path,
                    help="the model's tokenizer directory (default: the prepared smollm2 directory)")
    ap.add_argument("--workers", type=int, default=2, help="mocker workers of the private stack")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="levels, one profiling phase each")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of load at each level")
    ap.add_argument("--warmup-requests", type=int, default=8, help="requests before each level's measurement")
    ap.add_argument("--isl", type=int, default=300, help="prompt tokens (synthetic prompts)")
    ap.add_argument("--osl", type=int, default=64, help="output tokens per request")
    ap.add_argument("--seed", type=int, default=1, help="aiperf's random seed (the same prompts each run)")
    ap.add_argument("--aiperf", type=Path, default=REPO / ".venv-aiperf" / "bin" / "aiperf", help="aiperf's executable")
    ap.add_argument("--out", type=Path, default=RESULTS / "aiperf.json")
    return ap


def aiperf_command(args: argparse.Namespace, url: str, tokenizer: Path, extra: list[str]) -> list[str]:
    """The ``aiperf profile`` command line for ``url`` (a base URL; aiperf adds the chat path)."""
    return [
        str(args.aiperf), "profile",
        "--model", args.model, "--url", url, "--endpoint-type", "chat", "--streaming",
        "--tokenizer", str(tokenizer),
        "--isl", str(args.isl), "--isl-stddev", "0", "--osl", str(args.osl), "--osl-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
        "--concurrency", ",".join(map(str, args.concurrency)),
        "--benchmark-duration", f"{args.duration:g}", "--benchmark-grace-period", f"{GRACE_S:g}",
        "--warmup-request-count", str(args.warmup_requests), "--random-seed", str(args.seed),
        "--artifact-dir", str(ARTIFACTS), "--ui", "none", "--no-gpu-telemetry", "--no-server-metrics",
        *extra,
    ]


def aiperf_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update({"HF_ENDPOINT": CLOSED_HUB, "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1"})
    return env


def run_aiperf(cmd: list[str], timeout_s: float) -> None:
    """Runs aiperf to its end (its own process group, stopped with this process whatever happens)."""
    processes = Processes(prefix="sluice-aiperf-")
    try:
        proc = processes.spawn("aiperf", cmd, aiperf_env())
        try:
            rc = proc.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"aiperf did not finish in {timeout_s:.0f} s:\n{proc.tail()}") from None
        if rc != 0:
            raise SystemExit(f"aiperf exited with {rc}:\n{proc.tail()}")
    finally:
        processes.stop()


@contextmanager
def target(args: argparse.Namespace) -> Iterator[str]:
    """The base URL to measure: ``--url``, or a private mocker stack's for the duration."""
    if args.url:
        yield args.url.rstrip("/").removesuffix("/v1")
        return
    with mocker_stack([f"aiperf{i}" for i in range(args.workers)], {}, "aiperf") as (_, stack):
        yield stack.base_url


def default_tokenizer() -> Path:
    return prepare_model(MODEL, Settings().models_dir, weights=False, progress=False)


def table(rows: list[AiperfRow], title: str) -> Table:
    t = Table(title=title)
    for col in ("concurrency", "requests", "errors", "req/s", "output tok/s", "TTFT ms p50", "TTFT ms p99",
                "ITL ms p50", "ITL ms p99", "ISL / OSL avg (server)"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r.concurrency), str(r.requests), str(r.errors), f"{r.request_throughput:.2f}",
                  f"{r.output_token_throughput:.0f}", f"{r.ttft_ms_p50:.1f}", f"{r.ttft_ms_p99:.1f}",
                  f"{r.itl_ms_p50:.2f}", f"{r.itl_ms_p99:.2f}", f"{r.isl_avg:.0f} / {r.osl_avg:.0f}")
    return t


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = _parser().parse_args(ours)
    if not args.aiperf.exists():
        raise SystemExit(f"{args.aiperf} is missing: `make venv-aiperf` installs aiperf")
    console = Console(width=200)
    tokenizer = args.tokenizer or default_tokenizer()
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    levels = len(args.concurrency)
    with target(args) as url:
        cmd = aiperf_command(args, url, tokenizer, extra)
        console.print(f"aiperf: {args.model} at {url}, concurrency {', '.join(map(str, args.concurrency))}, "
                      f"{args.duration:g} s each (about {levels * 30:.0f} s in all)...")
        run_aiperf(cmd, timeout_s=120 + levels * (args.duration + GRACE_S + 60))
    rows, version = read_rows(ARTIFACTS), aiperf_version(ARTIFACTS)
    system = args.url or f"private mocker stack ({args.workers} workers)"
    console.print(table(rows, f"aiperf {version} on Sluice ({system}): chat, streaming, "
                              f"{args.isl}-token prompts, {args.osl} output tokens, {args.duration:g} s per level; "
                                   "ISL as the server counts it, chat template included"))
    out = {"time": time.time(), "aiperf_version": version, "target": system,
           "model": args.model, "tokenizer": str(tokenizer), "command": cmd, "command_line": shlex.join(cmd),
           "artifacts": str(ARTIFACTS), "rows": [asdict(r) for r in rows]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {args.out}; aiperf's own reports in {ARTIFACTS}")
    return out


if __name__ == "__main__":
    main()
