"""Draining a worker (the ``drain`` command, or SIGTERM): it leaves routing at once, its requests
get the drain deadline to finish, and the ones still running then continue on another worker,
token for token; SIGTERM then exits."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys

import httpx

from bench.devstack import wait_until
from tests.chaos.support import MODEL, chat_stream, client_of, migrations, own_stack, running, text_of

#: Long enough that the streams outlast the drain's start (a ``sluice drain`` process on a loaded
#: machine takes seconds to start) plus its 1 s deadline by far: 600 tokens were not, once.
STREAM_TOKENS = 1800


def _drain_and_check(s, stop) -> None:  # noqa: ANN001
    client = client_of(s)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        reference = list(pool.map(
            lambda i: text_of(chat_stream(client, STREAM_TOKENS, f"story {i}", worker="w2")), range(4)))
    streams = [iter(chat_stream(client, STREAM_TOKENS, f"story {i}", worker="w1")) for i in range(4)]
    heads = [[next(it)] for it in streams]
    stop()
    # Out of routing at once: new requests go to w2.
    for _ in range(3):
        r = httpx.post(f"{s.base_url}/v1/chat/completions", timeout=30,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.headers["x-sluice-worker"] == "w2"
    # At the 1 s deadline the streams (several seconds from their end) move to w2 and finish there.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda i: text_of([*heads[i], *streams[i]]), range(4)))
    assert texts == reference
    assert migrations(s) == 4


def test_the_drain_command_moves_running_requests_at_its_deadline(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, SLUICE_WORKER__DRAIN_TIMEOUT_S="1") as s:
        def drain() -> None:
            out = subprocess.run([sys.executable, "-m", "sluice", "drain", "w1"], env=s.env(), capture_output=True,
                                 text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            wait_until(lambda: s.ready_workers().get(MODEL) == 1, 5, "w1 out of routing")

        _drain_and_check(s, drain)
        assert s.procs["w1"].alive() and running(s).get("w1") == 0  # drained, still up


def test_sigterm_past_the_drain_deadline_moves_what_runs_and_exits(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, SLUICE_WORKER__DRAIN_TIMEOUT_S="1") as s:
        def term() -> None:
            s.signal("w1", signal.SIGTERM)
            wait_until(lambda: s.ready_workers().get(MODEL) == 1, 5, "w1 out of routing")

        _drain_and_check(s, term)
        wait_until(lambda: not s.procs["w1"].alive(), 15, "w1 to exit")
