"""One fleet process: ``python -m bench.fleet --workers 250 --first 0`` (module bench.fleet.sim).

Registers the workers, runs the request stream, then heartbeats until interrupted (Ctrl-C, SIGTERM),
and purges and deregisters them on the way out. With ``--control`` it waits for commands on stdin
instead, one per line (``drive``, ``lease``, ``stop``; end of input is ``stop``), and answers each
step with one JSON line on stdout (``{"event": "started" | "driven" | "lease" | "stopped", ...}``):
this is how bench.scale_bench runs several of them. Redis URL, namespace, heartbeat interval and lease
default to the deployment's settings (``SLUICE_REDIS__URL``, ``SLUICE_REDIS__NAMESPACE``,
``SLUICE_WORKER__HEARTBEAT_INTERVAL_S``, ``SLUICE_WORKER__LEASE_TTL_S``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

import redis.asyncio as aioredis
import uvloop

from bench.fleet.sim import Fleet, FleetSpec, as_dict
from bench.fleet.workload import FleetWorkload
from core.keys import Keys
from core.redis_client import redis_options
from core.redis_connection import use_bounded_send
from core.settings import get_settings


def _say(event: str, payload: object = None) -> None:
    print(json.dumps({"event": event, **(as_dict(payload) if payload is not None else {})}), flush=True)


async def _commands() -> asyncio.Queue[str]:
    """Lines of stdin, read off the loop; end of input reads as ``stop``."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def pump() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line.strip())
        loop.call_soon_threadsafe(queue.put_nowait, "stop")

    loop.run_in_executor(None, pump)
    return queue


async def run(args: argparse.Namespace) -> None:
    pool = aioredis.BlockingConnectionPool.from_url(args.redis_url, max_connections=args.connections, timeout=60,
                                                    **redis_options(retries=3, backoff_cap_s=0.5))
    client = aioredis.Redis(connection_pool=pool)
    use_bounded_send(client)
    workload = FleetWorkload(seed=args.seed, groups=args.groups, prefix_tokens=args.prefix_tokens,
                             requests_per_worker=args.requests)
    spec = FleetSpec(workers=args.workers, first=args.first, kv_blocks=args.kv_blocks, heartbeat_s=args.heartbeat_s,
                     lease_ttl_s=args.lease_ttl_s, workload=workload)
    fleet = Fleet(client, Keys(args.namespace), spec)
    try:
        _say("started", await fleet.start())
        if args.control:
            commands = await _commands()
            while (command := await commands.get()) != "stop":
                if command == "drive":
                    _say("driven", await fleet.drive())
                elif command == "lease":
                    _say("lease", fleet.lease_stats())
        else:
            _say("driven", await fleet.drive())
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
            await stop.wait()
        lease = fleet.lease_stats()
        await fleet.stop()
        _say("stopped", lease)
    finally:
        await client.aclose()


def cli() -> None:
    settings = get_settings()
    spec, workload = FleetSpec(workers=0), FleetWorkload()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=250, help="simulated workers in this process")
    parser.add_argument("--first", type=int, default=0, help="index of the first (disjoint ranges per process)")
    parser.add_argument("--redis-url", default=settings.redis.url, help="default: SLUICE_REDIS__URL")
    parser.add_argument("--namespace", default=settings.redis.namespace, help="default: SLUICE_REDIS__NAMESPACE")
    parser.add_argument("--heartbeat-s", type=float, default=settings.worker.heartbeat_interval_s,
                        help="default: SLUICE_WORKER__HEARTBEAT_INTERVAL_S")
    parser.add_argument("--lease-ttl-s", type=float, default=settings.worker.lease_ttl_s,
                        help="default: SLUICE_WORKER__LEASE_TTL_S")
    parser.add_argument("--kv-blocks", type=int, default=spec.kv_blocks, help="KV blocks per simulated engine")
    parser.add_argument("--requests", type=int, default=workload.requests_per_worker, help="requests per worker")
    parser.add_argument("--groups", type=int, default=workload.groups, help="shared prefixes (groups of workers)")
    parser.add_argument("--prefix-tokens", type=int, default=workload.prefix_tokens)
    parser.add_argument("--seed", type=int, default=workload.seed)
    parser.add_argument("--connections", type=int, default=64, help="Redis connections this process may open")
    parser.add_argument("--control", action="store_true", help="wait for commands on stdin (bench.scale_bench)")
    uvloop.run(run(parser.parse_args()))


if __name__ == "__main__":
    cli()
