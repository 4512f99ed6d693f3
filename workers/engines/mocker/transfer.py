"""KV transfer between a prefill worker and a decode worker, simulated (disaggregated serving).

Prefill side: a ``kv_export`` request computes its prompt (and first token) and, when it
finishes, keeps its blocks for the decode worker to read: its last output carries a handle
(:class:`KvHandle`), and the blocks stay held until the decode worker calls
``release_transfer`` or ``kv_hold_s`` passes, whichever comes first.

Decode side: a request with a mocker handle of the same block size first reads the prompt's KV.
Only the blocks not already in the local prefix cache move, taking :func:`transfer_s`; the
request waits meanwhile (as vLLM's do in WAITING_FOR_REMOTE_KVS), then joins the scheduler's
queue with only the rest of its prompt to compute. A read that would outlast the prefill
worker's hold fails at the hold's end, and the request computes its whole prompt here (as
vLLM's ``kv_load_failure_policy="recompute"`` does).

Nothing moves between processes: both sides only simulate the time and the blocks held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.settings import MockerSettings
from workers.engines.mocker.request import Request, RequestState
from workers.engines.mocker.scheduler import Scheduler

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KvHandle:
    """What a prefill worker's last output tells the decode worker (``EngineOutput.kv_handle``,
    a plain dict on the wire): how many prompt tokens' KV it holds, in blocks of which size."""

    num_tokens: int
    block_size: int

    def as_dict(self) -> dict[str, object]:
        return {"engine": "mocker", "num_tokens": self.num_tokens, "block_size": self.block_size}

    @classmethod
    def parse(cls, handle: Mapping[str, Any] | None, block_size: int) -> KvHandle | None:
        """The mocker handle in ``handle``; None for no handle, another engine's or another block
        size's (its blocks could not be read here)."""
        if not handle or handle.get("engine") != "mocker" or handle.get("block_size") != block_size:
            return None
        return cls(int(handle.get("num_tokens", 0)), block_size)


def transfer_s(blocks: int, settings: MockerSettings) -> float:
    """Seconds to move ``blocks`` KV blocks: ``blocks × kv_bytes_per_block / (transfer_gb_per_s × 1e9)
    / speedup``; 0 with ``no_sleep``."""
    s = settings
    return 0.0 if s.no_sleep else blocks * s.kv_bytes_per_block / (s.transfer_gb_per_s * 1e9) / s.speedup


class KvTransfer:
    """Held exports (prefill side) and reads in flight (decode side) of one engine.

    ``_held``: finished ``kv_export`` requests whose blocks wait for the decode worker's read, with
    the timers that end their hold. ``_pulls``: requests reading their prompt's KV, with the timers
    that end the read. A held request is done and out of the scheduler but keeps its blocks; a
    pulling one is waiting but not yet in the scheduler's queue.
    """

    def __init__(self, settings: MockerSettings, scheduler: Scheduler, hold_s: float) -> None:
        """``hold_s``: how long an export's blocks are held for a read (``DisaggSettings.kv_hold_s``);
        also how long a read may take before it is given up."""
        self.settings = settings
        self.hold_s = hold_s
        self._scheduler = scheduler
        self._held: dict[str, tuple[Request, asyncio.TimerHandle]] = {}
        self._pulls: dict[str, asyncio.TimerHandle] = {}

    # ---- prefill side -------------------------------------------------------------------------
    def hold(self, req: Request) -> None:
        """A finished export keeps its blocks for the decode worker's read, at most ``hold_s``."""
        timer = asyncio.get_running_loop().call_later(self.hold_s, self.release, req.request_id)
        self._held[req.request_id] = (req, timer)

    def handle(self, req: Request) -> dict[str, object] | None:
        """The handle for ``req``'s last output: set while its blocks are held for a read."""
        if req.request_id not in self._held:
            return None
        return KvHandle(req.prompt_len, self.settings.block_size).as_dict()

    def release(self, request_id: str) -> None:
        """Free the blocks held for ``request_id``'s read; unknown ids are a no-op."""
        held = self._held.pop(request_id, None)
        if held is not None:
            req, timer = held
            timer.cancel()
            self._scheduler.release(req)

    def release_all(self) -> None:
        for request_id in list(self._held):
            self.release(request_id)

    # ---- decode side --------------------------------------------------------------------------
    def start_pull(self, req: Request, handle: Mapping[str, Any] | None) -> bool:
        """Start reading ``req``'s prompt KV from the prefill worker ``handle`` names; False when the
        handle is not one this engine can read (the caller then queues ``req`` to compute it all)."""
        parsed = KvHandle.parse(handle, self.settings.block_size)
        if parsed is None:
            return False
        remote_tokens = min(parsed.num_tokens, req.prompt_len)
        req.remote_tokens = remote_tokens
        moved = max(0, -(-remote_tokens // self.settings.block_size) - self._scheduler.kv.cached_prefix(req.chain))
        delay = transfer_s(moved, self.settings)
        loop = asyncio.get_running_loop()
        if delay > self.hold_s:
            # The prefill worker frees the blocks at the end of its hold: a read that would take
            # longer fails then.
            self._pulls[req.request_id] = loop.call_later(self.hold_s, self._pull_failed, req)
        else:
            self._pulls[req.request_id] = loop.call_later(delay, self._pulled, req)
        return True

    def cancel_pull(self, req: Request) -> bool:
        """Stop ``req``'s read if it is in flight; False when it has none (it is the scheduler's)."""
        pull = self._pulls.pop(req.request_id, None)
        if pull is None:
            return False
        pull.cancel()
        return True

    def _pulled(self, req: Request) -> None:
        self._pulls.pop(req.request_id, None)
        if req.closed or req.state is not RequestState.WAITING:
            return
        req.pulled = True
        self._scheduler.add(req)

    def _pull_failed(self, req: Request) -> None:
        self._pulls.pop(req.request_id, None)
        if req.closed or req.state is not RequestState.WAITING:
            return
        log.warning("request %s: the KV read from the prefill worker timed out after %.1f s; computing the "
                    "prompt here", req.request_id, self.hold_s)
        req.remote_tokens = 0
        self._scheduler.add(req)
