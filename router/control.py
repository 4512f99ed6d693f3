"""Commands routers and operators send to workers over their control channels (pub/sub).

``clear_kv_blocks``: the worker's engine drops every cached block no running request holds and reports
``AllBlocksCleared`` (then the blocks still in use); its KV relay applies that to the prefix index, so
the index forgets the worker's cached prefixes. A worker in approximate mode purges the routers' guesses.

``drain_worker``: the worker leaves routing at once, lets its running requests finish up to its drain
deadline (``SLUICE_WORKER__DRAIN_TIMEOUT_S``), then hands the rest back to their frontends, which
continue them elsewhere; it keeps running, out of routing (SIGTERM does the same, then exits).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from core.keys import Keys
from core.messages import ControlCommand, encode_control


async def clear_kv_blocks(client: aioredis.Redis, keys: Keys, worker_id: str | None = None) -> int:
    """Ask one worker (or, with ``worker_id=None``, every worker of the namespace) to clear its KV cache.

    Fire and forget, like every control command; returns how many workers were listening."""
    channel = keys.control_channel(worker_id) if worker_id else keys.control_broadcast
    return int(await client.publish(channel, encode_control(ControlCommand("clear_kv"))))


async def drain_worker(client: aioredis.Redis, keys: Keys, worker_id: str) -> int:
    """Ask one worker to drain; returns how many workers were listening (0: no such live worker)."""
    return int(await client.publish(keys.control_channel(worker_id), encode_control(ControlCommand("drain"))))
