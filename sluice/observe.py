"""A local Prometheus for the stack ``make run`` starts (``sluice observe``, ``make observe``).

It runs Debian's ``prometheus`` binary with a configuration written here: one scrape job whose
targets come from the frontend's ``GET /prometheus/targets`` (``http_sd_configs``: every live
frontend and worker of the namespace, with ``component``, ``worker``, ``model`` and ``pool``
labels), Flower's ``/metrics`` when a Flower URL is given, and the rules in
``docker/prometheus/rules.yml``. The Grafana dashboard (sluice.dashboard) reads what it scrapes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

RULES_PATH = Path(__file__).resolve().parents[1] / "docker" / "prometheus" / "rules.yml"


@dataclass(frozen=True)
class ObserveConfig:
    frontend_url: str = "http://127.0.0.1:8000"
    flower_url: str | None = None
    scrape_interval_s: float = 5.0
    #: How often the target list is read again from the frontend (workers come and go).
    refresh_interval_s: float = 5.0


def _duration(seconds: float) -> str:
    return f"{int(seconds * 1000)}ms"


def prometheus_config(cfg: ObserveConfig, rules: Path = RULES_PATH) -> dict[str, Any]:
    """Prometheus' configuration for the stack behind ``cfg.frontend_url``."""
    jobs: list[dict[str, Any]] = [{
        "job_name": "sluice",
        "http_sd_configs": [{"url": f"{cfg.frontend_url.rstrip('/')}/prometheus/targets",
                             "refresh_interval": _duration(cfg.refresh_interval_s)}],
    }]
    if cfg.flower_url:
        flower = urlsplit(cfg.flower_url)
        jobs.append({"job_name": "flower", "static_configs": [{"targets": [flower.netloc]}],
                     "metrics_path": f"{flower.path.rstrip('/')}/metrics"})
    return {
        "global": {"scrape_interval": _duration(cfg.scrape_interval_s),
                   "evaluation_interval": _duration(cfg.scrape_interval_s)},
        "rule_files": [str(rules)],
        "scrape_configs": jobs,
    }


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise FileNotFoundError("no prometheus binary on PATH: install Debian's package "
                                "(`sudo apt-get install --no-install-recommends prometheus`, or scripts/ensure_prometheus.sh)")
    return path


def prometheus_argv(config_file: Path, data_dir: Path, listen: str) -> list[str]:
    return [prometheus_binary(), f"--config.file={config_file}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address={listen}", "--storage.tsdb.retention.time=1d", "--log.level=warn"]


def write_config(cfg: ObserveConfig, directory: Path) -> Path:
    path = directory / "prometheus.yml"
    path.write_text(json.dumps(prometheus_config(cfg), indent=2))  # JSON is YAML, which Prometheus reads
    return path


def run(cfg: ObserveConfig, listen: str, data_dir: Path | None) -> int:
    """Write the configuration and replace this process with Prometheus (Ctrl-C stops it).

    The configuration is written into the data directory (Prometheus leaves files it does not know
    there alone), so that one directory holds all this command leaves: ``data_dir``, or a new
    temporary directory when none is given."""
    prometheus_binary()  # no Prometheus: fail before anything is written
    data = data_dir or Path(tempfile.mkdtemp(prefix="sluice-observe-"))
    data.mkdir(parents=True, exist_ok=True)
    config_file = write_config(cfg, data)
    argv = prometheus_argv(config_file, data, listen)
    print(f"Prometheus on http://{listen} scraping the stack behind {cfg.frontend_url} (config {config_file})",
          file=sys.stderr, flush=True)
    os.execv(argv[0], argv)
    return 0  # not reached


def check_config(config_file: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check config`` (which checks the rule files it names too)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise FileNotFoundError("no promtool on PATH (Debian's prometheus package has it)")
    return subprocess.run([promtool, "check", "config", str(config_file)], capture_output=True, text=True,
                          timeout=60)
