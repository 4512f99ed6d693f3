"""``/metrics`` of one frontend process on a port of its own.

With several frontend processes behind one port (``SLUICE_FRONTEND__PROCESSES``), a scrape of the
shared port reaches whichever process accepts it. So each process also answers ``GET /metrics`` on an
ephemeral port of its own and publishes that address with its lease. Prometheus discovery
(``/prometheus/targets``, ``sluice observe``) then scrapes every process. The server is a few lines of
asyncio on the process's own loop, so a scrape reads Redis as the shared port's ``/metrics`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

#: How long a client may take to send its request head.
HEAD_TIMEOUT_S = 5.0
HEAD_LIMIT = 8192


class ProcessMetricsEndpoint:
    """A minimal HTTP/1.1 server: ``GET /metrics`` renders ``render()``; anything else is 404 or 405.
    One request per connection."""

    def __init__(self, render: Callable[[], Awaitable[bytes]]) -> None:
        self._render = render
        self._server: asyncio.Server | None = None

    async def start(self, host: str) -> int:
        """Listen on ``host`` and a free port; returns the port."""
        self._server = await asyncio.start_server(self._answer, host, 0, limit=HEAD_LIMIT)
        return self._server.sockets[0].getsockname()[1]

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, _, rest = head.partition(b" ")
            path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
            if path != b"/metrics":
                status, body, kind = b"404 Not Found", b"not found\n", b"text/plain"
            elif method not in (b"GET", b"HEAD"):
                status, body, kind = b"405 Method Not Allowed", b"method not allowed\n", b"text/plain"
            else:
                status, kind = b"200 OK", CONTENT_TYPE_LATEST.encode()
                body = await self._render()
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                         + (body if method != b"HEAD" else b""))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except Exception:  # a scrape that failed must not end the server
            log.exception("metrics endpoint: answering a scrape failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()
