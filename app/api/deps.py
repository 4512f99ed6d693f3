"""Dependency aliases that keep handlers short."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import Depends, Request

from app.accounts.service import Accounts, Principal
from app.runtime import FrontendRuntime
from core.errors import InvalidRequest
from router.policies import RouterOverrides


async def _runtime(request: Request) -> FrontendRuntime:
    return request.app.state.runtime


def accounts_of(request: Request) -> Accounts:
    return request.app.state.runtime.accounts


async def caller(request: Request) -> Principal | None:
    """The authenticated caller (None with auth off); 401 for a missing or wrong key.

    As a dependency it runs before the request body is validated: a request without a valid key is
    answered 401 whatever its body holds.
    """
    return await accounts_of(request).authenticate(request.headers.get("authorization"))


RuntimeDep = Annotated[FrontendRuntime, Depends(_runtime)]
AccountsDep = Annotated[Accounts, Depends(accounts_of)]
CallerDep = Annotated[Principal | None, Depends(caller)]

_FLOAT_FIELDS = {"overlap_score_weight", "temperature", "disagg_min_tokens", "disagg_min_ratio", "max_migrations"}
_STR_FIELDS = {"mode", "worker_id", "disagg", "cost"}
_COSTS = {"time", "blocks"}


def parse_router_header(value: str | None) -> dict[str, object]:
    """``x-sluice-router: mode=kv, overlap_score_weight=2, temperature=0.5, worker_id=w1`` (and the
    disaggregation knobs ``disagg=auto|on|off, disagg_min_tokens=2048, disagg_min_ratio=0.7``, and
    ``max_migrations=N``)."""
    if not value:
        return {}
    out: dict[str, object] = {}
    for part in value.split(","):
        if not part.strip():
            continue
        name, sep, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or name not in _FLOAT_FIELDS | _STR_FIELDS:
            raise InvalidRequest(f"bad x-sluice-router entry {part.strip()!r}", param="x-sluice-router")
        if name in _FLOAT_FIELDS:
            try:
                number = float(raw)
            except ValueError:
                raise InvalidRequest(f"x-sluice-router: {name} must be a number", param="x-sluice-router") from None
            if not math.isfinite(number) or number < 0:
                raise InvalidRequest(f"x-sluice-router: {name} must be a finite number >= 0", param="x-sluice-router")
            out[name] = number
        elif name == "cost" and raw not in _COSTS:
            raise InvalidRequest("x-sluice-router: cost must be time or blocks", param="x-sluice-router")
        else:
            out[name] = raw
    return out


def router_overrides(header: str | None, extension: dict[str, object] | None) -> RouterOverrides:
    """The request's routing overrides: the body extension wins over the header."""
    merged = {**parse_router_header(header), **{k: v for k, v in (extension or {}).items() if v is not None}}
    # The values are typed by their parsers (the header's, the extension's pydantic model), not here.
    return RouterOverrides(**merged)  # type: ignore[arg-type]
