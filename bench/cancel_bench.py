"""Cancellation latency: `python -m bench.cancel_bench` (run by `make bench-vllm`, after the vLLM benchmark).

Starts a private Redis, one frontend and one mocker worker (real timing, speedup 1), then, many
times over: opens a long streaming chat completion, reads a few tokens, disconnects, and times how
long the worker takes to publish the request's final ``abort`` message (sent once the engine has
dropped the sequence and freed its KV blocks). Prints a table; writes bench/results/cancel.json.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path

import redis
from rich.console import Console
from rich.table import Table

from bench.devstack import RedisServer, Stack, final_delta, read_then_disconnect
from bench.stats import pct
from core.settings import Settings
from workers.models.prepare import prepare_model

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2"


def one_cancel(stack: Stack, watcher: redis.client.PubSub, i: int) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Tell story {i}."}], "max_tokens": 4000,
            "ignore_eos": True, "stream": True}
    request_id = read_then_disconnect(stack.base_url, body)
    closed_at = time.perf_counter()
    final = final_delta(watcher, request_id)
    latency = time.perf_counter() - closed_at
    if final is None:
        raise RuntimeError("the worker never ended the cancelled request")
    if final.finish_reason != "abort":
        raise RuntimeError(f"request ended with {final.finish_reason!r}, not abort")
    return latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    tok = prepare_model(MODEL, Settings().models_dir, weights=False, progress=False)
    server = RedisServer().start()
    stack = Stack(redis_url=server.url, namespace=f"cancel{uuid.uuid4().hex[:6]}", model_path=tok,
                  env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1"})
    client = redis.Redis.from_url(server.url)
    watcher = client.pubsub()
    try:
        stack.start_worker("w1")
        stack.start_frontend()
        stack.wait_ready(MODEL, workers=1)
        watcher.psubscribe(f"sluice:{stack.namespace}:tok:*")
        latencies = [one_cancel(stack, watcher, i) * 1000 for i in range(args.trials)]
    finally:
        watcher.close()
        client.close()
        stack.stop()
        server.stop()
    result = {"trials": len(latencies), "abort_ms_p50": pct(latencies, 50), "abort_ms_p99": pct(latencies, 99),
              "abort_ms_max": max(latencies)}
    table = Table(title="Disconnect -> abort on the worker (mocker, speedup 1)")
    for name in result:
        table.add_column(name, justify="right")
    table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in result.values()))
    Console().print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cancel.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
