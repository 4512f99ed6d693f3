"""The frontend's graceful shutdown on SIGTERM (and SIGINT).

uvicorn, on the signal, stops listening and waits for the open requests; left alone, sse-starlette
would end every open stream at once (its automatic drain, turned off here). Instead, from the
signal on: new requests get 503 with ``Retry-After`` and ``/ready`` says not ready (a load balancer
stops sending), open requests may finish for ``frontend.drain_timeout_s``, and then the ones still
open end with an error event and ``[DONE]`` (503 when not streamed), their workers told to stop.
uvicorn's own graceful-shutdown timeout (``sluice serve`` sets it a little longer) is the backstop.

The handler is chained in front of the one already installed (uvicorn's), so uvicorn still sees the
signal; a process that is not the main thread's (tests driving the app in-process) installs none.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from sse_starlette.sse import AppStatus

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulDrain:
    def __init__(self, timeout_s: float, on_deadline: Callable[[], None]) -> None:
        self.timeout_s = timeout_s
        self.draining = False
        self._on_deadline = on_deadline
        self._previous: dict[int, Any] = {}
        self._handlers: dict[int, Callable[[int, FrameType | None], None]] = {}

    def install(self) -> None:
        """Watch for SIGTERM/SIGINT (on the running loop's thread, which must be the main thread)."""
        AppStatus.disable_automatic_graceful_drain()
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            previous = signal.getsignal(sig)

            def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
                loop.call_soon_threadsafe(self.begin)
                if callable(previous):
                    previous(signum, frame)

            self._previous[sig] = previous
            self._handlers[sig] = handler
            signal.signal(sig, handler)

    def uninstall(self) -> None:
        """Put the handlers that were there back (where nobody replaced ours meanwhile)."""
        for sig, handler in self._handlers.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, self._previous[sig])
        self._handlers.clear()

    def begin(self) -> None:
        """Stop taking requests; end the open ones at the drain deadline."""
        if self.draining:
            return
        self.draining = True
        log.info("shutting down: taking no new request; open requests have %.0f s to finish", self.timeout_s)
        asyncio.get_running_loop().call_later(self.timeout_s, self._deadline)

    def _deadline(self) -> None:
        log.warning("drain deadline passed: ending the requests still open")
        self._on_deadline()
