"""Helpers for end-to-end tests of KV routing: waiting until the workers are idle in the routing
state, one chat completion's worker and cached tokens, and waiting for ``sluice router`` to answer."""

from __future__ import annotations

import time
from collections.abc import Iterable

import openai
import redis

from bench.devstack import Proc, wait_until
from core.keys import Keys


def wait_workers_idle(index: redis.Redis, keys: Keys, model: str, workers: Iterable[str], refresh_s: float,
                      settle_s: float = 0.0) -> None:
    """Until no routing prediction is left in ``index`` (the Redis holding the routing state), a
    heartbeat newer than this call reports every worker idle, and a frontend's registry snapshot
    (refreshed every ``refresh_s``) has had time to take it in: four refresh periods, or ``settle_s``
    if longer (a test whose outcome turns on every frontend's snapshot being idle)."""
    since = time.time()

    def idle() -> bool:
        if index.hlen(keys.router_inflight_requests(model)):
            return False
        for worker in workers:
            raw = {k.decode(): v.decode() for k, v in index.hgetall(keys.load(worker)).items()}
            load = {k: float(raw.get(k) or 0) for k in ("updated_at", "running", "waiting", "active_blocks")}
            if load["updated_at"] <= since or load["running"] or load["waiting"] or load["active_blocks"]:
                return False
        return True

    wait_until(idle, 30, "idle workers")
    # Snapshot refresh periods (not a guess at how fast the workers are), or the caller's longer margin.
    time.sleep(max(4 * refresh_s, settle_s))


def chat(client: openai.OpenAI, model: str, messages: list[dict], **kw: object) -> tuple[str, str, int, int]:
    """(worker, reply text, prompt tokens, cached tokens) of one non-streaming chat completion."""
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=8, **kw)
    r = raw.parse()
    return (raw.headers["x-sluice-worker"], r.choices[0].message.content, r.usage.prompt_tokens,
            r.usage.prompt_tokens_details.cached_tokens)


def wait_router(proc: Proc, url: str, timeout: float = 30) -> None:
    """Until the ``sluice router`` process ``proc`` answers ``GET {url}/workers``; fails at once if it exited."""
    proc.wait_serving(f"{url}/workers", "the router service", timeout)
