"""Flower, started as the Procfile starts it, sees the running workers and the tasks they ran."""

from __future__ import annotations

import httpx
import openai

from bench.devstack import Stack, wait_until
from tests.e2e.conftest import MODEL
from tests.support.ports import free_port


def _get(port: int, path: str, **params: str) -> httpx.Response | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}{path}", params=params, timeout=5)
    except httpx.HTTPError:
        return None
    return r if r.status_code == 200 else None


def test_flower_lists_the_workers_and_their_tasks(stack: Stack, client: openai.OpenAI) -> None:
    port = free_port()
    stack._spawn("flower", ["flower", "--port", str(port)], stack.env())
    seen: set[str] = set()

    def workers_listed() -> bool:
        r = _get(port, "/api/workers", refresh="1")
        if r is not None:
            seen.update(name.split("@")[0] for name in r.json())
        return {"w1", "w2"} <= seen

    try:
        wait_until(workers_listed, 60, "Flower to list w1 and w2", interval=0.5)
        # A request made while Flower listens reaches its task list through the workers' task events
        # (batched by workers.consumer), with the task's name, worker and final state.
        completion = client.completions.create(model=MODEL, prompt="Flower check", max_tokens=3)
        request_id = completion.id.removeprefix("cmpl-")

        def task_listed() -> dict | None:
            r = _get(port, "/api/tasks", limit="1000")
            task = r.json().get(request_id) if r is not None else None
            return task if task and task.get("state") == "SUCCESS" else None

        task = wait_until_value(task_listed, 30, "Flower to list the request's task as succeeded")
        assert task["name"] == "sluice.generate" and task["worker"].split("@")[0] in {"w1", "w2"}
    finally:
        stack.kill("flower")


def wait_until_value(probe, timeout: float, what: str):  # type: ignore[no-untyped-def]
    found: list = []

    def check() -> bool:
        value = probe()
        if value is not None:
            found.append(value)
        return bool(found)

    wait_until(check, timeout, what, interval=0.25)
    return found[0]
