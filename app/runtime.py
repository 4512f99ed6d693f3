"""The frontend process's runtime object: every long-lived resource of the process, built once
at start-up (FastAPI lifespan) and reached from handlers as ``request.app.state.runtime``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis

from app.accounts.service import Accounts
from app.directory import WorkerDirectory
from app.metrics import FrontendMetrics
from app.metrics_scrape import scrape
from app.process_metrics import ProcessMetricsEndpoint
from app.requests.admission import Admission
from app.requests.enqueue import Enqueuer
from app.requests.streams import StreamHub
from app.shutdown import GracefulDrain
from core.addresses import advertised_host, http_url
from core.background import BackgroundTasks
from core.errors import InvalidRequest, ShuttingDown
from core.keys import Keys
from core.loops import BackgroundLoop, Backoff
from core.messages import ControlCommand, encode_control
from core.redis_topology import RedisPlanes, RedisTopology
from core.settings import Settings
from router.cluster import ClusterReader
from router.disagg import split_pools
from router.frontends import FrontendRecord, FrontendRegistry, LoadCounters
from router.kv_policy import KvPolicy
from router.policies import LeastLoadedPolicy, Policy, PoolPolicy, RandomPolicy, RoundRobinPolicy
from router.reaper import run_reaper
from router.registry import LiveWorker, Registry

log = logging.getLogger(__name__)

#: How long a control command waits for Redis to come back, and when it is sent again after that.
CONTROL_RETRY_S = 60.0
CONTROL_RESEND_S = 3.0


@dataclass
class FrontendRuntime:
    settings: Settings
    frontend_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    metrics: FrontendMetrics = field(default_factory=FrontendMetrics)
    #: Per model, what this process served since it started: published with its lease for the planner.
    load: dict[str, LoadCounters] = field(default_factory=dict)

    async def start(self) -> None:
        s = self.settings
        topology = RedisTopology.from_settings(s.redis)
        self.keys: Keys = topology.keys
        #: The broker's Redis (queues, token streams, control, leases) and the routing state's Redis
        #: (registry, prefix index, in-flight sums): one client twice unless they are apart.
        self.planes = RedisPlanes.open(topology, "frontend", max_connections=64)
        self.redis = self.planes.broker
        self.index_redis = self.planes.index
        self.enqueuer = Enqueuer(self.redis, self.keys)
        self.admission = Admission(s.frontend.max_waiting_per_worker, s.frontend.overload_retry_after_s)
        self.registry = Registry(self.index_redis, self.keys)
        self.hub = StreamHub(self.redis, self.keys.token_channel(self.frontend_id))
        await self.hub.start()
        self.kv_policy = KvPolicy(self.index_redis, self.keys, s.router, enqueues=not self.planes.split)
        self.directory = WorkerDirectory(self.registry, self.hub, s.router.registry_refresh_s, s.model,
                                         on_refresh=self._prepare_routing, lost_grace_s=s.worker.lease_ttl_s)
        await self.directory.start()
        self.policies: dict[str, Policy] = self._make_policies()
        self.frontends = FrontendRegistry(self.redis, self.keys)
        self.cluster = ClusterReader(self.redis, self.keys, registry=self.registry, index=self.kv_policy.index)
        host = advertised_host(s.frontend.host, s.frontend.advertise_host)
        self.url = http_url(host, s.frontend.port)
        self.metrics_url = f"{self.url}/metrics"
        self._metrics_endpoint: ProcessMetricsEndpoint | None = None
        if s.frontend.processes > 1:  # the shared port's /metrics answers for one process of several
            self._metrics_endpoint = ProcessMetricsEndpoint(lambda: scrape(self))
            self.metrics_url = http_url(host, await self._metrics_endpoint.start(s.frontend.host), "/metrics")
        self._started_at = time.time()
        self.accounts = Accounts(s, self.redis, self.keys)
        await self.accounts.start()
        self._background = BackgroundTasks("background task")
        lease_every = s.frontend.lease_ttl_s / 5
        self._lease = BackgroundLoop("frontend-lease", self._renew_lease, interval_s=lease_every,
                                     backoff=Backoff(first_s=min(0.2, lease_every), max_s=lease_every))
        self._lease.start()
        self._lease.wake()
        self.drain = GracefulDrain(s.frontend.drain_timeout_s, self._end_open_requests)
        self._reaper = asyncio.get_running_loop().create_task(
            run_reaper(self.registry, self.kv_policy.index, s.router.reaper_interval_s, broker=self.redis),
            name="reaper")

    async def _renew_lease(self) -> None:
        """Hold this frontend's lease: while it lives, workers keep running the requests it sent. The lease
        carries the frontend's record (router.frontends: its address, for ``sluice status`` and Prometheus)."""
        record = FrontendRecord(frontend_id=self.frontend_id, url=self.url, metrics_url=self.metrics_url,
                                router_mode=self.settings.router.mode, started_at=self._started_at,
                                in_flight=self.hub.in_flight(), updated_at=time.time(),
                                load={model: counters.as_list() for model, counters in self.load.items()})
        await self.frontends.renew(record, self.settings.frontend.lease_ttl_s)

    async def _prepare_routing(self, by_model: dict[str, list[LiveWorker]]) -> None:
        """After each directory refresh, with ``kv`` routing: store the new candidate tables (each model's
        serving workers and its prefill pool, as requests split them) before a request needs them."""
        if self.settings.router.mode != "kv":
            return
        try:
            for model, workers in by_model.items():
                for pool in split_pools(workers):
                    await self.kv_policy.prepare(model, pool)
        except redis.exceptions.RedisError as exc:  # the first decision over a table stores it then
            log.debug("storing the candidate tables failed: %s", exc)

    def _end_open_requests(self) -> None:
        """The drain deadline: every request still open ends with an error (and its worker stops it)."""
        self.hub.fail_all(ShuttingDown.code, "the frontend is shutting down and could not finish the request; "
                                             "retry it")

    def _make_policies(self) -> dict[str, Policy]:
        return {
            "kv": self.kv_policy,
            "round_robin": RoundRobinPolicy(),
            "random": RandomPolicy(),
            "least_loaded": LeastLoadedPolicy(),
            "pool": PoolPolicy(),
        }

    def load_of(self, model: str) -> LoadCounters:
        found = self.load.get(model)
        if found is None:
            found = self.load[model] = LoadCounters()
        return found

    def policy(self, mode: str) -> Policy:
        try:
            return self.policies[mode]
        except KeyError:
            raise InvalidRequest(f"unknown router mode {mode!r}; one of {sorted(self.policies)}",
                                 param="sluice.router.mode") from None

    def send_control(self, channel: str, command: ControlCommand) -> None:
        """Publish a control command (fire and forget). While Redis is away the command is kept and
        sent once it is back, and once more a little later: a worker's control subscription comes
        back after Redis does, and a cancel it misses would leave a request running for nobody."""
        self.spawn(self._publish_control(channel, encode_control(command)))

    async def _publish_control(self, channel: str, payload: bytes) -> None:
        deadline = time.monotonic() + CONTROL_RETRY_S
        failed = False
        while True:
            try:
                await self.redis.publish(channel, payload)
                break
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                failed = True
                await asyncio.sleep(0.5)
        if failed:
            await asyncio.sleep(CONTROL_RESEND_S)
            await self.redis.publish(channel, payload)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a fire-and-forget coroutine, keeping a reference until it ends and logging failures."""
        self._background.spawn(coro)

    async def close(self) -> None:
        if self._metrics_endpoint is not None:
            await self._metrics_endpoint.close()
        await self._lease.stop()
        with contextlib.suppress(Exception):  # gone now: workers need not wait out the lease
            await self.frontends.remove(self.frontend_id)
        self._reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reaper
        await self.accounts.close()
        await self.directory.close()
        await self.hub.close()
        await self._background.drain()
        await self.kv_policy.aclose()
        await self.planes.aclose()
