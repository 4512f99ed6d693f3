"""``GET /v1/models``: the models live workers serve right now, and the LoRA adapters loaded on them
(each with its ``parent``, the base model)."""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter
from starlette.responses import Response

from app.api.deps import RuntimeDep
from app.protocol.common import encode
from app.protocol.models import ModelCardOut, ModelList

router = APIRouter()


@router.get("/v1/models")
async def list_models(rt: RuntimeDep) -> Response:
    cards = []
    for name, workers in sorted(rt.directory.served_models().items()):
        first = workers[0].record
        cards.append(ModelCardOut(id=name, created=int(min(w.record.started_at for w in workers)),
                                  max_model_len=first.context_length, root=first.model_path,
                                  pools=dict(Counter(w.record.pool for w in workers))))
    for name, base in sorted(rt.directory.adapters().items()):
        holders = [w for w in rt.directory.by_model[base] if w.load.has_lora(name)]
        cards.append(ModelCardOut(id=name, created=int(min(w.record.started_at for w in holders)),
                                  max_model_len=holders[0].record.context_length, parent=base,
                                  pools=dict(Counter(w.record.pool for w in holders))))
    return Response(encode(ModelList(cards)), media_type="application/json")
