"""A KV event sink for tests that records what an engine reports."""

from __future__ import annotations

import threading

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent


class KvEventLog:
    """A KV event sink that records everything (engines may call it from their loop thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[KvEvent] = []

    def __call__(self, events: list[KvEvent]) -> None:
        with self._lock:
            self.events.extend(events)

    def replay(self) -> set[int]:
        """The cached block hashes a router following these events would hold."""
        held: set[int] = set()
        with self._lock:
            events = list(self.events)
        for ev in events:
            if isinstance(ev, BlockStored):
                held.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                held.difference_update(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                held.clear()
        return held
