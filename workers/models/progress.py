"""Progress display for model preparation: one line per step on stderr, a bar for byte copies.

A disabled reporter prints nothing, so library callers and tests stay quiet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class Reporter:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)

    def note(self, message: str) -> None:
        if self.enabled:
            self.console.print(message)

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        """A spinner while the step runs, then a done line with its duration."""
        if not self.enabled:
            yield
            return
        started = time.monotonic()
        with self.console.status(description):
            yield
        self.console.print(f"[green]✓[/] {description} ({time.monotonic() - started:.1f} s)")

    @contextmanager
    def transfer(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """A byte progress bar; the body calls the yielded function with each chunk's size."""
        if not self.enabled:
            yield lambda n: None
            return
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=self.console, transient=False) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)
