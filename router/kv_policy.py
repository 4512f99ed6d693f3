"""KV-aware routing: send a request where its prompt's prefix is cached, unless that worker is busier
than the cache hit is worth.

A decision is ONE Redis round trip whatever the number of workers: the router hashes the prompt and
sends its block keys with the id of its candidate table (router.worker_table; the table itself goes
once, with the first decision over it, and Redis keeps it) to one script (router.inflight,
``index_scripts.DECIDE``) that reads the bitmaps, the slot owner tags and the shared in-flight sums,
computes the costs (router.scoring's formula), picks and records the prediction atomically, so
frontends routing at the same moment take turns instead of piling onto one worker.
:meth:`KvPolicy.best` runs the same script without recording, pushing or settling anything (its dry
mode), so the standalone router answers exactly as the frontends decide; the tests hold the script to
an independent numpy oracle (tests/router/cost_oracle.py).

When the routing state lives apart from the broker (``enqueues=False``: a Redis of its own or a Redis
Cluster, core.redis_topology) the script cannot reach the worker's queue: it decides and records, and
the caller pushes the task on the broker (app.requests.enqueue), two round trips instead of one.

Releases and prefill-done marks ride along with the router's next decision (applied first in its
script), or go in one call of their own within :data:`SETTLE_DELAY_S` when no decision comes first.

Herding: a shared system prompt makes every request overlap most on the workers that cached it. The
load term stops the herd: each routed request adds its blocks to the worker's predicted decode load
at once, for every frontend, so once a cached worker is ``weight × overlap`` blocks busier than an idle
one, the idle one wins (and caches the prefix too).

Approximate mode, for engines that publish no KV events: the router records the prompt's blocks as
cached on the chosen worker for ``RouterSettings.approx_ttl_s``, at most ``approx_max_blocks`` (and the
worker's ``kv_blocks``) per worker, in the same call that records the prediction. Expired guesses go
when the worker is picked again or at the reaper's next sweep (router.reaper), whichever comes first.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Sequence

from core.background import BackgroundTasks
from core.errors import NoWorkerAvailable
from core.keys import Keys
from core.redis_topology import IndexClient
from core.settings import RouterSettings
from router.cluster_channel import routing_channel
from router.hashing import block_hashes, root_hash, token_bytes
from router.inflight import Decision, InflightStore
from router.policies import RouteDecision, RouteRequest, RouterOverrides
from router.prefix_index import PrefixIndex
from router.registry import LiveWorker
from router.time_cost import TimeWeights
from router.worker_table import TableBuilder, WorkerTable

log = logging.getLogger(__name__)

_root_hash = functools.lru_cache(maxsize=1024)(root_hash)

#: The longest a release or prefill-done mark waits for a decision to ride along with.
SETTLE_DELAY_S = 0.005


class KvPolicy:
    """The ``kv`` routing mode; one instance per process, shared by all its requests."""

    def __init__(self, client: IndexClient, keys: Keys, settings: RouterSettings,
                 *, rng: random.Random | None = None, enqueues: bool = True) -> None:
        """``client``: the Redis holding the routing state; ``enqueues``: it is also the broker, so the
        deciding script pushes the task message (False: the caller enqueues it)."""
        self.settings = settings
        self.enqueues = enqueues
        #: The one connection this policy's decisions, releases and reads go out on (one per shard on a cluster).
        self.channel = routing_channel(client)
        self.index = PrefixIndex(client, keys, channel=self.channel)
        self.inflight = InflightStore(client, keys, settings.inflight_ttl_s, channel=self.channel)
        self._rng = rng or random.Random()
        self._model_of: dict[str, str] = {}
        self._tables = TableBuilder(settings, self.inflight)
        self._background = BackgroundTasks("releasing a routing prediction")
        self._pending: dict[str, dict[str, str]] = {}
        self._flush_timer: asyncio.TimerHandle | None = None

    def _time_weights(self, over: RouterOverrides) -> TimeWeights | None:
        """The ``time`` cost's weights, or None for the ``blocks`` cost (the deployment's, or the
        request's own: a request that sets ``overlap_score_weight`` asks for the block formula)."""
        if (over.cost or self.settings.cost) != "time" or (over.cost is None and over.overlap_score_weight is not None):
            return None
        return TimeWeights(self.settings.decode_slowdown_weight, self.settings.eviction_weight)

    # ---- Policy ---------------------------------------------------------------------------------
    async def choose(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        """Pick a worker and record the request as in flight on it until :meth:`release`; with
        ``request.task``, also push the task onto the worker's queue (same call, ``enqueued``)."""
        if not workers:
            raise NoWorkerAvailable(f"no live worker serves model {request.model!r}")
        table = self._table(request.model, workers)
        self._model_of[request.request_id] = request.model  # release() works even if the call fails
        settle = self._take_pending(request.model)
        try:
            decision = await self._decide(request, table, settle)
        except BaseException:
            self._requeue(request.model, settle)
            raise
        if decision.approx_status == "busy":
            log.info("approximate guesses for %s skipped: its slot still holds a gone worker's blocks",
                     table.roster.ids[decision.index])
        record = table.workers[decision.index].record
        return RouteDecision(worker_id=record.worker_id, queue=record.queue, overlap_blocks=decision.overlap,
                             cost=decision.cost, enqueued=request.task is not None and self.enqueues)

    async def _decide(self, request: RouteRequest, table: WorkerTable, settle: list[tuple[str, str]], *,
                      dry: bool = False) -> Decision:
        """The deciding script's call for ``request`` over ``table``: its chain hashed at each block size."""
        over = request.overrides
        tokens = token_bytes(request.token_ids)
        root = _root_hash(request.model, request.lora)
        n_tokens = len(tokens) // 4
        return await self.inflight.decide(
            request.model, request.request_id, table.candidates,
            [block_hashes(tokens, bs, root) for bs in table.roster.block_sizes],
            [-(-n_tokens // bs) for bs in table.roster.block_sizes],
            weight=self.settings.overlap_score_weight if over.overlap_score_weight is None else over.overlap_score_weight,
            temperature=self.settings.temperature if over.temperature is None else over.temperature,
            u=self._rng.random(), pinned=table.roster.position.get(over.worker_id) if over.worker_id else None,
            approx_ttl_s=self.settings.approx_ttl_s, task=request.task if self.enqueues and not dry else None,
            settle=settle, time_weights=self._time_weights(over), dry=dry)

    async def prepare(self, model: str, workers: Sequence[LiveWorker]) -> None:
        """Build the candidate table of ``workers`` and store it in Redis now, off the request path (the
        frontend's worker directory calls this after each registry refresh), so that the first decision
        over it sends its id, not its columns. If this fails, that decision stores the table itself."""
        if workers:
            await self.inflight.store(model, self._table(model, workers).candidates)

    async def best(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        """The decision :meth:`choose` would make, by the same script in its dry mode: nothing is
        recorded, pushed or settled (the standalone router's query). One round trip."""
        if not workers:
            raise NoWorkerAvailable(f"no live worker serves model {request.model!r}")
        table = self._table(request.model, workers)
        decision = await self._decide(request, table, [], dry=True)
        record = table.workers[decision.index].record
        return RouteDecision(worker_id=record.worker_id, queue=record.queue, overlap_blocks=decision.overlap,
                             cost=decision.cost)

    def release(self, request_id: str) -> None:
        """The request finished: drop its prediction (in the background; see :meth:`flush`)."""
        model = self._model_of.pop(request_id, None)
        if model is not None:
            self._settle(model, request_id, "all")

    def prefill_done(self, request_id: str) -> None:
        """The request's first token is out: its prompt no longer counts as queued prefill."""
        model = self._model_of.get(request_id)
        if model is not None:
            self._settle(model, request_id, "prefill")

    async def flush(self) -> None:
        """Send the pending releases now and wait until they reached Redis (tests, shutdown)."""
        self._send_pending()
        await self._background.drain()

    async def aclose(self) -> None:
        """Flush, then close the policy's connection (process shutdown)."""
        await self.flush()
        await self.channel.aclose()

    def _settle(self, model: str, request_id: str, op: str) -> None:
        """Queue a release or prefill-done mark. Pending marks ride along with this router's next
        decision for the model (applied in its script before the costs: no call of their own), or go
        in one call of their own after :data:`SETTLE_DELAY_S` if no decision comes first. A
        prefill-done mark whose request is released before they are sent is dropped."""
        ops = self._pending.setdefault(model, {})
        if ops.get(request_id) != "all":
            ops[request_id] = op
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(SETTLE_DELAY_S, self._send_pending)

    def _take_pending(self, model: str) -> list[tuple[str, str]]:
        ops = self._pending.pop(model, None)
        return list(ops.items()) if ops else []

    def _requeue(self, model: str, ops: list[tuple[str, str]]) -> None:
        """Marks whose decision call failed go out on their own."""
        for request_id, op in ops:
            self._settle(model, request_id, op)

    def _send_pending(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        pending, self._pending = self._pending, {}
        for model, ops in pending.items():
            if ops:
                self._background.spawn(self.inflight.settle(model, list(ops.items())))

    # ---- the steps ------------------------------------------------------------------------------
    def _table(self, model: str, workers: Sequence[LiveWorker]) -> WorkerTable:
        return self._tables.table(model, workers)
