"""How many task messages wait in Celery queues, read from the broker's Redis lists.

kombu's Redis transport keeps one list per priority for each queue (core.keys.Keys.broker_queue_lists, under the namespace's broker prefix):
a queue's depth is the sum of their lengths. :func:`queue_list_keys` is the one place that names
those lists for a queue of a namespace; :func:`queue_depths` reads any number of queues in one
pipelined round trip (LLEN is O(1)), cheap enough for every Prometheus scrape.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from core.keys import Keys


def queue_list_keys(keys: Keys, queue: str) -> list[str]:
    """The Redis lists that hold the messages of Celery queue ``queue`` in ``keys``' namespace."""
    return keys.broker_queue_lists(queue)


async def queue_depths(client: aioredis.Redis, keys: Keys, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting in each of ``queues`` (every priority), in one round trip."""
    unique = list(dict.fromkeys(queues))
    if not unique:
        return {}
    lists = [queue_list_keys(keys, q) for q in unique]
    async with client.pipeline(transaction=False) as pipe:
        for names in lists:
            for name in names:
                pipe.llen(name)
        lengths = await pipe.execute()
    out: dict[str, int] = {}
    i = 0
    for queue, names in zip(unique, lists, strict=True):
        out[queue] = int(sum(lengths[i:i + len(names)]))
        i += len(names)
    return out
