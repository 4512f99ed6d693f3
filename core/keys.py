"""Every Redis key pattern, channel name, Celery queue name and TTL that Sluice uses.

Everything lives under ``sluice:{namespace}:`` so several deployments can share one Redis server and
see nothing of each other: Sluice's own keys and channels directly, and the Celery broker's (kombu's
Redis transport: queues, bindings, the ``unacked`` hashes, the reply queues of remote control, and the
pub/sub channels of task events and broadcast commands) under :attr:`Keys.broker_prefix`, which
workers/celery_app.py gives kombu as its ``global_keyprefix``. A namespace has no ``:`` (core.settings),
so no namespace's prefix starts another's. Celery queue names use dots (``sluice.{ns}.{model}.{pool}``)
because they are also routing keys; the Redis list holding a queue is the broker prefix + its name.
The broker's own keys for a queue are named here too, for whatever pushes onto a queue or deletes one
without kombu (the frontend's enqueue, the routing script, the reaper).

Hash tags (``hash_tags=True``, for routing state on a Redis Cluster: core.redis_topology). A Redis
Cluster script may only touch keys of one hash slot, and a key's slot is that of the part between its
first ``{`` and the next ``}`` when there is one. So with hash tags the registry's keys (which the
registry's scripts and transactions touch together) carry the namespace's tag, ``sluice:NS:{NS}:...``,
and everything the prefix index and the in-flight sums keep for one model (block bitmaps, its workers'
block sets, guesses and records, its slot owners, its KV event stream, its in-flight sums) the model's,
``sluice:NS:{MODEL}:...``: one model's routing state sits on one shard, and the models spread over
the shards. Every name still starts with ``sluice:NS:``. Without hash tags (one Redis, or a Sentinel
primary) the names are what they always were, and a worker's index keys and the slot owners are
namespace-wide; the ``model`` arguments below then change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

#: How many KV event batches the ``kv-events`` stream keeps (approximately; ``XADD MAXLEN ~``).
KV_EVENTS_STREAM_MAXLEN = 100_000
#: How many worker slots (bit positions in the prefix index) a namespace may hand out.
MAX_WORKER_SLOTS = 4096
#: How long a router's candidate table (:meth:`Keys.router_table`) outlives the decision that stored it: the
#: router stores it again in a decision once half of this has passed, and replaces it at its next registry
#: snapshot, so this only bounds what a router that died leaves behind.
ROUTER_TABLE_TTL_MS = 60_000
#: How many decisions the planner's decision stream keeps (approximately; ``XADD MAXLEN ~``).
PLANNER_DECISIONS_MAXLEN = 10_000
#: The rate-limit window: API keys' limits are per minute (rpm, tpm), counted in fixed windows.
RATE_WINDOW_S = 60
#: How long a window's counters outlive the window's start (tokens may still be charged late).
RATE_WINDOW_TTL_S = 2 * RATE_WINDOW_S

# kombu's Redis transport (the Celery broker), as configured in workers/celery_app.py;
# tests/third_party/test_kombu_redis.py checks these against kombu's own Channel.
#: What kombu puts between a queue's name and its priority, and between the parts of a binding.
KOMBU_SEP = "\x06\x16"
#: The priorities kombu keeps a list for: priority 0 is the list named after the queue, the others
#: the queue's name followed by ``KOMBU_SEP`` and the priority (each behind ``Keys.broker_prefix``).
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)
#: The sets of an exchange's bindings (``%s``: the exchange), each member ``routing key, pattern, queue``.
KOMBU_BINDING_SETS = ("_kombu.binding.%s", "_kombu.binding_permanent.%s")


def broker_binding_member(queue: str) -> str:
    """A queue's member in its exchange's binding sets when bound with its own name as the routing key
    (Celery binds every queue a worker adds so, to the app's default exchange)."""
    return KOMBU_SEP.join((queue, "", queue))


@dataclass(frozen=True, slots=True)
class Keys:
    namespace: str
    #: Routing-state keys carry hash tags (a Redis Cluster holds them; see the module docstring).
    hash_tags: bool = False

    @property
    def prefix(self) -> str:
        return f"sluice:{self.namespace}"

    @property
    def _registry(self) -> str:
        """What the registry's keys start with (tagged with the namespace on a cluster)."""
        return f"{self.prefix}:{{{self.namespace}}}" if self.hash_tags else self.prefix

    def _model(self, model: str) -> str:
        """What the keys of one model's routing state start with (tagged with the model on a cluster)."""
        return f"{self.prefix}:{{{model}}}" if self.hash_tags else f"{self.prefix}:{model}"

    def _worker_index(self, model: str | None) -> str:
        """What a worker's prefix-index keys start with: its model's tag on a cluster, else namespace-wide."""
        if not self.hash_tags:
            return self.prefix
        if model is None:
            raise ValueError("with hash tags a worker's index keys need its model")
        return self._model(model)

    def _namespace_wide(self, suffix: str) -> str:
        """A key the prefix index keeps once per namespace without hash tags, and per model with them."""
        if self.hash_tags:
            raise ValueError(f"with hash tags {suffix!r} is per model: use the ``_of(model)`` form")
        return f"{self.prefix}:{suffix}"

    # --- worker registry -------------------------------------------------------------------
    @property
    def workers(self) -> str:
        """Sorted set: worker_id scored by its lease expiry (unix seconds)."""
        return f"{self._registry}:workers"

    def worker(self, worker_id: str) -> str:
        """Hash with TTL (the lease): the worker's registration."""
        return f"{self._registry}:worker:{worker_id}"

    def load(self, worker_id: str) -> str:
        """Hash with TTL: the worker's live load, renewed by every heartbeat."""
        return f"{self._registry}:load:{worker_id}"

    @property
    def slots(self) -> str:
        """Hash slot -> worker_id: the bit positions handed out for the prefix index."""
        return f"{self._registry}:slots"

    @property
    def worker_queues(self) -> str:
        """Hash worker_id -> JSON ``{"queue", "exchange"}``: the worker's own Celery queue and the exchange
        it is bound to. Written at registration, it outlives the lease: the reaper (router.reaper) reads
        it to delete a gone worker's queue, then deletes the entry."""
        return f"{self._registry}:worker-queues"

    # --- prefix index (KV-aware routing) ---------------------------------------------------
    def kv_block_prefix(self, model: str) -> str:
        """What every block bitmap key of ``model`` starts with; the 16 hex digits of the hash follow."""
        return f"{self._model(model)}:kv:"

    def kv_block(self, model: str, block_hash: int) -> str:
        """Bitmap: bit ``slot`` set when worker ``slot`` holds the block; deleted when no bit is left."""
        return f"{self.kv_block_prefix(model)}{block_hash:016x}"

    def kv_worker(self, worker_id: str, model: str | None = None) -> str:
        """Set of hex block hashes a worker reported through KV events, to purge them when it dies."""
        return f"{self._worker_index(model)}:kvw:{worker_id}"

    def kv_worker_approx(self, worker_id: str, model: str | None = None) -> str:
        """Sorted set hex block hash -> expiry (unix ms): the router's own guesses for a worker whose
        engine publishes no KV events (approximate mode)."""
        return f"{self._worker_index(model)}:kva:{worker_id}"

    def kv_worker_meta(self, worker_id: str, model: str | None = None) -> str:
        """Hash: the index's own record of a worker (``eid`` last applied KV event id, ``slot``, ``model``,
        ``bprefix``); outlives the lease so a reaper can purge the worker after its registration expired."""
        return f"{self._worker_index(model)}:kvm:{worker_id}"

    @property
    def kv_slot_owners(self) -> str:
        """Hash slot -> worker_id: whose bits the prefix index holds at each slot. A slot is written only by
        its owner; a new holder purges the previous owner's bits first, so a recycled slot has no stale bits.
        Namespace-wide without hash tags; with them, per model (:meth:`kv_slot_owners_of`)."""
        return self._namespace_wide("kv-slots")

    def kv_slot_owners_of(self, model: str) -> str:
        """:attr:`kv_slot_owners` as the scripts of ``model``'s index use it (the same key without hash tags)."""
        return f"{self._model(model)}:kv-slots" if self.hash_tags else self.kv_slot_owners

    @property
    def kv_slot_tags(self) -> str:
        """String of 4 bytes per slot: a 32-bit tag of the slot's owner (zero: none), written with
        ``kv_slot_owners``; routers read it with the bitmaps to ignore bits that are not the worker's."""
        return self._namespace_wide("kv-slot-tags")

    def kv_slot_tags_of(self, model: str) -> str:
        """:attr:`kv_slot_tags` as the scripts of ``model``'s index use it (the same key without hash tags)."""
        return f"{self._model(model)}:kv-slot-tags" if self.hash_tags else self.kv_slot_tags

    @property
    def kv_events(self) -> str:
        """Capped stream of KV event batches for observers (field ``b``: msgpack ``KvEventBatch``)."""
        return self._namespace_wide("kv-events")

    def kv_events_of(self, model: str) -> str:
        """:attr:`kv_events` as ``model``'s index writes it (with hash tags, one stream per model)."""
        return f"{self._model(model)}:kv-events" if self.hash_tags else self.kv_events

    def router_inflight(self, model: str) -> str:
        """String of two big-endian uint32 per worker slot: the routers' shared in-flight predictions
        summed per worker (decode blocks, then prefill blocks not computed yet)."""
        return f"{self._model(model)}:inflight"

    def router_inflight_requests(self, model: str) -> str:
        """Hash request_id -> ``"{slot} {decode_blocks} {prefill_blocks} {worker_id}"``: one prediction each."""
        return f"{self._model(model)}:inflight-req"

    def router_inflight_expiry(self, model: str) -> str:
        """Sorted set request_id -> expiry (unix ms): predictions nobody released (a frontend died) expire."""
        return f"{self._model(model)}:inflight-exp"

    def router_table(self, model: str, table_id: str) -> str:
        """String with TTL ``ROUTER_TABLE_TTL_MS``: one router's packed candidate table (router.inflight.
        Candidates), stored when the frontend's directory refreshes or by the decision that first uses
        it, so that decisions send its id instead of its columns."""
        return f"{self._model(model)}:table:{table_id}"

    # --- streaming and control ---------------------------------------------------------------
    def token_channel(self, frontend_id: str) -> str:
        """Pub/sub channel carrying the token deltas of every request of one frontend process."""
        return f"{self.prefix}:tok:{frontend_id}"

    def frontend_lease(self, frontend_id: str) -> str:
        """A frontend's lease (a key with a TTL): workers drop the requests of a frontend without one."""
        return f"{self.prefix}:frontend:{frontend_id}"

    @property
    def frontends(self) -> str:
        """Sorted set: frontend_id scored by its lease expiry (unix seconds), to list the live frontends.
        Each frontend's lease key (:meth:`frontend_lease`) holds its record (JSON: ``router.frontends``)."""
        return f"{self.prefix}:frontends"

    def control_channel(self, worker_id: str) -> str:
        """Pub/sub channel for cancel / clear-cache / drain commands to one worker."""
        return f"{self.prefix}:ctl:{worker_id}"

    def lora_replies(self, op_id: str) -> str:
        """List the workers push their answers to one ``load_lora``/``unload_lora`` command onto."""
        return f"{self.prefix}:lora-acks:{op_id}"

    @property
    def control_broadcast(self) -> str:
        """Pub/sub channel every worker listens to (cancels for requests whose worker is unknown)."""
        return f"{self.prefix}:ctl:*all*"

    # --- Celery queues and the broker's keys ------------------------------------------------------
    @property
    def broker_prefix(self) -> str:
        """kombu's ``global_keyprefix``: what every key and pub/sub channel of this namespace's Celery broker
        starts with (queue lists, binding sets, ``unacked*``, reply queues, the event and broadcast
        channels), so that workers, Flower and ``celery inspect`` of two namespaces never meet."""
        return f"{self.prefix}:celery:"

    def broker_queue_list(self, queue: str) -> str:
        """The Redis list of Celery queue ``queue`` at priority 0: where a task message is ``LPUSH``ed."""
        return f"{self.broker_prefix}{queue}"

    def broker_queue_lists(self, queue: str) -> list[str]:
        """The Redis lists holding the messages of Celery queue ``queue``, one per priority."""
        return [self.broker_queue_list(queue if pri == 0 else f"{queue}{KOMBU_SEP}{pri}")
                for pri in KOMBU_PRIORITY_STEPS]

    def broker_binding_sets(self, exchange: str) -> list[str]:
        """The Redis sets listing the queues bound to ``exchange`` (members: :func:`broker_binding_member`)."""
        return [self.broker_prefix + pattern % exchange for pattern in KOMBU_BINDING_SETS]

    def pool_queue(self, model: str, pool: str) -> str:
        return f"sluice.{self.namespace}.{model}.{pool}"

    def worker_queue(self, worker_id: str) -> str:
        return f"sluice.{self.namespace}.worker.{worker_id}"

    # --- accounts ----------------------------------------------------------------------------
    def rate(self, key_id: str, window: int) -> str:
        """Hash with TTL ``RATE_WINDOW_TTL_S``: one API key's counters in rate window ``window``
        (unix seconds // ``RATE_WINDOW_S``): ``r`` requests admitted, ``t`` tokens charged."""
        return f"{self.prefix}:rate:{key_id}:{window}"

    @property
    def bookkeeping_queue(self) -> str:
        """Celery queue of usage-record batches, consumed by the bookkeeper (workers.bookkeeping)."""
        return f"sluice.{self.namespace}.bookkeeping"

    # --- planner -------------------------------------------------------------------------------
    @property
    def planner_leader(self) -> str:
        """String with a TTL: the token of the planner process that acts for this namespace (a second one
        stands by until the key lapses; planner.leader)."""
        return f"{self.prefix}:planner:leader"

    @property
    def planner_decisions(self) -> str:
        """Stream of the planner's decisions (JSON, ``planner.decision.Decision``), newest last, capped at
        :data:`PLANNER_DECISIONS_MAXLEN`: what ``sluice planner status`` and an external orchestrator read."""
        return f"{self.prefix}:planner:decisions"

    @property
    def planner_state(self) -> str:
        """String: the planner's own state (JSON, ``planner.decision.PlannerState``): its last observations
        and actions, so a restarted planner resumes where the last one stopped."""
        return f"{self.prefix}:planner:state"

    @property
    def planner_targets(self) -> str:
        """Hash ``model/pool`` -> replicas: the virtual connector's decisions, for an external orchestrator."""
        return f"{self.prefix}:planner:targets"
