"""``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (vLLM's names and answers): load a
LoRA adapter on every worker of a model, or on one (``worker_id``), and drop it again (app.lora)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import PlainTextResponse, Response

from app.accounts.service import Principal
from app.api.deps import CallerDep, RuntimeDep
from app.api.openapi import error_responses
from app.lora import base_model, command, targets
from app.protocol.lora import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from core.errors import Forbidden, InvalidRequest

router = APIRouter()


def _operator(principal: Principal | None) -> None:
    """With auth on, adapters are an operator's business: an admin key is needed."""
    if principal is not None and not principal.is_admin:
        raise Forbidden("Loading and unloading LoRA adapters needs an admin key.", code="admin_key_required")

_TEXT: dict[int | str, dict[str, Any]] = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}}}


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse,
             responses={**_TEXT, **error_responses(400, 401, 403, 404, 502, 503)})
async def load_lora_adapter(body: LoadLoraAdapterRequest, rt: RuntimeDep, principal: CallerDep) -> Response:
    _operator(principal)
    if body.lora_name in rt.directory.served_models():
        raise InvalidRequest(f"{body.lora_name!r} is the name of a served model", param="lora_name")
    loaded = rt.directory.adapters()
    model = base_model(rt, body.model or loaded.get(body.lora_name))
    workers = targets(rt, model, body.worker_id)
    if all(w.load.has_lora(body.lora_name) for w in workers):
        raise InvalidRequest(f"the LoRA adapter {body.lora_name!r} has already been loaded", param="lora_name",
                             code="lora_exists")
    await command(rt, "load_lora", body.lora_name, body.lora_path,
                  [w for w in workers if not w.load.has_lora(body.lora_name)])
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse,
             responses={**_TEXT, **error_responses(400, 401, 403, 404, 502, 503)})
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, rt: RuntimeDep, principal: CallerDep) -> Response:
    _operator(principal)
    model = rt.directory.adapters().get(body.lora_name)
    if model is None:
        raise InvalidRequest(f"the LoRA adapter {body.lora_name!r} is not loaded", param="lora_name",
                             code="lora_not_found")
    workers = [w for w in rt.directory.workers_for(model, body.lora_name)
               if body.worker_id is None or w.record.worker_id == body.worker_id]
    if not workers:
        raise InvalidRequest(f"worker {body.worker_id!r} does not have {body.lora_name!r} loaded", param="worker_id")
    await command(rt, "unload_lora", body.lora_name, None, workers)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
