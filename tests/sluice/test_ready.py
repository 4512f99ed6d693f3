"""sluice.ready: the one line ``sluice serve`` prints once the stack is ready, against a real HTTP
server whose ``/ready`` goes from no answer to not ready to ready."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sluice.ready import Announcement, ReadyAnnouncer, ReadyState, banner


def test_banner_names_the_api_the_models_flower_and_auth() -> None:
    line = banner(Announcement("http://127.0.0.1:8000", flower_url="http://127.0.0.1:5555", auth=False),
                  ReadyState(True, {"smollm2": 2}))
    assert line == ("Sluice is ready: API http://127.0.0.1:8000/v1 | model smollm2 (2 workers) | "
                    "Flower http://127.0.0.1:5555 | no API key needed")
    line = banner(Announcement("http://h:1"), ReadyState(True, {"a": 1, "b": 1}))
    assert line == ("Sluice is ready: API http://h:1/v1 | models a (1 worker), b (1 worker) | "
                    "API keys required (sluice keys create --name NAME)")


class FakeReady:
    """``/ready`` answers: the states in order, each for one call, the last one forever."""

    def __init__(self, states: list[ReadyState]) -> None:
        self.states = states
        self.calls = 0

    def next(self) -> ReadyState:
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        return state


@pytest.fixture
def ready_server() -> Iterator[tuple[str, FakeReady]]:
    fake = FakeReady([ReadyState(False, {}), ReadyState(True, {"m": 1}), ReadyState(True, {"m": 2})])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            state = fake.next()
            body = json.dumps({"ready": state.ready, "models": state.models}).encode()
            self.send_response(200 if state.ready else 503)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", fake
    server.shutdown()
    server.server_close()


def test_announces_once_when_the_expected_workers_are_live(ready_server: tuple[str, FakeReady]) -> None:
    url, fake = ready_server
    out = io.StringIO()
    announcer = ReadyAnnouncer(Announcement(url, expect_workers=2, auth=False), out, poll_interval_s=0.05,
                               waiting_note_after_s=0.0).start()
    assert announcer.join(10)
    lines = out.getvalue().splitlines()
    assert lines == ["Sluice: waiting for a worker to register (SLUICE_ENGINE=vllm: about a minute to load on a CPU)",
                     f"Sluice is ready: API {url}/v1 | model m (2 workers) | no API key needed"]
    assert fake.calls == 3  # it stopped polling once it had announced


def test_waits_quietly_while_the_frontend_does_not_answer() -> None:
    out = io.StringIO()
    announcer = ReadyAnnouncer(Announcement("http://127.0.0.1:9"), out, poll_interval_s=0.05,
                               waiting_note_after_s=0.2).start()
    time.sleep(0.6)
    announcer.stop()
    assert out.getvalue().splitlines() == ["Sluice: waiting for the frontend at http://127.0.0.1:9 to answer"]
