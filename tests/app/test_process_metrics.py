"""A frontend process's own metrics endpoint (app.process_metrics): a real socket, real HTTP clients."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from app.process_metrics import ProcessMetricsEndpoint


async def render() -> bytes:
    return b"sluice_requests_total 3.0\n"


async def test_it_answers_metrics_and_refuses_the_rest() -> None:
    endpoint = ProcessMetricsEndpoint(render)
    port = await endpoint.start("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            ok = await client.get(f"{url}/metrics?x=1")
            assert ok.status_code == 200 and ok.text == "sluice_requests_total 3.0\n"
            assert ok.headers["content-type"].startswith("text/plain")
            head = await client.head(f"{url}/metrics")
            assert head.status_code == 200 and head.content == b""
            assert (await client.post(f"{url}/metrics")).status_code == 405
            assert (await client.get(f"{url}/other")).status_code == 404
        # A client that sends no request head, or garbage, is dropped; the server goes on.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x00" * 10_000)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        async with httpx.AsyncClient(timeout=5) as client:
            assert (await client.get(f"{url}/metrics")).status_code == 200
    finally:
        await endpoint.close()


async def test_a_failing_render_closes_the_connection_and_the_server_goes_on() -> None:
    calls = 0

    async def flaky() -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return b"ok 1\n"

    endpoint = ProcessMetricsEndpoint(flaky)
    port = await endpoint.start("127.0.0.1")
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            with contextlib.suppress(httpx.HTTPError):  # the connection closes without an answer
                await client.get(f"http://127.0.0.1:{port}/metrics")
            assert (await client.get(f"http://127.0.0.1:{port}/metrics")).text == "ok 1\n"
    finally:
        await endpoint.close()
