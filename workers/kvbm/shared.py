"""The shared tier: block frames in a Redis server of their own, read by every worker of the model.

Keys are ``sluice-kvbm:{scope}:{hash}`` with a TTL; the server's ``maxmemory`` policy evicts what it
must, silently (a later read of an evicted block is a miss). Every call is bounded by a timeout; a tier
that fails or times out is skipped for a back-off, so a dead shared Redis costs recomputes, not errors
and not waits.
"""

from __future__ import annotations

import threading
import time

import redis


class TierDown(RuntimeError):
    """The tier failed or timed out; callers count it and recompute."""


class SharedTier:
    name = "shared"

    def __init__(self, url: str, scope: str, *, ttl_s: float, timeout_s: float, down_backoff_s: float) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                            health_check_interval=0)
        self._prefix = f"sluice-kvbm:{scope}:".encode()
        self._ttl_ms = int(ttl_s * 1000)
        self._backoff_s = down_backoff_s
        self._down_until = 0.0
        self._lock = threading.Lock()

    def _key(self, block_hash: int) -> bytes:
        return self._prefix + b"%016x" % (block_hash & ((1 << 64) - 1))

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    def _failed(self) -> TierDown:
        with self._lock:
            self._down_until = time.monotonic() + self._backoff_s
        return TierDown("shared KV tier unavailable")

    def get_many(self, block_hashes: list[int]) -> list[bytes | None]:
        """The frames of ``block_hashes`` (None where missing), in one round trip. Raises :class:`TierDown`."""
        if self.down:
            raise TierDown("shared KV tier backing off")
        try:
            values = self._client.mget([self._key(h) for h in block_hashes])
        except redis.RedisError as exc:
            raise self._failed() from exc
        return [v if isinstance(v, bytes) else None for v in values]

    def exists_many(self, block_hashes: list[int]) -> list[bool]:
        if self.down:
            raise TierDown("shared KV tier backing off")
        try:
            pipe = self._client.pipeline(transaction=False)
            for h in block_hashes:
                pipe.exists(self._key(h))
            return [bool(n) for n in pipe.execute()]
        except redis.RedisError as exc:
            raise self._failed() from exc

    def put_many(self, frames: list[tuple[int, bytes]]) -> None:
        if self.down:
            raise TierDown("shared KV tier backing off")
        try:
            pipe = self._client.pipeline(transaction=False)
            for h, frame in frames:
                pipe.set(self._key(h), frame, px=self._ttl_ms)
            pipe.execute()
        except redis.RedisError as exc:
            raise self._failed() from exc

    def close(self) -> None:
        self._client.close()
