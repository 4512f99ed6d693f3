"""What the chaos tests share: a stack of their own, and reading the workers' load from Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import redis.asyncio as aioredis

from bench.devstack import Stack
from core.keys import Keys
from router.registry import Registry, WorkerLoad

MODEL = "smollm2"


@contextmanager
def own_stack(redis_url: str, tokenizer_dir: Path, workers: tuple[str, ...] = ("w1", "w2"),
              frontend_env: dict[str, str] | None = None, worker_env: dict[str, dict[str, str]] | None = None,
              **env: str) -> Iterator[Stack]:
    """A mocker stack (timing model at speed 1) of its own namespace, stopped at the end; ``worker_env``:
    settings of some workers alone, by name."""
    s = Stack(redis_url=redis_url, namespace=f"chaos{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_ROUTER_MODE": "round_robin", **env})
    try:
        for name in workers:
            s.start_worker(name, **(worker_env or {}).get(name, {}))
        s.start_frontend(**(frontend_env or {}))
        s.wait_ready(MODEL, workers=len(workers))
        yield s
    finally:
        s.stop()


def migrations(s: Stack) -> float:
    """The frontend's count of requests moved to another worker."""
    for line in httpx.get(f"{s.base_url}/metrics", timeout=5).text.splitlines():
        if line.startswith(f'sluice_request_migrations_total{{model="{MODEL}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def client_of(s: Stack, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=timeout)


def worker_loads(s: Stack) -> dict[str, WorkerLoad]:
    """Each live worker's load as its last heartbeat published it."""

    async def read() -> dict[str, WorkerLoad]:
        client = aioredis.from_url(s.redis_url)
        try:
            return {w.record.worker_id: w.load for w in await Registry(client, Keys(s.namespace)).live_workers()}
        finally:
            await client.aclose()

    return asyncio.run(read())


def running(s: Stack) -> dict[str, int]:
    return {w: load.running for w, load in worker_loads(s).items()}


def chat_stream(client: openai.OpenAI, max_tokens: int, content: str = "Tell me everything.",
                worker: str | None = None) -> openai.Stream:
    headers = {"x-sluice-router": f"worker_id={worker}"} if worker else None
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens, stream=True,
        temperature=0, seed=3, extra_body={"ignore_eos": True}, extra_headers=headers)


def text_of(chunks) -> str:  # noqa: ANN001
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
