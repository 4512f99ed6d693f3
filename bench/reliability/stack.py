"""What the reliability parts share: a private Redis and a mocker stack started as a user starts
them, the completion bodies they send, and the frontend's counters read from ``/metrics``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.devstack import RedisServer, Stack
from core.settings import Settings
from workers.models.prepare import prepare_model

MODEL = "smollm2"
#: Pins a request to one worker (the router's override header).
ROUTER_HEADER = "x-sluice-router"


@contextmanager
def mocker_stack(workers: list[str], env: dict[str, str], prefix: str) -> Iterator[tuple[RedisServer, Stack]]:
    """A private Redis, the named mocker workers and one frontend, ready; all stopped at the end."""
    tok = prepare_model(MODEL, Settings().models_dir, weights=False, progress=False)
    server = RedisServer().start()
    stack = Stack(redis_url=server.url, namespace=f"{prefix}{uuid.uuid4().hex[:6]}", model_path=tok, env_extra=env)
    try:
        for name in workers:
            stack.start_worker(name)
        stack.start_frontend()
        stack.wait_ready(MODEL, workers=len(workers), timeout=120)
        yield server, stack
    finally:
        stack.stop()
        server.stop()


def completion(prompt: str, max_tokens: int, stream: bool = True) -> dict:
    """A greedy completion of exactly ``max_tokens`` tokens (the mocker's text is a function of the
    prompt and the position alone, so the same body gives the same text on any worker)."""
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def pinned(worker: str) -> dict[str, str]:
    return {ROUTER_HEADER: f"worker_id={worker}"}


def counter(base_url: str, name: str) -> float:
    """The sum over labels of the frontend's counter ``name`` (its ``_total`` sample), 0 if absent."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name)
