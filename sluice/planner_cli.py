"""``sluice planner`` (run the planner, or ``status``) and ``sluice profile`` (measure an engine for the
planner's ``sla`` mode): their options and what they run (planner.service, planner.status, planner.profiler)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from core.settings import PlannerSettings, get_settings


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of whole numbers, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"a comma-separated list of positive numbers, not {text!r}")
    return values


def _planner(args: argparse.Namespace) -> int:
    from core.logs import configure_logging
    from planner.service import run

    for option, name in (("mode", "MODE"), ("connector", "CONNECTOR"), ("interval", "INTERVAL_S"),
                         ("profile", "PROFILE"), ("layout", "LAYOUT")):
        value = getattr(args, option, None)
        if value is not None:  # the settings read them: the options win over their variables
            os.environ[f"SLUICE_PLANNER__{name}"] = str(value)
    get_settings.cache_clear()
    settings = get_settings()
    configure_logging(settings.log_format, args.log_level)
    return run(settings)


def _planner_status(args: argparse.Namespace) -> int:
    import asyncio

    from rich.console import Console

    from planner.status import planner_json, render_planner
    from sluice.polling import deployment_planes

    settings = get_settings()

    async def read() -> dict[str, Any]:
        async with deployment_planes(settings) as planes:
            return await planner_json(planes.broker, planes.topology.keys, args.last)

    data = asyncio.run(read())
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    console = Console()
    for i, decision in enumerate(data["decisions"] or [None]):
        console.print(render_planner({**data, "decisions": [decision] if decision else []}))
        if i + 1 < len(data["decisions"]):
            console.print()
    if data["targets"]:
        console.print("virtual connector targets: " + ", ".join(f"{k}={v}" for k, v in sorted(data["targets"].items())))
    return 0


def add_planner(sub: argparse._SubParsersAction[Any], log_levels: tuple[str, ...]) -> None:
    fields = PlannerSettings.model_fields
    p = sub.add_parser("planner", help="run the planner: it sizes each pool to the load (docs/planner.md)",
                       description="Each interval, read the load the frontends and workers publish, predict the next "
                                   "interval's, compute each pool's replicas with the mode, and apply them with the "
                                   "connector. One planner acts per namespace; a second one stands by. Every "
                                   "SLUICE_PLANNER__* setting applies (core/settings.py, PlannerSettings).")
    p.add_argument("--mode", choices=["throughput", "latency", "load", "sla"], default=None,
                   help=f"how replicas are computed (SLUICE_PLANNER__MODE; default {fields['mode'].default})")
    p.add_argument("--connector", choices=["local", "kubernetes", "virtual"], default=None,
                   help=f"where decisions take effect (SLUICE_PLANNER__CONNECTOR; default {fields['connector'].default})")
    p.add_argument("--layout", choices=["agg", "disagg"], default=None,
                   help=f"which pools it sizes (SLUICE_PLANNER__LAYOUT; default {fields['layout'].default})")
    p.add_argument("--interval", type=float, default=None, metavar="SECONDS",
                   help=f"the adjustment interval (SLUICE_PLANNER__INTERVAL_S; default {fields['interval_s'].default:g})")
    p.add_argument("--profile", type=Path, default=None, metavar="FILE",
                   help="the sla mode's profile, as sluice profile writes it (SLUICE_PLANNER__PROFILE)")
    p.add_argument("--log-level", type=str.lower, choices=log_levels, default="info", help="log verbosity")
    p.set_defaults(func=_planner)
    planner_sub = p.add_subparsers(title="commands", metavar="COMMAND", required=False)
    s = planner_sub.add_parser("status", help="show the acting planner's last decisions",
                               description="Whether a planner acts in the namespace, its last decisions (each pool's "
                                           "live workers, what it asked for and why) and the virtual connector's "
                                           "targets, read from Redis.")
    s.add_argument("--last", type=int, default=1, metavar="N", help="show the N last decisions")
    s.add_argument("--json", action="store_true", help="print them as JSON")
    s.set_defaults(func=_planner_status)


def _profile(args: argparse.Namespace) -> int:
    import asyncio

    from planner.profiler import ProfileSpec, run_profile

    settings = get_settings()
    overrides = {name: tuple(value) for name, value in (("isls", args.isl), ("contexts", args.contexts),
                                                        ("batches", args.batches)) if value is not None}
    spec = ProfileSpec(**overrides)
    profile = asyncio.run(run_profile(settings, spec, progress=lambda line: print(line, flush=True)))
    output = args.output or Path(f"profile-{profile.engine}-{profile.model}.json")
    profile.save(output)
    print(f"wrote {output}: {len(profile.prefill)} prefill points, {len(profile.decode)} decode points")
    return 0


def add_profile(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("profile", help="measure an engine's TTFT and ITL for the planner's sla mode",
                       description="Start one engine of SLUICE_WORKER__ENGINE (mocker, vllm) in this process, as a "
                                   "worker would, and measure the time to first token against the prompt's length "
                                   "and the inter-token latency against the batch and the context; write the profile "
                                   "as JSON (SLUICE_PLANNER__PROFILE reads it). The mocker takes seconds, vLLM on "
                                   "CPU minutes.")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                   help="where to write it (default: profile-ENGINE-MODEL.json here)")
    p.add_argument("--isl", type=_int_list, default=None, metavar="N,N,...", help="prompt lengths to time")
    p.add_argument("--contexts", type=_int_list, default=None, metavar="N,N,...", help="contexts to decode at")
    p.add_argument("--batches", type=_int_list, default=None, metavar="N,N,...", help="batch sizes to decode at")
    p.set_defaults(func=_profile)
