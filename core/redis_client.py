"""The options of Sluice's Redis clients (made by core.redis_topology): bounded timeouts and redis-py's
own retry with backoff, whatever redis-py release is installed (their defaults moved between releases).

* ``socket_connect_timeout`` and ``socket_timeout`` bound every connect and every command reply, so
  a Redis that is gone or frozen fails a call in seconds instead of hanging it. Blocking pub/sub
  reads (``get_message(timeout=None)``) are not commands and wait as long as they must.
* ``retry``: a command that fails on a connection error is retried on a fresh connection after a
  short jittered pause, which covers a connection Redis dropped while it sat in the pool; a Redis
  that stays away fails the call quickly (the frontend answers 503 at once, the background loops
  pause and try again: core/loops.py). A reply that does not come in time is NOT retried: the
  command was sent and may have run (a busy machine can stall the reading process past the limit
  while Redis answered at once), and running it again would publish a token delta twice, push a
  task twice or count a load twice. The call fails instead and its caller's own handling applies.
* ``socket_keepalive``: a dead peer on an idle connection (a subscriber) is noticed by TCP.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

#: Connect and reply limits, seconds.
CONNECT_TIMEOUT_S = 2.0
REPLY_TIMEOUT_S = 5.0


def redis_options(retries: int, backoff_cap_s: float) -> dict[str, Any]:
    return {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": REPLY_TIMEOUT_S,
        "socket_keepalive": True,
        "retry": Retry(ExponentialWithJitterBackoff(base=backoff_cap_s / 4, cap=backoff_cap_s), retries,
                       supported_errors=(RedisConnectionError,)),
    }
