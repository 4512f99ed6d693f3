"""``sluice prometheus-targets``: every live Sluice process's metrics endpoint, for Prometheus.

Usage::

    sluice prometheus-targets                                  # print the target groups (JSON)
    sluice prometheus-targets -o /etc/prometheus/sluice.json --watch 15   # keep a file_sd file current

The groups are those the frontend serves at ``GET /prometheus/targets`` for ``http_sd_configs``
(router.discovery), read from Redis directly: the workers from the registry, on the routing state's
Redis, and the frontends from their leases, on the broker's (sluice.polling). A file is replaced atomically (written beside it, then
renamed), as Prometheus' ``file_sd_configs`` expects.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from core.settings import Settings
from router.discovery import read_targets
from router.frontends import FrontendRegistry
from router.registry import Registry
from sluice.polling import deployment_planes, redis_names, repeat, run_until_interrupted


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename: a reader sees the old file or the new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def _targets(settings: Settings, output: Path | None, watch_s: float | None) -> int:
    async with deployment_planes(settings) as planes:
        keys = planes.topology.keys
        registry, frontends = Registry(planes.index, keys), FrontendRegistry(planes.broker, keys)

        async def step() -> bool:
            try:
                groups = await read_targets(registry, frontends)
            except Exception as exc:  # noqa: BLE001 - said; a watch keeps the last file and tries again
                print(f"sluice prometheus-targets: cannot read {redis_names(planes.topology)}: {exc}",
                      file=sys.stderr, flush=True)
                return False
            text = json.dumps(groups, indent=2) + "\n"
            if output is None:
                print(text, end="", flush=True)
            else:
                write_atomically(output, text)
            return True

        try:
            return await repeat(step, watch_s)
        finally:
            await registry.aclose()


def run(settings: Settings, *, output: Path | None, watch_s: float | None) -> int:
    return run_until_interrupted(_targets(settings, output, watch_s))
