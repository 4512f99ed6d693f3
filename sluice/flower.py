"""``sluice flower``: Flower, Celery's dashboard, on the stack's broker and namespace.

Usage (what ``sluice flower --port 5555`` runs)::

    from sluice.flower import run
    run(port=5555, address="127.0.0.1")

As it starts, Flower inspects the workers once: it broadcasts ``stats``, ``active_queues``,
``registered`` and ``conf`` and warns ``Inspect method <name> failed`` for each method that no worker
answered within its ``inspect_timeout`` (1 s). A stack starts Flower beside its workers (``make run``,
the Procfile), and a worker answers only once it is up (a vLLM worker loads its model for about a
minute first), so every start logged those four warnings. Nothing failed: Sluice's workers answer all
eight of Flower's inspect methods (those four, and ``scheduled``, ``active``, ``reserved`` and
``revoked`` on a worker's page). :class:`StartUpInspection` turns the four into one line saying that
no worker answered yet; Flower lists workers as their events come in (``worker-online``, heartbeats)
and inspects a worker when its page is opened. An inspection that no worker answers later still
warns, and a broker that cannot be reached is still an error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

#: What Flower broadcasts as it starts (``flower.inspector.Inspector.methods_to_inspect(None)``).
START_UP_METHODS = frozenset({"stats", "active_queues", "registered", "conf"})
#: Flower's warning for an inspection that no worker answered (``flower/inspector.py``); when the broker
#: cannot be reached it logs ``"Inspect method %s failed: %s"`` instead, which is left alone.
NO_REPLY = "Inspect method %s failed"
#: The start-up inspection goes out as Flower starts and ends an ``inspect_timeout`` later; a method's
#: first warning after this long comes from a later inspection.
START_UP_WINDOW_S = 60.0
INSPECTOR_LOGGER = "flower.inspector"


class StartUpInspection(logging.Filter):
    """On Flower's inspector logger: the first no-reply warning of each start-up method, within
    :data:`START_UP_WINDOW_S`, is dropped, and the first of them becomes one INFO line that says why.
    Flower logs them from its executor threads: the state is shared under a lock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._deadline = clock() + START_UP_WINDOW_S
        self._pending = set(START_UP_METHODS)
        self._said = False
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != NO_REPLY or not isinstance(record.args, tuple) or len(record.args) != 1:
            return True
        (method,) = record.args
        with self._lock:
            if method not in self._pending or self._clock() > self._deadline:
                return True
            self._pending.discard(method)
            if self._said:
                return False
            self._said = True
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        record.msg = ("no worker answered Flower's start-up inspection (none is up yet); workers appear as they "
                      "come online")
        record.args = ()
        return True


def run(port: int, address: str) -> int:
    """Run Flower on the stack's broker and namespace (workers.celery_app) until it is stopped. Its HTTP
    API is open (``FLOWER_UNAUTHENTICATED_API=true``) unless that variable is already set."""
    from workers.celery_app import app

    os.environ.setdefault("FLOWER_UNAUTHENTICATED_API", "true")
    logging.getLogger(INSPECTOR_LOGGER).addFilter(StartUpInspection())
    app.start(["flower", f"--port={port}", f"--address={address}"])
    return 0
