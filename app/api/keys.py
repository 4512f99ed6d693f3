"""Key management over HTTP, for admin keys: ``POST /v1/admin/keys``, ``GET /v1/admin/keys``,
``DELETE /v1/admin/keys/{key_id}`` (revokes; keys are never deleted).

These routes need auth on: with ``SLUICE_AUTH=0`` nobody could be told apart from an admin, and a key
minted then would stay valid once auth is switched on; use ``sluice keys`` on the host instead.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from app.accounts.schemas import KeyCreate, KeyCreated, KeyInfo, KeyList
from app.accounts.service import Principal
from app.api.deps import AccountsDep, CallerDep
from app.api.openapi import error_responses
from core.errors import Forbidden


async def admin_caller(principal: CallerDep) -> Principal:
    if principal is None:
        raise Forbidden("Key management over HTTP needs auth on (SLUICE_AUTH=1); use `sluice keys` on the host.",
                        code="auth_disabled")
    if not principal.is_admin:
        raise Forbidden("This endpoint needs an admin key.", code="admin_key_required")
    return principal


AdminDep = Annotated[Principal, Depends(admin_caller)]

router = APIRouter(prefix="/v1/admin/keys", tags=["admin"])


@router.post("", status_code=201, responses=error_responses(400, 401, 403, 413))
async def create_key(body: KeyCreate, _: AdminDep, accounts: AccountsDep) -> KeyCreated:
    return await accounts.create_key(body)


@router.get("", responses=error_responses(400, 401, 403))
async def list_keys(_: AdminDep, accounts: AccountsDep, include_revoked: bool = False) -> KeyList:
    return KeyList(data=await accounts.list_keys(include_revoked=include_revoked))


@router.get("/{key_id}", responses=error_responses(401, 403, 404))
async def get_key(key_id: str, _: AdminDep, accounts: AccountsDep) -> KeyInfo:
    return await accounts.key_info(key_id)


@router.delete("/{key_id}", responses=error_responses(401, 403, 404))
async def revoke_key(key_id: str, _: AdminDep, accounts: AccountsDep) -> KeyInfo:
    return await accounts.revoke_key(key_id)
