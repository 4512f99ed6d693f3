"""The chaos suite: the stack started as a user would, then broken as production breaks it (killed
and frozen processes, a restarted Redis, shutdowns, floods). Each test owns its stack."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
