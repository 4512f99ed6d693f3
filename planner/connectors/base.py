"""The contract between the planner and what runs the workers.

A connector owns the replica count of each pool it is given: ``current`` reads it, ``scale`` sets it.
Scaling down must drain: a worker that goes finishes (or hands over) what it runs, so no stream is
lost; the connector chooses which workers go. ``scale`` returns once the change is under way, not
once the workers are up or gone: the planner reads what really runs from the workers' own leases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.pools import Pool


@dataclass(frozen=True, slots=True, order=True)
class PoolRef:
    """One pool of one model: what the planner sizes."""

    model: str
    pool: Pool

    def __str__(self) -> str:
        return f"{self.model}/{self.pool.value}"


class Connector(Protocol):
    #: A short name for logs and metrics (``local``, ``kubernetes``, ``virtual``).
    name: str

    async def current(self, pool: PoolRef) -> int | None:
        """Replicas the connector has asked for (or found) for ``pool``: what ``scale`` set last; None when
        it has no record of the pool (the planner then counts its live workers)."""
        ...

    async def scale(self, pool: PoolRef, replicas: int, reason: str) -> None:
        """Ask for ``replicas`` workers in ``pool``; ``reason`` is the decision's one-line why."""
        ...

    async def aclose(self) -> None:
        """Release what the connector holds (clients, processes it must leave running are left running)."""
        ...
