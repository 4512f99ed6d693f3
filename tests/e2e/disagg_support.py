"""What the disaggregation end-to-end tests share (the mocker's and vLLM's)."""

from __future__ import annotations

import httpx
import redis

from bench.devstack import Stack, wait_until

#: A long prompt (about 1,700 tokens with the default model's tokenizer) and a short one.
LONG = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(130))
SHORT = "Say hello."


def wait_idle(r: redis.Redis, stack: Stack, *workers: str, timeout: float = 10) -> None:
    """Wait until each worker's load record shows no running request and no KV block in use."""
    def check() -> bool:
        loads = [r.hgetall(f"sluice:{stack.namespace}:load:{w}") for w in workers]
        return all(load.get(b"active_blocks") == b"0" and load.get(b"running") == b"0" for load in loads)
    wait_until(check, timeout, f"{', '.join(workers)} back to no active KV blocks")


def busy(r: redis.Redis, stack: Stack, worker: str) -> bool:
    """The worker's load record shows a request (one without output yet, a prefill, counts as waiting)."""
    load = r.hgetall(f"sluice:{stack.namespace}:load:{worker}")
    return int(load.get(b"running", 0)) + int(load.get(b"waiting", 0)) > 0


def counter(stack: Stack, name: str) -> float:
    """The frontend's counter ``name`` (``/metrics``), summed over its labels."""
    metrics = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(f"{name}{{"))
