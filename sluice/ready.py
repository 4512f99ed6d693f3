"""The one line ``sluice serve`` prints once the stack can serve: where the API is, which models have
live workers, where Flower is and whether requests need a key.

Usage (what ``sluice serve`` does)::

    ReadyAnnouncer(Announcement(api_url="http://127.0.0.1:8000", flower_url=..., auth=False)).start()

Why a line of its own: uvicorn says it is running as soon as the frontend listens, which under
``make run`` is about a minute before a vLLM worker has loaded its model and ``/ready`` is true;
in between, the only output is the workers' start-up logs. The announcer polls the frontend's own
``/ready`` from a daemon thread (so it ends with the process and never delays requests) and prints
the banner once, when ``/ready`` is true and at least ``expect_workers`` workers are live; if that
takes longer than ``WAITING_NOTE_AFTER_S`` it first prints one line saying what it waits for.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

import httpx

POLL_INTERVAL_S = 0.5
#: After this long without a ready stack, one line says what is missing (vLLM on a CPU takes about a minute).
WAITING_NOTE_AFTER_S = 10.0


@dataclass(frozen=True, slots=True)
class Announcement:
    """What the banner says. ``api_url`` is the frontend's base URL (no ``/v1``)."""

    api_url: str
    flower_url: str | None = None
    auth: bool = True
    expect_workers: int = 1


@dataclass(frozen=True, slots=True)
class ReadyState:
    """The frontend's ``/ready`` answer: live workers per model the frontend knows of."""

    ready: bool
    models: dict[str, int]

    @property
    def workers(self) -> int:
        return sum(self.models.values())


def banner(announcement: Announcement, state: ReadyState) -> str:
    """The ready line, e.g. ``Sluice is ready: API http://127.0.0.1:8000/v1 | model smollm2 (2 workers) |
    Flower http://127.0.0.1:5555 | no API key needed``."""
    models = ", ".join(f"{name} ({n} worker{'' if n == 1 else 's'})" for name, n in state.models.items())
    parts = [f"API {announcement.api_url}/v1", f"model{'' if len(state.models) == 1 else 's'} {models}"]
    if announcement.flower_url:
        parts.append(f"Flower {announcement.flower_url}")
    parts.append("API keys required (sluice keys create --name NAME)" if announcement.auth else "no API key needed")
    return "Sluice is ready: " + " | ".join(parts)


def waiting_note(announcement: Announcement, state: ReadyState | None) -> str:
    if state is None:
        return f"Sluice: waiting for the frontend at {announcement.api_url} to answer"
    if not state.models:
        return "Sluice: waiting for a worker to register (SLUICE_ENGINE=vllm: about a minute to load on a CPU)"
    live = ", ".join(f"{name}: {n}" for name, n in state.models.items())
    return (f"Sluice: waiting for {announcement.expect_workers} live worker(s) (now {live}; "
            "a vLLM worker takes about a minute to load on a CPU)")


class ReadyAnnouncer:
    """Polls ``/ready`` until the stack is ready, prints :func:`banner` once, and stops."""

    def __init__(self, announcement: Announcement, out: TextIO | None = None, *,
                 poll_interval_s: float = POLL_INTERVAL_S, waiting_note_after_s: float = WAITING_NOTE_AFTER_S,
                 to_log: bool = False) -> None:
        """``to_log``: say it as a log record (``sluice.ready``, INFO) instead of printing it, for
        processes whose every line must be a log record (JSON logs)."""
        self.announcement = announcement
        self._out = out or sys.stdout
        self._to_log = to_log
        self._poll_interval_s = poll_interval_s
        self._waiting_note_after_s = waiting_note_after_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name="sluice-ready-announcer", daemon=True)

    def start(self) -> ReadyAnnouncer:
        self._thread.start()
        return self

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the announcer to finish; True once it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def poll(self, client: httpx.Client) -> ReadyState | None:
        """One ``/ready`` call; None while the frontend does not answer."""
        try:
            body = client.get(f"{self.announcement.api_url}/ready").json()
        except (httpx.HTTPError, ValueError):
            return None
        return ReadyState(ready=bool(body.get("ready")), models=dict(body.get("models") or {}))

    def run(self) -> None:
        started = time.monotonic()
        noted = False
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set():
                state = self.poll(client)
                if state is not None and state.ready and state.workers >= self.announcement.expect_workers:
                    self._print(banner(self.announcement, state))
                    return
                if not noted and time.monotonic() - started >= self._waiting_note_after_s:
                    self._print(waiting_note(self.announcement, state))
                    noted = True
                self._stop.wait(self._poll_interval_s)

    def _print(self, line: str) -> None:
        if self._to_log:
            logging.getLogger("sluice.ready").info(line)
        else:
            print(line, file=self._out, flush=True)
