"""The floor frontend (see :mod:`bench.floor`): ``uvicorn --factory bench.floor.frontend:create_app``.

Without ``FLOOR_REDIS_URL`` it answers every chat request at once; with it, each request becomes a
Celery task on ``FLOOR_QUEUE`` and the answer arrives on this process's pub/sub channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator

import orjson
import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from core.wire import task_message

TASK = "floor.generate"


def _chunk(rid: str, content: str) -> bytes:
    return b"data: " + orjson.dumps({"id": rid, "object": "chat.completion.chunk", "model": "smollm2",
                                    "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}) + b"\n\n"


def _events(rid: str, tokens: int) -> list[bytes]:
    usage = {"id": rid, "object": "chat.completion.chunk", "model": "smollm2", "choices": [],
             "usage": {"prompt_tokens": 24, "completion_tokens": tokens, "total_tokens": 24 + tokens}}
    return [_chunk(rid, f" t{i}") for i in range(tokens)] + [b"data: " + orjson.dumps(usage) + b"\n\n",
                                                              b"data: [DONE]\n\n"]


class TaskPlane:
    """One Redis client and one subscription per process; each request waits on a future."""

    def __init__(self, url: str, queue: str) -> None:
        # As the frontend's own client: a bounded pool that makes callers wait, never fail.
        self.redis = aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(url, max_connections=64))
        self.queue = queue
        self.channel = f"floor:reply:{os.getpid()}"
        self.waiting: dict[str, asyncio.Future[int]] = {}
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self.channel)
        self._reader = asyncio.create_task(self._read(pubsub))

    async def _read(self, pubsub) -> None:  # noqa: ANN001
        async for message in pubsub.listen():
            rid, tokens = orjson.loads(message["data"])
            future = self.waiting.pop(rid, None)
            if future is not None and not future.done():
                future.set_result(tokens)

    async def submit(self, rid: str, tokens: int) -> int:
        future = asyncio.get_running_loop().create_future()
        self.waiting[rid] = future
        await self.redis.lpush(self.queue, task_message(TASK, [self.channel, rid, tokens], self.queue, task_id=rid))
        return await future

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        await self.redis.aclose()


def create_app() -> FastAPI:
    url = os.environ.get("FLOOR_REDIS_URL")
    plane = TaskPlane(url, os.environ.get("FLOOR_QUEUE", "floor")) if url else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if plane is not None:
            await plane.start()
        yield
        if plane is not None:
            await plane.stop()

    app = FastAPI(lifespan=lifespan)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "smollm2", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = orjson.loads(await request.body())
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        tokens = int(body.get("max_tokens") or 16)
        if plane is not None:
            tokens = await plane.submit(rid, tokens)

        async def stream() -> AsyncIterator[bytes]:
            for event in _events(rid, tokens):
                yield event

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app
