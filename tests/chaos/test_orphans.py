"""Nothing runs for nobody: a dead frontend's requests stop on the workers, and a worker that comes
back after being declared lost drops the requests its frontend moved elsewhere."""

from __future__ import annotations

import signal
import time

from bench.devstack import wait_until
from tests.chaos.support import chat_stream, client_of, migrations, own_stack, running, worker_loads


def test_requests_of_a_killed_frontend_stop_on_the_workers(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, SLUICE_FRONTEND__LEASE_TTL_S="2",
                   SLUICE_WORKER__FRONTEND_GRACE_S="1") as s:
        idle_blocks = {w: load.active_blocks for w, load in worker_loads(s).items()}
        client = client_of(s)
        streams = [iter(chat_stream(client, 4000, f"story {i}")) for i in range(8)]
        for it in streams:
            next(it)  # each is running: about a minute of tokens ahead of it
        wait_until(lambda: sum(running(s).values()) == 8, 5, "8 requests running")
        s.kill("frontend")
        killed = time.monotonic()
        # Lease 2 s, grace 1 s, a heartbeat every second: well under 10 s, not the minute to max_tokens.
        wait_until(lambda: sum(running(s).values()) == 0, 15, "the dead frontend's requests to stop")
        assert time.monotonic() - killed < 10
        wait_until(lambda: {w: load.active_blocks for w, load in worker_loads(s).items()} == idle_blocks, 5,
                   "KV blocks back to idle")


def test_a_worker_back_from_a_freeze_drops_what_its_frontend_moved(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir) as s:
        client = client_of(s)
        streams = [iter(chat_stream(client, 1500, f"story {i}", worker="w1")) for i in range(4)]
        for it in streams:
            next(it)
        s.signal("w1", signal.SIGSTOP)
        try:
            # The frontend takes w1 for lost once its lease (3 s) lapses and moves the streams to w2.
            wait_until(lambda: sum(running(s).values()) == 4 and "w1" not in running(s), 15,
                       "the streams to move to w2")
        finally:
            s.signal("w1", signal.SIGCONT)
        # Back, w1 finds its lease lapsed, registers again and drops the requests it was running
        # (each had more than 1,000 tokens to go): it runs nothing for nobody.
        # (its next heartbeat: a second here, several on a machine the suite loads)
        wait_until(lambda: running(s).get("w1") == 0, 20, "w1 back and idle")
        for it in streams:
            assert sum(1 for _ in it) > 0  # every stream completes on w2
        assert migrations(s) == 4
