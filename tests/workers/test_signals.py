"""The worker's shutdown (workers/signals.py): once its engine has stopped, the heap is frozen, so
that the interpreter's exit does not spend seconds collecting what the engine loaded."""

from __future__ import annotations

import gc

import pytest

from workers import signals
from workers.runtime import RUNTIME


def test_the_heap_is_frozen_once_the_engine_has_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    frozen_at_stop: list[int] = []

    class Host:
        def stop(self) -> None:
            frozen_at_stop.append(gc.get_freeze_count())

    monkeypatch.setattr(RUNTIME, "host", Host())
    try:
        signals._stop()
        assert len(frozen_at_stop) == 1
        assert gc.get_freeze_count() > frozen_at_stop[0]  # frozen after the stop, not before
    finally:
        gc.unfreeze()
