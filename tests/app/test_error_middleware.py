"""A bug's exception becomes an OpenAI-shaped 500 answered by the app itself: nothing reaches the
server, which would otherwise close the keep-alive connection."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from app.error_middleware import UnexpectedErrors
from core.http_errors import install_error_handlers


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(UnexpectedErrors)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/cut")
    async def cut() -> StreamingResponse:
        async def body():  # noqa: ANN202
            yield b"part"
            raise RuntimeError("a bug mid-stream")
        return StreamingResponse(body())

    return app


async def test_an_unhandled_exception_is_a_500_that_does_not_reach_the_server() -> None:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.get("/boom")
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "internal error", "type": "internal_error", "param": None, "code": None}}


async def test_a_stream_that_already_started_is_cut() -> None:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        with pytest.raises(RuntimeError, match="mid-stream"):
            await client.get("/cut")
