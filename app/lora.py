"""Loading and unloading LoRA adapters on a model's workers (``/v1/load_lora_adapter``).

The frontend sends each target worker a ``load_lora`` (or ``unload_lora``) command on its control
channel and waits until every one has answered on a reply list in Redis. A worker answers once its
engine has the adapter and its load record lists it (workers.host), so when this returns the
adapter is routable: the directory is refreshed before answering, and routing sends an adapter's
requests only to workers that list it (app.directory). Block hashes are salted by the adapter
(router.hashing), so the prefix index keeps each adapter's cache apart.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, cast

import msgspec

from core.errors import InvalidRequest, ModelNotFound, UpstreamError
from core.messages import LORA, ControlCommand, LoraAck, encode_control
from router.registry import LiveWorker

if TYPE_CHECKING:
    from app.runtime import FrontendRuntime

_POLL_S = 0.05


def base_model(rt: FrontendRuntime, model: str | None) -> str:
    """The base model an adapter is loaded onto: the one named, or the only one served."""
    served = sorted(rt.directory.served_models())
    if model is not None:
        if model not in served:
            raise ModelNotFound(f"the model {model!r} is not served", param="model")
        return model
    if len(served) != 1:
        raise InvalidRequest(f"name the base model: this deployment serves {', '.join(served) or 'none'}",
                             param="model")
    return served[0]


def targets(rt: FrontendRuntime, model: str, worker_id: str | None) -> list[LiveWorker]:
    workers = rt.directory.workers_for(model)
    if worker_id is not None:
        workers = [w for w in workers if w.record.worker_id == worker_id]
        if not workers:
            raise InvalidRequest(f"worker {worker_id!r} is not serving {model!r}", param="worker_id")
    lacking = sorted({w.record.engine for w in workers if not w.record.supports(LORA)})
    if lacking:
        raise InvalidRequest(f"engine {', '.join(lacking)} serves no LoRA adapters (a vLLM worker needs "
                             "SLUICE_WORKER__VLLM__MAX_LORAS > 0)", param="model", code="unsupported_by_engine")
    return workers


async def command(rt: FrontendRuntime, op: Literal["load_lora", "unload_lora"], name: str, path: str | None,
                  workers: Sequence[LiveWorker]) -> None:
    """Send ``op`` to ``workers`` and wait for every answer; the first refusal is raised (a 400
    with the worker's reason), a worker that does not answer in time is a 502."""
    reply_key = rt.keys.lora_replies(uuid.uuid4().hex)
    cmd = encode_control(ControlCommand(op, lora_name=name, lora_path=path, reply_key=reply_key))
    async with rt.redis.pipeline(transaction=False) as pipe:
        for w in workers:
            pipe.publish(rt.keys.control_channel(w.record.worker_id), cmd)
        listening = await pipe.execute()
    missing = [w.record.worker_id for w, n in zip(workers, listening, strict=True) if not n]
    if missing:
        raise UpstreamError(f"worker(s) {', '.join(missing)} did not receive the command (not listening)")
    acks: list[LoraAck] = []
    deadline = time.monotonic() + rt.settings.frontend.lora_timeout_s
    try:
        while len(acks) < len(workers):
            raw = cast(list[bytes] | None, await rt.redis.lpop(reply_key, len(workers) - len(acks)))
            acks += [msgspec.json.decode(r, type=LoraAck) for r in raw or ()]
            if len(acks) < len(workers):
                if time.monotonic() > deadline:
                    answered = {a.worker_id for a in acks}
                    late = [w.record.worker_id for w in workers if w.record.worker_id not in answered]
                    raise UpstreamError(f"worker(s) {', '.join(late)} did not answer {op} in time")
                await asyncio.sleep(_POLL_S)
    finally:
        await rt.redis.delete(reply_key)
    await rt.directory.refresh()
    failed = [a for a in acks if not a.ok]
    if failed:
        done = [a.worker_id for a in acks if a.ok]
        note = f" (done on {', '.join(done)})" if done else ""
        raise InvalidRequest(f"worker {failed[0].worker_id}: {failed[0].error}{note}", param="lora_path"
                             if op == "load_lora" else "lora_name", code=failed[0].code or None)
