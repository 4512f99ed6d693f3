"""``sluice planner``: the planner process, and ``sluice planner status``.

Usage::

    sluice planner                          # SLUICE_PLANNER__* settings (core.settings.PlannerSettings)
    sluice planner --mode sla --connector virtual
    sluice planner status [--json]          # the last decisions and the virtual connector's targets

It opens the deployment's Redis (both planes where the routing state lives apart), the connector its
settings name, and its metrics endpoint, then runs :class:`planner.controller.Planner` until SIGTERM or
SIGINT; it then gives up its lease, so a standby planner takes over at once. The workers it started stay.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from prometheus_client import start_http_server

from core.addresses import advertised_host, http_url
from core.redis_topology import RedisPlanes, RedisTopology
from core.settings import Settings
from planner.connectors.base import Connector
from planner.connectors.local import LocalConnector
from planner.connectors.virtual import VirtualConnector
from planner.controller import Planner
from planner.metrics import PlannerMetrics
from planner.prometheus import PrometheusTraffic
from router.cluster import ClusterReader

log = logging.getLogger("sluice.planner")


def planned_models(settings: Settings) -> list[str]:
    return list(settings.planner.models) or [settings.model]


def local_dir(settings: Settings) -> Path:
    return settings.planner.local_dir or settings.cache_dir / "planner" / settings.redis.namespace


def build_connector(settings: Settings, planes: RedisPlanes) -> Connector:
    s = settings.planner
    keys = planes.topology.keys
    if s.connector == "virtual":
        return VirtualConnector(planes.broker, keys)
    if s.connector == "kubernetes":
        from planner.connectors.kubernetes import KubernetesConnector

        return KubernetesConnector.from_settings(s)
    command = s.worker_command or [sys.executable, "-m", "sluice", "worker"]
    return LocalConnector(local_dir(settings), command, os.environ)


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    planes = RedisPlanes.open(RedisTopology.from_settings(settings.redis), "background")
    reader = ClusterReader.of(planes)
    connector = build_connector(settings, planes)
    metrics = PlannerMetrics()
    server, metrics_url = None, ""
    s = settings.planner
    if s.metrics_port >= 0:
        server, _ = start_http_server(s.metrics_port, s.metrics_host, metrics.registry)
        metrics_url = http_url(advertised_host(s.metrics_host, s.metrics_advertise_host), server.server_address[1],
                               "/metrics")
        log.info("planner metrics on %s", metrics_url)
    prometheus = None
    if s.source == "prometheus":
        if not s.prometheus_url:
            raise SystemExit("sluice planner: SLUICE_PLANNER__SOURCE=prometheus needs SLUICE_PLANNER__PROMETHEUS_URL")
        prometheus = PrometheusTraffic(s.prometheus_url)
    try:
        planner = Planner(s, planned_models(settings), planes.broker, planes.topology.keys, connector,
                          reader=reader, metrics=metrics, metrics_url=metrics_url, prometheus=prometheus)
        log.info("planner: mode %s, connector %s, pools %s, interval %.0f s", settings.planner.mode, connector.name,
                 ", ".join(map(str, planner.refs)), settings.planner.interval_s)
        await planner.run(stop)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        await connector.aclose()
        if prometheus is not None:
            await prometheus.aclose()
        await reader.aclose()
        await planes.aclose()


def run(settings: Settings) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    asyncio.run(main())
    return 0
