"""The request-body limit (app.body_limit) and the web stack's own errors (404, 405) on the frontend's
app, in process: none of these reach a handler, so the app runs without its runtime."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI, Request

from app.body_limit import BodySizeLimit
from app.main import create_app
from core.http_errors import install_error_handlers
from core.settings import Settings

LIMIT = 4096


def too_large(r: httpx.Response) -> None:
    assert r.status_code == 413, r.text
    assert r.json() == {"error": {"message": f"the request body is larger than the limit of {LIMIT} bytes",
                                  "type": "invalid_request_error", "param": None, "code": "request_too_large"}}


@pytest.fixture
def frontend() -> Iterator[httpx.AsyncClient]:
    settings = Settings()
    settings.frontend.max_body_bytes = LIMIT
    app = create_app(settings)
    yield httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sluice")


def echo_app(read: list[int]) -> FastAPI:
    """An app whose one route reads the body and records how much it got."""
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=LIMIT)

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        read.append(len(await request.body()))
        return {"bytes": read[-1]}

    return app


async def chunks(n: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(n):
        yield b"x" * size


async def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(frontend: httpx.AsyncClient) -> None:
    too_large(await frontend.post("/v1/chat/completions", content=b"{" + b" " * LIMIT + b"}",
                                  headers={"content-type": "application/json"}))


async def test_a_chunked_body_is_cut_off_at_the_limit(frontend: httpx.AsyncClient) -> None:
    too_large(await frontend.post("/v1/chat/completions", content=chunks(8, 1024),
                                  headers={"content-type": "application/json"}))


async def test_bodies_within_the_limit_reach_the_app_whole() -> None:
    read: list[int] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=echo_app(read)), base_url="http://t") as client:
        assert (await client.post("/echo", content=b"x" * LIMIT)).json() == {"bytes": LIMIT}
        assert (await client.post("/echo", content=chunks(4, 1024))).json() == {"bytes": LIMIT}
        too_large(await client.post("/echo", content=b"x" * (LIMIT + 1)))
        too_large(await client.post("/echo", content=chunks(5, 1024)))
    assert read == [LIMIT, LIMIT]


async def test_unknown_route_and_wrong_method_are_openai_errors(frontend: httpx.AsyncClient) -> None:
    r = await frontend.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "Not Found", "type": "invalid_request_error", "param": None,
                                  "code": "not_found"}}
    r = await frontend.get("/v1/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json() == {"error": {"message": "Method Not Allowed", "type": "invalid_request_error", "param": None,
                                  "code": "method_not_allowed"}}
