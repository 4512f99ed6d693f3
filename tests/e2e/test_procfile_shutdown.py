"""Ctrl-C on ``make run``'s stack: the processes of Procfile.disagg (the frontend, a prefill and a
decode mocker worker, the bookkeeper, Flower) under a Procfile launcher.

Idle, every process exits by itself before anything is killed: under ``honcho start`` itself
(whose SIGKILL comes 5 s after the first process exited) and under ``sluice start`` given no more
patience than that. With a request streaming, under ``sluice start``: the stream runs to its end
after the signal, longer than honcho would have waited, and then every process exits."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
from honcho.manager import KILL_WAIT

from bench.devstack import REPO, Stack, free_port
from tests.support.launched import Launched

MODEL = "smollm2"
PROCESSES = {"web.1", "prefill.1", "decode.1", "bookkeeper.1", "flower.1"}
HONCHO = [str(Path(sys.executable).parent / "honcho"), "start"]
SLUICE_START = [sys.executable, "-m", "sluice", "start"]
#: Flower's port as Procfile.disagg names it; each test's copy gets a free one instead.
FLOWER_PORT = "5555"


@contextmanager
def procfile_stack(redis_url: str, tokenizer_dir: Path, launcher: list[str]) -> Iterator[tuple[Stack, Launched]]:
    """Procfile.disagg's processes on the mocker (timing model at speed 1), under ``launcher``, ready;
    everything the launcher started is ended afterwards, whatever happened."""
    stack = Stack(redis_url=redis_url, namespace=f"procfile{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
                  env_extra={"SLUICE_ENGINE": "mocker", "SLUICE_WORKER__MOCKER__SPEEDUP": "1"})
    launched: Launched | None = None
    try:
        text = (REPO / "Procfile.disagg").read_text()
        assert FLOWER_PORT in text, "Procfile.disagg no longer names Flower's port 5555: update this test"
        procfile = stack.workdir / "Procfile"
        procfile.write_text(text.replace(FLOWER_PORT, str(free_port())))
        launched = Launched.start(stack.processes, [*launcher, "-f", str(procfile)],
                                  stack.env(SLUICE_PORT=str(stack.port)))
        stack.wait_ready(MODEL, workers=2, timeout=120)
        yield stack, launched
    finally:
        if launched is not None:
            launched.stop()
        stack.stop()


def _assert_all_exited_by_themselves(launched: Launched) -> None:
    output = launched.output()
    assert "SIGKILL" not in output, output
    assert set(launched.started()) == PROCESSES, output
    assert set(launched.stopped()) == PROCESSES, output


@pytest.mark.parametrize("launcher", [HONCHO, [*SLUICE_START, "--patience", str(KILL_WAIT)]],
                         ids=["honcho", "sluice-start"])
def test_an_idle_stack_stops_within_honchos_patience(redis_server, tokenizer_dir, launcher) -> None:  # noqa: ANN001
    with procfile_stack(redis_server.url, tokenizer_dir, launcher) as (_, launched):
        launched.wait_for_line("flower.1 started", 30)
        launched.interrupt()
        assert launched.wait_exit(60) == 130  # honcho's code for SIGINT
        _assert_all_exited_by_themselves(launched)


def test_a_streaming_request_finishes_before_the_stack_exits(redis_server, tokenizer_dir) -> None:  # noqa: ANN001
    with procfile_stack(redis_server.url, tokenizer_dir, SLUICE_START) as (stack, launched):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me everything."}],
                "max_tokens": 2000, "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
        with httpx.Client(base_url=stack.base_url, timeout=120) as client, \
                client.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            launched.interrupt()
            signalled = time.monotonic()
            rest = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
            streamed_s = time.monotonic() - signalled
        assert rest[-1] == "[DONE]"
        chunks = [orjson.loads(event) for event in rest[:-1]]
        assert not any("error" in chunk for chunk in chunks)
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 2000
        # The stream outlived honcho's own patience (2,000 tokens at the mocker's pace take about 12 s).
        assert streamed_s > KILL_WAIT
        assert launched.wait_exit(60) == 130
        _assert_all_exited_by_themselves(launched)
