"""A broker made highly available by Redis Sentinel: a mocker stack whose Redis is a primary with a
replica, watched by a sentinel (all started here, on loopback). The primary is killed (SIGKILL) while
a client sends requests in a loop, retrying 503s after a short pause as a real client would; requests
succeed again within 10 s of the kill, on the promoted replica, found through the sentinel by the
frontend, the workers' Celery consumers and their own Redis clients."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.chaos.support import MODEL, own_stack
from tests.support.redis_topologies import SentinelGroup

#: How long the client waits after a failed request before the next one.
RETRY_PAUSE_S = 0.2


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    with SentinelGroup().start() as group:
        yield group


def _complete(client: httpx.Client, n: int, errors: list[str] | None = None) -> int:
    """The answer's status (0: no answer); the error's code goes to ``errors``."""
    try:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": f"Count to {n}.", "max_tokens": 4,
                                                 "temperature": 0})
    except httpx.HTTPError:
        return 0
    if r.status_code != 200 and errors is not None:
        errors.append(f"{r.status_code} {r.json()['error']['code']}: {r.json()['error']['message']}")
    return r.status_code


def test_requests_succeed_again_within_10_s_of_killing_the_primary(sentinel_group: SentinelGroup,
                                                                   tokenizer_dir: Path) -> None:
    env = {"SLUICE_REDIS__SENTINEL_MASTER": sentinel_group.master_name, "SLUICE_ROUTER_MODE": "kv"}
    with own_stack(sentinel_group.url, tokenizer_dir, **env) as stack, \
            httpx.Client(base_url=stack.base_url, timeout=15) as client:
        for n in range(5):
            assert _complete(client, n) == 200
        old_primary = sentinel_group.primary()
        killed_at = sentinel_group.kill_primary()
        statuses: list[int] = []
        errors: list[str] = []
        recovered_at = None
        while time.monotonic() - killed_at < 30:
            status = _complete(client, len(statuses), errors)
            statuses.append(status)
            if status == 200:
                recovered_at = time.monotonic()
                break
            time.sleep(RETRY_PAUSE_S)
        assert recovered_at is not None, f"no success within 30 s of the kill: {statuses}"
        recovery_s = recovered_at - killed_at
        print(f"first success {recovery_s:.2f} s after the primary was killed; "
              f"{len(statuses) - 1} failed attempts before it ({sorted(set(statuses))})")
        assert sentinel_group.primary() != old_primary
        assert recovery_s < 10, f"{recovery_s:.1f} s to the first success after the kill: {statuses}"
        assert {s for s in statuses if s != 200} <= {0, 503, 429}, [e for e in errors if not e.startswith("503")]
        for n in range(5):  # and it stays up
            assert _complete(client, 100 + n) == 200
