"""The frontend's app factory.

Run it with ``sluice serve`` or ``uvicorn app.main:create_app --factory --port 8000``.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from app.api.openapi import install_openapi
from app.api.router import api_router
from app.body_limit import BodySizeLimit
from app.error_middleware import UnexpectedErrors
from app.runtime import FrontendRuntime
from core.http_errors import install_error_handlers
from core.logs import configure_logging
from core.parent_death import arm_parent_death_signal
from core.settings import Settings, get_settings

#: Recent FastAPI releases carry OpenTelemetry hooks that look up the global OpenTelemetry providers on
#: every request (about 5% of the frontend's CPU under load). Sluice exports Prometheus metrics
#: (``/metrics``) instead, so the hooks are off where the release has them.
_NO_TELEMETRY: dict[str, Any] = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                 if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def _settle_in_supervisor(settings: Settings) -> None:
    """In one of several frontend processes (``frontend.processes``), started by uvicorn's supervisor:
    end with the supervisor, also when it is killed with SIGKILL (SIGTERM here: open requests drain),
    and log as ``sluice serve`` does. A spawned process starts with logging unset; uvicorn has set its
    own loggers' level (the supervisor's ``--log-level``), which the process takes, and turned its
    access lines off, which stays so."""
    supervisor = multiprocessing.parent_process()
    if settings.frontend.processes <= 1 or supervisor is None:
        return
    arm_parent_death_signal(signal.SIGTERM, supervisor.pid)
    access = logging.getLogger("uvicorn.access")
    access_lines = access.propagate
    configure_logging(settings.log_format, logging.getLogger("uvicorn.error").getEffectiveLevel())
    access.propagate = access_lines


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    _settle_in_supervisor(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = FrontendRuntime(settings)
        await runtime.start()
        app.state.runtime = runtime
        runtime.drain.install()
        try:
            yield
        finally:
            runtime.drain.uninstall()
            await runtime.close()

    app = FastAPI(title="Sluice", version="0.1.0", lifespan=lifespan, **_NO_TELEMETRY)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.frontend.max_body_bytes)
    app.add_middleware(UnexpectedErrors)  # outermost of these: catches what the others raise too
    app.include_router(api_router)
    install_openapi(app)
    return app
