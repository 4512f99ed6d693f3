"""Chaos tests: the stack as a user runs it (``sluice`` subprocesses on the session's private Redis),
with processes killed, frozen and restarted under the test's hand. Marked ``e2e`` like tests/e2e."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
