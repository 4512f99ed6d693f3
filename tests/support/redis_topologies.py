"""Private Redis topologies for tests: a three-node Redis Cluster and a Sentinel-managed primary.

Usage::

    with RedisClusterNodes().start() as cluster:      # three masters on loopback, slots split evenly
        client = RedisCluster.from_url(cluster.url)
    with SentinelGroup().start() as group:            # a primary, a replica, a sentinel
        group.kill_primary()                          # SIGKILL; the sentinel promotes the replica

Every server is a ``redis-server`` that keeps nothing on disk, started in its own session in a
temporary directory; ``stop()`` (or leaving the ``with``) kills them all and removes the directory.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import redis

from bench.devstack import free_port, wait_until, with_parent_death_signal


def _redis_server() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (make test installs it)")
    return exe


def cluster_port() -> int:
    """A free port whose cluster bus port (the port + 10000) is free and valid too."""
    return free_port(companion_offset=10_000)


@dataclass
class _Servers:
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sluice-topology-")))
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)

    def launch(self, port: int, *extra: str) -> None:
        data = self.workdir / str(port)
        data.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            with_parent_death_signal([_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(data), *extra]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def wait_ping(self, port: int) -> None:
        client = redis.Redis(port=port, socket_connect_timeout=0.5)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False
        try:
            wait_until(up, 10, f"redis-server on port {port}")
        finally:
            client.close()

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class RedisClusterNodes:
    """Three ``redis-server --cluster-enabled yes`` masters joined by ``redis-cli --cluster create``."""

    ports: tuple[int, ...] = field(default_factory=lambda: tuple(cluster_port() for _ in range(3)))
    servers: _Servers = field(default_factory=_Servers)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> Self:
        try:
            for port in self.ports:
                self.servers.launch(port, "--cluster-enabled", "yes", "--cluster-config-file",
                                    f"nodes-{port}.conf", "--cluster-node-timeout", "2000")
            for port in self.ports:
                self.servers.wait_ping(port)
            subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=30)
            wait_until(self._ready, 15, "the cluster to agree on its slots")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        for port in self.ports:
            client = redis.Redis(port=port)
            try:
                if client.cluster("info").get("cluster_state") != "ok":
                    return False
            finally:
                client.close()
        return True

    def stop(self) -> None:
        self.servers.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class SentinelGroup:
    """A primary, its replica and one sentinel (quorum 1) watching the primary as ``master_name``;
    the sentinel calls the primary down after ``down_after_ms`` without an answer and promotes the replica."""

    master_name: str = "sluice-test"
    down_after_ms: int = 1000
    primary_port: int = field(default_factory=free_port)
    replica_port: int = field(default_factory=free_port)
    sentinel_port: int = field(default_factory=free_port)
    servers: _Servers = field(default_factory=_Servers)

    @property
    def url(self) -> str:
        """The broker URL (kombu's form; ``RedisSettings.sentinel_master`` = :attr:`master_name`)."""
        return f"sentinel://127.0.0.1:{self.sentinel_port}"

    def start(self) -> Self:
        try:
            self.servers.launch(self.primary_port)
            self.servers.wait_ping(self.primary_port)
            self.servers.launch(self.replica_port, "--replicaof", "127.0.0.1", str(self.primary_port))
            self.servers.wait_ping(self.replica_port)
            conf = self.servers.workdir / "sentinel.conf"
            conf.write_text("\n".join([
                f"port {self.sentinel_port}", "bind 127.0.0.1", f"dir {self.servers.workdir}",
                f"sentinel monitor {self.master_name} 127.0.0.1 {self.primary_port} 1",
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}",
                f"sentinel failover-timeout {self.master_name} 10000",
                f"sentinel parallel-syncs {self.master_name} 1", ""]))
            self.servers.procs[self.sentinel_port] = subprocess.Popen(
                with_parent_death_signal([_redis_server(), str(conf), "--sentinel"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            self.servers.wait_ping(self.sentinel_port)
            wait_until(self._replica_known, 15, "the sentinel to see the replica")
        except BaseException:
            self.stop()
            raise
        return self

    def _sentinel(self) -> redis.Redis:
        return redis.Redis(port=self.sentinel_port, decode_responses=True)

    def _replica_known(self) -> bool:
        client = self._sentinel()
        try:
            return bool(client.sentinel_slaves(self.master_name))
        finally:
            client.close()

    def primary(self) -> tuple[str, int]:
        client = self._sentinel()
        try:
            host, port = client.sentinel_get_master_addr_by_name(self.master_name)
            return host, int(port)
        finally:
            client.close()

    def kill_primary(self) -> float:
        """SIGKILL the primary; returns when (``time.monotonic()``)."""
        _, port = self.primary()
        self.servers.kill(port)
        return time.monotonic()

    def stop(self) -> None:
        self.servers.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
