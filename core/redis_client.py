"""The options of Sluice's Redis clients (made by core.redis_topology): bounded timeouts and redis-py's
own retry with backoff, whatever redis-py release is installed (their defaults moved between releases).

* ``socket_connect_timeout`` and ``socket_timeout`` bound every connect and every command reply, so
  a Redis that is gone or frozen fails a call in seconds instead of hanging it. Blocking pub/sub
  reads (``get_message(timeout=None)``) are not commands and wait as long as they must.
* ``retry``: a command that fails on a connection error or timeout is retried on a fresh connection
  after a short jittered pause, which covers a connection Redis dropped while it sat in the pool;
  a Redis that stays away fails the call quickly (the frontend answers 503 at once, the background
  loops pause and try again: core/loops.py).
* ``socket_keepalive``: a dead peer on an idle connection (a subscriber) is noticed by TCP.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

#: Connect and reply limits, seconds.
CONNECT_TIMEOUT_S = 2.0
REPLY_TIMEOUT_S = 5.0


def redis_options(retries: int, backoff_cap_s: float) -> dict[str, Any]:
    return {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": REPLY_TIMEOUT_S,
        "socket_keepalive": True,
        "retry": Retry(ExponentialWithJitterBackoff(base=backoff_cap_s / 4, cap=backoff_cap_s), retries),
    }
