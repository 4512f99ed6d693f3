"""``GET /v1/usage?since=1d[&key_id=...]``: per-model totals of the calling key's requests.

An admin key may name any ``key_id``; any other key sees only its own. With auth off the report
covers the anonymous requests (``key_id`` null).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter

from app.accounts.periods import parse_since
from app.accounts.schemas import UsageReport
from app.api.deps import AccountsDep, CallerDep
from app.api.openapi import error_responses
from core.errors import Forbidden, InvalidRequest

router = APIRouter(tags=["usage"])


@router.get("/v1/usage", responses=error_responses(400, 401, 403))
async def usage(principal: CallerDep, accounts: AccountsDep, since: str = "1d",
                key_id: str | None = None) -> UsageReport:
    try:
        start = parse_since(since, datetime.now(UTC))
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="since") from None
    own = principal.key_id if principal is not None else None
    if key_id is not None and key_id != own and not (principal is not None and principal.is_admin):
        raise Forbidden("Only an admin key may read another key's usage.", param="key_id",
                        code="admin_key_required")
    return await accounts.usage_report(key_id if key_id is not None else own, start)
