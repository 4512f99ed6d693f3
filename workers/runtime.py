"""The worker process's runtime object: the one engine host this process runs."""

from __future__ import annotations

from dataclasses import dataclass

from workers.host import EngineHost


@dataclass
class WorkerRuntime:
    host: EngineHost | None = None

    def require_host(self) -> EngineHost:
        if self.host is None:
            raise RuntimeError("this worker's engine is not running")
        return self.host


#: The process's runtime (a Celery worker process hosts exactly one engine).
RUNTIME = WorkerRuntime()
