"""The stack as a user runs it: ``sluice serve`` + two ``sluice worker`` (mocker) subprocesses
against the session's private Redis, shared by the end-to-end tests of a session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import openai
import pytest

from bench.devstack import Stack

MODEL = "smollm2"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def stack(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"e2e{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__SPEEDUP": "1", "SLUICE_ROUTER_MODE": "round_robin"})
    try:
        s.start_worker("w1")
        s.start_worker("w2")
        s.start_frontend()
        s.wait_ready(MODEL, workers=2)
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
