"""Where each part of Sluice's Redis state lives, and the clients that reach it.

Two planes (README, "Outgrowing one Redis"):

* the **broker**: Celery's queues (and everything kombu keeps), the token streams and control
  channels (pub/sub), the frontends' leases, LoRA replies and rate limits. A plain Redis, or one
  made highly available by Sentinel: ``sentinel://host:port;sentinel://host2:port`` (kombu's form),
  the monitored primary named by ``RedisSettings.sentinel_master``. Clients made here find the
  primary through the sentinels on every new connection, so after a failover the next connection
  (redis-py's retry, the background loops' reconnects) reaches the promoted replica.
* the **index**: the routing state, the worker registry, the prefix index and the in-flight sums.
  By default the broker's Redis; ``RedisSettings.index_url`` moves it to a Redis of its own, or to a
  Redis Cluster (``index_cluster``), whose keys then carry hash tags (core.keys) so that each script
  touches one slot.

When the two planes are one Redis (:attr:`RedisTopology.split` is False) a routing decision pushes
the task message in the same script call; when they are apart the decision is one call on the index
and the enqueue one on the broker (router.kv_policy, app.requests.enqueue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from core.keys import Keys
from core.redis_client import redis_options
from core.redis_connection import use_bounded_send
from core.settings import RedisSettings

#: Who a client serves: the frontend's hot path (one quick retry: an outage is a 503 at once) or a
#: background process (a few retries, pauses up to half a second). See core.redis_client.
Role = Literal["frontend", "background"]

IndexClient = aioredis.Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """A ``sentinel://`` URL list, parsed: the sentinels and what to authenticate the primary with."""

    sentinels: tuple[tuple[str, int], ...]
    password: str | None = None
    username: str | None = None
    db: int = 0

    @classmethod
    def parse(cls, url: str) -> SentinelAddress:
        """``sentinel://[[user]:password@]host:port[/db]`` parts joined by ``;`` (kombu's broker URL)."""
        hosts: list[tuple[str, int]] = []
        password = username = None
        db = 0
        for part in filter(None, (p.strip() for p in url.split(";"))):
            u = urlsplit(part)
            if u.scheme != "sentinel":
                raise ValueError(f"not a sentinel URL: {part!r}")
            hosts.append((u.hostname or "127.0.0.1", u.port or 26379))
            password = password or (unquote(u.password) if u.password else None)
            username = username or (unquote(u.username) if u.username else None)
            if u.path.strip("/"):
                db = int(u.path.strip("/"))
        if not hosts:
            raise ValueError(f"no sentinel in {url!r}")
        return cls(tuple(hosts), password, username, db)


def is_sentinel_url(url: str) -> bool:
    return url.startswith("sentinel://")


def _retries(role: Role) -> dict[str, Any]:
    return redis_options(retries=1, backoff_cap_s=0.02) if role == "frontend" else \
        redis_options(retries=3, backoff_cap_s=0.5)


def plain_client(url: str, role: Role, *, master_name: str = "mymaster", max_connections: int = 64) -> aioredis.Redis:
    """A client of one Redis: a ``redis://`` URL, or the primary behind ``sentinel://`` URLs. Its
    connections write commands without losing a cancellation (core.redis_connection)."""
    options = _retries(role)
    if is_sentinel_url(url):
        address = SentinelAddress.parse(url)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves its __init__ unannotated
            list(address.sentinels), socket_timeout=options["socket_timeout"],
            sentinel_kwargs={"socket_connect_timeout": options["socket_connect_timeout"],
                             "socket_timeout": options["socket_timeout"]})
        for asked in sentinel.sentinels:  # asked on every new connection where the primary is
            use_bounded_send(asked)
        client = sentinel.master_for(master_name, password=address.password, username=address.username,
                                     db=address.db, **options)
    elif role == "frontend":
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=10, **options)
        client = aioredis.Redis(connection_pool=pool)
    else:
        client = aioredis.Redis.from_url(url, **options)
    use_bounded_send(client)
    return cast(aioredis.Redis, client)


def cluster_client(url: str, role: Role) -> RedisCluster:
    """A Redis Cluster client from the URL of any one node (it discovers the rest)."""
    options = {k: v for k, v in _retries(role).items() if k != "retry"}
    client = RedisCluster.from_url(url, **options)
    use_bounded_send(client)
    return client


@dataclass(frozen=True, slots=True)
class RedisTopology:
    """The Redis layout the settings describe (see the module docstring)."""

    broker_url: str
    index_url: str
    index_cluster: bool
    sentinel_master: str
    namespace: str

    @classmethod
    def from_settings(cls, s: RedisSettings) -> RedisTopology:
        return cls(s.url, s.index_url or s.url, s.index_cluster, s.sentinel_master, s.namespace)

    @property
    def split(self) -> bool:
        """The routing state lives apart from the broker: a decision and its enqueue are two calls."""
        return self.index_cluster or self.index_url != self.broker_url

    @property
    def keys(self) -> Keys:
        return Keys(self.namespace, hash_tags=self.index_cluster)

    def broker_client(self, role: Role, max_connections: int = 64) -> aioredis.Redis:
        return plain_client(self.broker_url, role, master_name=self.sentinel_master, max_connections=max_connections)

    def index_client(self, role: Role, max_connections: int = 64) -> IndexClient:
        if self.index_cluster:
            return cluster_client(self.index_url, role)
        return plain_client(self.index_url, role, master_name=self.sentinel_master, max_connections=max_connections)


@dataclass(slots=True)
class RedisPlanes:
    """A process's open clients of both planes (the same object twice when they are one Redis)."""

    topology: RedisTopology
    broker: aioredis.Redis
    index: IndexClient

    @classmethod
    def open(cls, topology: RedisTopology, role: Role, max_connections: int = 64) -> RedisPlanes:
        broker = topology.broker_client(role, max_connections)
        index = topology.index_client(role, max_connections) if topology.split else broker
        return cls(topology, broker, index)

    @property
    def split(self) -> bool:
        return self.index is not self.broker

    async def aclose(self) -> None:
        if self.split:
            await self.index.aclose()
        await self.broker.aclose()
