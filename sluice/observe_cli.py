"""``sluice observe`` (a local Prometheus for the stack) and ``sluice dashboard`` (the Grafana JSON)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _observe(args: argparse.Namespace) -> int:
    from sluice.observe import ObserveConfig, run

    cfg = ObserveConfig(frontend_url=args.frontend, flower_url=args.flower or None,
                        scrape_interval_s=args.scrape_interval, refresh_interval_s=args.scrape_interval)
    try:
        return run(cfg, args.listen, args.data_dir)
    except FileNotFoundError as exc:
        print(f"sluice observe: error: {exc}", file=sys.stderr)
        return 2


def _dashboard(args: argparse.Namespace) -> int:
    from sluice.dashboard import DASHBOARD_PATH, render

    text = render()
    if args.check:
        if DASHBOARD_PATH.read_text() != text:
            print(f"sluice dashboard: {DASHBOARD_PATH} is out of date: run `sluice dashboard --write`", file=sys.stderr)
            return 1
        return 0
    if args.write:
        DASHBOARD_PATH.write_text(text)
        print(DASHBOARD_PATH)
        return 0
    sys.stdout.write(text)
    return 0


def add_observe_commands(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("observe", help="run a local Prometheus scraping every process of the stack",
                       description="Run Prometheus (Debian's prometheus package) with a configuration that finds "
                                   "every live frontend and worker through the frontend's GET /prometheus/targets, "
                                   "scrapes Flower, and loads docker/prometheus/rules.yml.")
    p.add_argument("--frontend", default="http://127.0.0.1:8000", help="the frontend's base URL")
    p.add_argument("--flower", default="http://127.0.0.1:5555", help="Flower's base URL ('' for none)")
    p.add_argument("--listen", default="127.0.0.1:9090", help="Prometheus' own address")
    p.add_argument("--scrape-interval", type=float, default=5.0, help="seconds between scrapes")
    p.add_argument("--data-dir", type=Path, default=None, help="where Prometheus keeps its data and its configuration (default: a new temp dir)")
    p.set_defaults(func=_observe)
    p = sub.add_parser("dashboard", help="print the Grafana dashboard JSON (docker/grafana/sluice.json)",
                       description="The Grafana dashboard, built from sluice/dashboard.py.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write docker/grafana/sluice.json")
    mode.add_argument("--check", action="store_true", help="exit 1 when docker/grafana/sluice.json is out of date")
    p.set_defaults(func=_dashboard)
