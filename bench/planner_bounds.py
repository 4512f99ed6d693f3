"""What a planner that sees only the past can reach on the bench's day, computed offline with the
planner's own model (no workers run): ``python -m bench.planner_bounds [--profile P] [--seeds 7,8,9]``.

``make bench-planner`` compares the planner's worker-seconds with the oracle's offline schedule, which
sizes each interval on the trace's mean rate: a figure no planner can see (an interval of 8 s at night
holds about 5 arrivals, whose Poisson spread is 45% of their mean). This module sizes, for the same
arrivals (bench.planner_trace.arrivals, per seed) and the same model (planner.modes.SlaPlanner):

* ``oracle``: each interval on its trace mean (the bench's reference, 1.00);
* ``realized``: each interval on the arrivals it really had (knows the draw in advance);
* ``causal``: each interval on the previous one's arrivals and shape (the ``constant`` predictor, with no
  start-up lag), raised by ``z`` deviations of an interval's arrivals, with or without the planner's
  hysteresis (planner.scaling.settle: by default 2 intervals wanting fewer before a shrink, none within 2
  of growing; a row with 3 before a shrink too), with its sure shrink (a fall past ``sure_z``
  deviations shrinks at once), and with its up-band (a pool holds while the plan's fractional need passes
  its size by at most 5% of it).

For each it prints worker-seconds over the oracle's, the share of requests that arrived in an interval
sized below what its realized arrivals needed ("short": the requests most at risk of missing the targets;
the model aims at 80% of them, so a short interval still meets most), and its flaps as the bench counts a
planner's (a pool scaled one way and back within two intervals, on the day's steady phases). Means over the
seeds. It writes the table as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.planner_bench import MODEL, Config, config_of, measure_profile, parser
from bench.planner_trace import (
    DAY,
    actions_of,
    arrivals,
    causal,
    flaps,
    oracle,
    realized_rates,
    short_share,
    sized,
    steady_intervals,
)
from core.settings import Settings
from planner.modes import SlaPlanner
from planner.predictors import PredictorKind
from planner.profile import Profile
from workers.models.prepare import prepare_model

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "results" / "planner_bounds.json"

#: (z, down_after, cooldown, sure_z, predictor, up_band) of the causal rows: (1, 0) is no hysteresis, (2, 2)
#: the planner's defaults; sure_z 0 is no sure shrink, 3 the planner's default; the predictor of the rate and
#: the shape (planner.predictors; ``constant`` is the planner's default); the up-band (planner.scaling.settle;
#: 0.05 is the planner's default, 0 none).
CAUSAL: tuple[tuple[float, int, int, float, PredictorKind, float], ...] = (
    (0.0, 1, 0, 0.0, "constant", 0.0), (0.0, 2, 2, 0.0, "constant", 0.0), (0.5, 2, 2, 0.0, "constant", 0.0),
    (1.3, 2, 2, 0.0, "constant", 0.0), (0.0, 3, 2, 0.0, "constant", 0.0), (0.5, 3, 2, 0.0, "constant", 0.0),
    (0.0, 2, 2, 3.0, "constant", 0.0), (0.5, 2, 2, 3.0, "constant", 0.0), (0.0, 2, 2, 3.0, "constant", 0.05),
    (0.0, 2, 2, 3.0, "kalman", 0.0), (0.0, 2, 2, 3.0, "moving_average", 0.0), (0.0, 2, 2, 3.0, "arima", 0.0))


def rows_for(c: Config, sla: SlaPlanner, layout: str, seeds: list[int]) -> list[dict[str, Any]]:
    """One row per sizing, means over ``seeds``."""
    ref = oracle(DAY, c.base_rate, sla, layout, c.min_replicas, c.max_replicas)
    ref_ws = ref.worker_seconds(c.step_s)
    steady = steady_intervals(DAY)
    per: dict[str, list[tuple[float, float, int]]] = {}
    for seed in seeds:
        plan = arrivals(DAY, c.base_rate, c.step_s, seed)
        rates = realized_rates(plan, len(DAY), c.step_s)
        need = sized(DAY, rates, sla, layout, c.min_replicas, c.max_replicas, "realized")
        schedules = {"oracle (trace means)": ref, "realized (knows each draw)": need}
        for z, down_after, cooldown, sure_z, predictor, up_band in CAUSAL:
            hysteresis = f"shrink after {down_after}, cooldown {cooldown}" if cooldown else "no hysteresis"
            sure = f", sure shrink z {sure_z:g}" if sure_z else ""
            predicted = "" if predictor == "constant" else f", {predictor}"
            band = f", up-band {up_band:g}" if up_band else ""
            schedules[f"causal, z {z:g}, {hysteresis}{sure}{predicted}{band}"] = causal(
                DAY, rates, sla, layout, c.min_replicas, c.max_replicas, z=z, step_s=c.step_s, down_after=down_after,
                cooldown=cooldown, sure_z=sure_z, predictor=predictor, up_band=up_band)
        for name, s in schedules.items():
            per.setdefault(name, []).append((s.worker_seconds(c.step_s) / ref_ws, short_share(s, need, plan),
                                             flaps(actions_of(s), 2, steady)))
    return [{"layout": layout, "sizing": name, "worker_s_vs_oracle": statistics.fmean(v[0] for v in values),
             "short_share": statistics.fmean(v[1] for v in values), "flaps": statistics.fmean(v[2] for v in values),
             "oracle_worker_s": ref_ws, "seeds": seeds}
            for name, values in per.items()]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", type=Path, default=None, help="a profile (sluice profile); unset: measure one")
    p.add_argument("--layouts", default="agg,disagg")
    p.add_argument("--seeds", default="7,8,9,10,11")
    p.add_argument("--step-s", type=float, default=8.0)
    p.add_argument("--base-rate", type=float, default=0.6)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    # The bench's other settings at their defaults, so that the figures describe its day.
    c = config_of(parser().parse_args(["--step-s", str(args.step_s), "--base-rate", str(args.base_rate)]))
    console = Console(width=140)
    if args.profile is None:
        tokenizer_dir = prepare_model(MODEL, Settings().models_dir, weights=False, progress=False)
        profile = measure_profile(c, tokenizer_dir, Path(tempfile.mkdtemp(prefix="sluice-bounds-")) / "profile.json",
                                  console)
    else:
        profile = Profile.load(args.profile)
    sla = SlaPlanner(profile, c.ttft_s * c.margin, c.itl_s * c.margin, c.utilization, c.local_prefill)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = [r for layout in args.layouts.split(",") for r in rows_for(c, sla, layout, seeds)]
    table = Table(title=f"Offline sizing of the bench's day ({len(DAY)} intervals of {c.step_s:g} s, seeds {args.seeds})")
    for col in ("layout", "sizing", "worker-s / oracle", "requests in short intervals", "flaps (steady phases)"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["layout"], r["sizing"], f"{r['worker_s_vs_oracle']:.2f}", f"{r['short_share']:.1%}",
                      f"{r['flaps']:.1f}")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    console.print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
