"""The one settings object of Sluice.

Every option reads from the environment with the ``SLUICE_`` prefix; nested groups use a double
underscore (``SLUICE_ROUTER__MODE=kv``) and the most used ones also have a flat alias
(``SLUICE_ROUTER_MODE``). Nothing else in the code base reads ``os.environ`` for Sluice options.
Build it once per process with :func:`get_settings` and pass the groups down.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.pools import Pool

#: The engines a worker can host, by name: the names of ``workers.engines.registry.ENGINES`` (a unit test
#: holds them equal; core/ cannot import the registry, which lives above it).
EngineKind = Literal["mocker", "vllm"]
RouterMode = Literal["kv", "round_robin", "random", "least_loaded", "pool"]
#: A Redis namespace: no ``:``, so that no namespace's key prefix (``sluice:{ns}:``, core.keys) starts another's.
NAMESPACE_PATTERN = r"^[A-Za-z0-9_-]+$"


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "sluice"


class RedisSettings(BaseModel):
    """Where Sluice's Redis state lives (core.redis_topology; README, "Outgrowing one Redis").

    ``url`` is the Celery broker and everything that rides on it (queues, token streams, control
    channels, frontend leases, rate limits): a ``redis://`` URL, or ``sentinel://host:port`` URLs
    joined by ``;`` for a broker made highly available by Redis Sentinel (``sentinel_master`` names
    the monitored primary). ``index_url`` holds the routing state (worker registry, prefix index,
    in-flight sums); unset, the broker's Redis holds it too and a routing decision enqueues in the same
    call. ``index_cluster``: ``index_url`` is a node of a Redis Cluster (keys then carry hash tags,
    core.keys)."""

    url: str = "redis://127.0.0.1:6379/0"
    namespace: str = Field("default", pattern=NAMESPACE_PATTERN)
    index_url: str | None = None
    index_cluster: bool = False
    sentinel_master: str = "mymaster"


class EngineSettings(BaseModel):
    """What every engine's settings group has. Each engine's group is a subclass, a field of
    :class:`WorkerSettings` named as the engine; its spec (``workers.engines.spec.EngineSpec``) names
    the class."""

    #: Batch size, and the worker's Celery concurrency (unless ``SLUICE_WORKER__CONCURRENCY`` is set).
    max_num_seqs: int = Field(64, ge=1)


class MockerSettings(EngineSettings):
    """Simulated engine. Timing follows the published model of Dynamo's mocker (see workers/engines/mocker/timing.py)."""

    speedup: float = Field(1.0, gt=0)
    no_sleep: bool = False
    block_size: int = Field(16, ge=1)
    kv_blocks: int = Field(16384, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    vocab_size: int = Field(49152, ge=17)
    #: Disaggregation: bytes one KV block takes (a transfer moves blocks x this) and the link's
    #: bandwidth; 2 x 30 layers x 3 heads x 64 dims x 2 bytes x 16 tokens: SmolLM2-135M in bf16.
    kv_bytes_per_block: int = Field(737_280, ge=1)
    transfer_gb_per_s: float = Field(1.4, gt=0)
    #: Scripted outputs (workers/engines/mocker/script.py): a JSON file of ``{"match", "output"}``.
    script: Path | None = None


class VllmSettings(EngineSettings):
    """The vLLM engine (workers/engines/vllm/engine.py; docs/engines.md). Prefix caching and KV
    cache events are always on; the block size and KV capacity the worker registers are vLLM's own."""

    #: ``auto``: float32 on CPU (no native bf16 on most CPUs), the model's dtype on GPU.
    dtype: str = "auto"
    #: KV block size in tokens; unset: 32 on CPU (it needs a multiple of 32), vLLM's default on GPU.
    block_size: int | None = None
    #: KV cache size on CPU.
    kv_cache_gib: float = Field(1.0, gt=0)
    #: Context length served (registered, enforced by the frontend); unset: the model's.
    max_model_len: int | None = None
    #: Batch size, and the worker's Celery concurrency.
    max_num_seqs: int = Field(64, ge=1)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    #: CPU compute threads (OMP_NUM_THREADS of the engine core); unset: vLLM's own binding, one
    #: thread per physical core minus one. scripts/worker.sh sets cores / workers.
    omp_threads: int | None = Field(None, ge=1)
    #: No CUDA graphs and no compilation. Unset: eager on CPU (start-up time), CUDA graphs on a GPU
    #: (vLLM's own default: eager, vLLM's server did about a third of the requests per second on an H200).
    enforce_eager: bool | None = None
    #: Prefill and decode pools (vLLM's NixlConnector): the address this worker's NIXL side channel
    #: listens on, which decode workers connect to (reachable from them), and its port (unset: a
    #: free one).
    nixl_host: str = "127.0.0.1"
    nixl_port: int | None = Field(None, ge=1, le=65535)
    #: LoRA adapters (``POST /v1/load_lora_adapter``): how many may serve one batch; 0 turns LoRA off
    #: (vLLM's ``--enable-lora``), and the highest adapter rank taken.
    max_loras: int = Field(0, ge=0)
    max_lora_rank: int = Field(16, ge=1)


class WorkerSettings(BaseModel):
    engine: EngineKind = "mocker"
    pool: Pool = Pool.AGG
    worker_id: str | None = None
    heartbeat_interval_s: float = Field(1.0, gt=0)
    lease_ttl_s: float = Field(3.0, gt=0)
    #: A request whose frontend has had no lease for this long is dropped (its client is gone).
    #: Longer than the frontend's lease refresh, so a Redis restart does not orphan live requests.
    frontend_grace_s: float = Field(3.0, gt=0)
    #: Draining (SIGTERM, or the ``drain`` control command): running requests get this long to
    #: finish; the ones still running then end with ``worker_draining`` and their frontends move
    #: them to another worker (migration).
    drain_timeout_s: float = Field(60.0, ge=0)
    concurrency: int | None = None
    #: Send Celery task events (Flower's task views need them; they cost worker CPU per task).
    task_events: bool = True
    #: The worker's Prometheus ``/metrics`` (docs/metrics.md): the address it listens on, its port
    #: (0: a free one, chosen at start; -1: no endpoint), and the host name other processes reach it
    #: at, registered with the worker (unset: ``metrics_host``, or this machine's address when that is
    #: a wildcard such as 0.0.0.0: core.addresses).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(0, ge=-1, le=65535)
    metrics_advertise_host: str | None = None
    mocker: MockerSettings = MockerSettings()
    vllm: VllmSettings = VllmSettings()


class RouterSettings(BaseModel):
    mode: RouterMode = "kv"
    #: The ``kv`` mode's cost (docs/routing.md): ``blocks``, the block-count formula (router.scoring)
    #: weighed by ``overlap_score_weight``; ``time``, each worker's predicted time to first token from
    #: its own step-time model (router.time_cost). ``blocks`` stays the default until ``time`` measures
    #: better (bench/dynamo_compare.py; docs/routing.md has the figures).
    cost: Literal["time", "blocks"] = "blocks"
    #: ``time`` cost: weight of the delay a prefill adds to the worker's running decodes (ms summed
    #: over them), and of the recompute time of the cached blocks it evicts from a full cache.
    decode_slowdown_weight: float = Field(0.05, ge=0)
    eviction_weight: float = Field(1.0, ge=0)
    overlap_score_weight: float = Field(16.0, ge=0)
    #: What the cost makes of the blocks a worker's KV tiers hold past its cache (docs/routing.md, "KV
    #: tiers"): each worker's published credit per tier, times this (0: device blocks alone count, and no
    #: tier key is read). 0 until it measures better: crediting the tiers made returning conversations
    #: stick to the worker whose host tier held them and queue there for KV room, while with a shared
    #: tier any worker onboards them (bench/kvbm_bench.py; docs/kvbm.md has the figures).
    tier_credit_scale: float = Field(0.0, ge=0, le=1)
    temperature: float = Field(0.0, ge=0)
    registry_refresh_s: float = Field(0.25, gt=0)
    #: Approximate mode (engines without KV events): how long a routed prompt's blocks count as cached.
    approx_ttl_s: float = Field(120.0, gt=0)
    #: Approximate mode: at most this many guessed blocks per worker (and never more than its ``kv_blocks``).
    approx_max_blocks: int = Field(65536, ge=1)
    #: Treat every worker as approximate, whatever its engine reports.
    approximate: bool = False
    #: A routed request's shared load prediction expires after this long if nobody releases it.
    inflight_ttl_s: float = Field(600.0, gt=0)
    #: How often a router process (frontend, router service) reaps gone workers (router.reaper).
    reaper_interval_s: float = Field(2.0, gt=0)
    host: str = "127.0.0.1"
    port: int = 8001


class DisaggSettings(BaseModel):
    """Disaggregated prefill (router/disagg.py): when a request's prefill goes to the prefill pool.
    Used only while a model has live prefill workers; each is overridable per request
    (``x-sluice-router: disagg=off,disagg_min_tokens=...``)."""

    enabled: bool = True
    #: Remote only if the decode worker's uncached part of the prompt is at least this many tokens...
    min_tokens: int = Field(2048, ge=0)
    #: ...and at least this share of the prompt...
    min_ratio: float = Field(0.7, ge=0, le=1)
    #: ...and the prefill pool has fewer than this many requests waiting.
    max_prefill_queue: int = Field(64, ge=0)
    #: How long a prefill worker holds a prompt's blocks for the decode worker to read.
    kv_hold_s: float = Field(30.0, gt=0)


class FrontendSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8000
    #: Frontend processes behind the one port (uvicorn's workers): each is a whole frontend of its own,
    #: with its own token subscription, lease and ``/metrics`` (on a port of its own too, which it
    #: publishes for Prometheus discovery). More than one uses more cores of the machine.
    processes: int = Field(1, ge=1)
    stall_timeout_s: float = Field(30.0, gt=0)
    request_timeout_s: float = Field(600.0, gt=0)
    #: ``max_tokens`` of a chat completion that names none (at most what the context leaves). 256
    #: holds a small chat model's usual answer and ends one that repeats itself (SmolLM2-135M at its
    #: recommended temperature 0.2 sometimes does) after about 15 s on a CPU worker, where 1,024 took a
    #: minute; vLLM's server would allow the whole remaining context and OpenAI's API sets no limit.
    default_max_tokens: int = Field(256, ge=1)
    #: ``max_tokens`` of a ``/v1/completions`` request that names none: OpenAI's 16.
    default_completion_max_tokens: int = Field(16, ge=1)
    #: Sampling defaults for fields a request leaves out: ``auto``, the model's generation_config.json
    #: (as vLLM's ``--generation-config auto``); ``none``, OpenAI's (temperature 1, top_p 1).
    generation_config: Literal["auto", "none"] = "auto"
    #: Per-deployment defaults over either (``SLUICE_FRONTEND__SAMPLING_DEFAULTS='{"temperature": 0.7}'``).
    sampling_defaults: dict[Literal["temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                                    "repetition_penalty"], float] = Field(default_factory=dict)
    #: The most choices (``n``) one request may ask for.
    max_n: int = Field(16, ge=1)
    #: How long ``/v1/load_lora_adapter`` waits for every worker to load the adapter (vLLM reads it from disk).
    lora_timeout_s: float = Field(120.0, gt=0)
    #: Tool-call parser per model (``hermes``, ``llama3_json``, ``pythonic``); a model not named
    #: here gets the one its chat template implies (app.output.parser_choice).
    tool_parsers: dict[str, Literal["hermes", "llama3_json", "pythonic"]] = Field(default_factory=dict)
    #: Reasoning parser per model (``think``, ``deepseek_r1``, ``none``); unnamed: from its template.
    reasoning_parsers: dict[str, Literal["think", "deepseek_r1", "none"]] = Field(default_factory=dict)
    #: How many times one request may move to another worker after its worker was lost (its lease
    #: expired), continuing from the tokens already streamed; 0 turns migration off.
    max_migrations: int = Field(3, ge=0)
    #: Admission control (app/requests/admission.py): at most this many requests routed by this frontend
    #: waiting for their first token per worker; beyond it, 429 with Retry-After. 0: no bound.
    max_waiting_per_worker: int = Field(256, ge=0)
    overload_retry_after_s: int = Field(1, ge=1)
    #: Larger request bodies are refused (413) before they are read whole (app/body_limit.py).
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    #: The longest a request may wait for a worker to take it (queued, no prefill started yet);
    #: past it, 429 with Retry-After (an error event on a stream). 0: only the request timeout.
    max_queue_wait_s: float = Field(60.0, ge=0)
    #: The frontend's own lease in Redis, refreshed every fifth of it: workers drop the requests
    #: of a frontend whose lease lapsed (it died: nobody reads their tokens).
    lease_ttl_s: float = Field(5.0, gt=0)
    #: SIGTERM: open requests get this long to finish (new ones get 503), then end with an error
    #: event; the process exits when they are done.
    drain_timeout_s: float = Field(30.0, ge=0)
    #: How long an idle HTTP keep-alive connection stays open. Longer than clients and proxies keep theirs
    #: (aiohttp 15 s, load balancers typically 60 s): a server that closes first races the client's next
    #: request on that connection, which then fails as a disconnect (a 502 behind a proxy).
    keep_alive_s: int = Field(75, ge=1)
    #: SSE comment pings on open streams (a queued request's connection stays alive behind proxies); 0: none.
    sse_ping_s: float = Field(15.0, ge=0)
    #: The host name other processes (Prometheus, ``sluice status``) reach this frontend at, published
    #: with its lease (unset: ``host``, or this machine's address when that is a wildcard: core.addresses).
    advertise_host: str | None = None


class AccountsSettings(BaseModel):
    """API keys, rate limits and usage records (app/accounts, workers/bookkeeping).

    A revoked key stops working on every frontend within ``key_cache_ttl_s``: that is how long a
    frontend trusts a key it looked up in the database.
    """

    key_cache_ttl_s: float = Field(5.0, gt=0)
    key_cache_max_entries: int = Field(10_000, ge=1)
    usage_flush_interval_s: float = Field(1.0, gt=0)
    usage_batch_max: int = Field(500, ge=1)
    usage_buffer_max: int = Field(100_000, ge=1)
    usage_retry_backoff_max_s: int = Field(60, ge=1)


class KvbmSettings(BaseModel):
    """KV tiers below a worker's engine cache (workers/kvbm; docs/kvbm.md): a full block is offloaded to
    each tier that is on, and a later prompt onboards it from the fastest tier that holds it instead of
    recomputing it. Every tier is off by default; a tier that fails, corrupts a block or answers slower
    than ``timeout_ms`` costs a recompute, never an error."""

    #: Host memory tier: its byte budget (0: off). LRU, with a frequency filter once full: a block seen
    #: less often than the one it would evict is not admitted, so one-off prompts do not flush hot prefixes.
    host_bytes: int = Field(0, ge=0)
    #: Local disk tier: a directory and its byte budget (0 or no directory: off). It outlives the worker,
    #: so a restarted worker comes back warm.
    disk_dir: Path | None = None
    disk_bytes: int = Field(0, ge=0)
    #: Shared tier: a Redis server of its own (``maxmemory`` with an eviction policy), read by every
    #: worker of the model; None: off. Blocks are keyed by the router's block hashes.
    redis_url: str | None = None
    #: How long a block lives in the shared tier (and in the router's record of it) unless evicted first.
    shared_ttl_s: float = Field(3600.0, gt=0)
    #: A tier read slower than this is abandoned (the block is recomputed); a tier that failed is skipped
    #: for ``down_backoff_s``.
    timeout_ms: float = Field(200.0, gt=0)
    down_backoff_s: float = Field(5.0, gt=0)
    #: Blocks waiting to be offloaded; past this, offloads are dropped (counted), never waited for.
    offload_queue_blocks: int = Field(65536, ge=1)
    #: The mocker's simulated tiers (and every engine's prior for the router's credit until onboards are
    #: measured): bandwidth in GB/s and a fixed latency per read, in ms.
    host_gb_per_s: float = Field(20.0, gt=0)
    host_latency_ms: float = Field(0.05, ge=0)
    disk_gb_per_s: float = Field(4.0, gt=0)
    disk_latency_ms: float = Field(0.2, ge=0)
    shared_gb_per_s: float = Field(2.5, gt=0)
    shared_latency_ms: float = Field(0.5, ge=0)

    def read_s(self, tier: str, blocks: int, block_bytes: int) -> float:
        """Seconds one read of ``blocks`` blocks from ``tier`` takes by its configured latency and bandwidth."""
        gb_per_s: float = getattr(self, f"{tier}_gb_per_s")
        latency_ms: float = getattr(self, f"{tier}_latency_ms")
        return latency_ms / 1000.0 + blocks * block_bytes / (gb_per_s * 1e9)

    @property
    def enabled(self) -> bool:
        return self.host_bytes > 0 or self.disk_on or self.redis_url is not None

    @property
    def disk_on(self) -> bool:
        return self.disk_dir is not None and self.disk_bytes > 0


class PlannerThresholds(BaseModel):
    """The threshold modes' triggers (planner.modes): a pool grows when its workers' mean KV usage passes
    ``kv_high`` or more than ``queue_high`` requests per worker wait (in the engines and the queues),
    and shrinks while one worker fewer would keep the usage under ``kv_low`` with nothing waiting."""

    kv_high: float = Field(0.8, gt=0, le=1)
    kv_low: float = Field(0.4, ge=0, lt=1)
    queue_high: float = Field(2.0, ge=0)


class PlannerSettings(BaseModel):
    """``sluice planner`` (planner/, docs/planner.md): one per namespace, it sizes each pool of each model."""

    #: ``throughput``: grow on queue depth and KV usage, no profile needed; ``latency``: the same, earlier;
    #: ``load``: the same with ``load_thresholds``; ``sla``: replicas from the predicted load and the
    #: profile (``profile``), to meet ``ttft_s`` and ``itl_s``.
    mode: Literal["throughput", "latency", "load", "sla"] = "throughput"
    #: ``local``: starts and stops ``sluice worker`` processes on this machine; ``kubernetes``: scales each
    #: pool's Deployment; ``virtual``: writes its decisions to Redis for an orchestrator to carry out.
    connector: Literal["local", "kubernetes", "virtual"] = "local"
    #: The models it sizes (unset: ``SLUICE_MODEL``) and their layout: ``agg`` sizes the agg pool,
    #: ``disagg`` the prefill and decode pools.
    models: list[str] = Field(default_factory=list)
    layout: Literal["agg", "disagg"] = "agg"
    #: The adjustment interval, and the fast path that reacts to bursts between adjustments (it only grows).
    interval_s: float = Field(60.0, gt=0)
    fast_interval_s: float = Field(5.0, gt=0)
    #: How the next interval's rate, input and output lengths are predicted (planner.predictors); ``constant``
    #: erred least on the bench's day (docs/planner.md, "Predictors").
    predictor: Literal["constant", "moving_average", "arima", "kalman"] = "constant"
    #: The moving average's window, in intervals (ARIMA fits its last 60: planner.predictors).
    predictor_window: int = Field(10, ge=1)
    #: Replicas per pool, and of all pools of all models together.
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(8, ge=1)
    budget: int = Field(16, ge=1)
    #: Hysteresis: a pool shrinks only after this many intervals in a row that wanted fewer workers, and
    #: not within this many intervals of growing.
    down_after_intervals: int = Field(2, ge=1)
    cooldown_intervals: int = Field(2, ge=0)
    #: ``sla`` mode: the targets (mean TTFT and mean ITL per interval) and the profile ``sluice profile`` wrote.
    ttft_s: float = Field(2.0, gt=0)
    itl_s: float = Field(0.05, gt=0)
    profile: Path | None = None
    #: ``sla`` mode: the highest share of a prefill worker's time the plan fills, so queueing leaves
    #: prompts within the TTFT target.
    prefill_utilization: float = Field(0.7, gt=0, le=1)
    #: ``sla`` mode: the share of each target the plan aims at. The model predicts means; aiming under
    #: the targets leaves room for the spread around them, so that most requests meet them, not half.
    sla_margin: float = Field(0.8, gt=0, le=1)
    #: ``sla`` mode, ``disagg`` layout: the share of the ITL target at which the floor takes the KV target
    #: (the usage it brings the load already there down to) of a decode pool whose prompts the prefill pool
    #: computes. Its streams' ITL spreads little around the pool's mean, so the floor needs no margin under
    #: the target there; pools that compute prompts keep ``sla_margin`` (docs/planner.md, "The floor of a
    #: decode pool apart"). None: ``sla_margin``. It holds where the prefill pool takes every prompt
    #: (``SLUICE_DISAGG__MIN_TOKENS`` 0, as the bench runs); where conditional disaggregation keeps shorter
    #: prompts on the decode workers, set it to ``sla_margin``.
    decode_floor_margin: float | None = Field(1.0, gt=0, le=1)
    #: ``sla`` mode: the predicted rate is raised by this many standard deviations of an interval's Poisson
    #: arrivals (planner.modes.with_headroom), so that a busier than average interval meets the targets too.
    #: On the bench's day 0, 0.5 and 1.3 all met the targets at 8-second intervals (98-100% of requests);
    #: at the default 60-second ones an interval's spread is small and 0 met them too, for 0.06-0.1x fewer
    #: of the oracle's worker-seconds than 0.5 (docs/planner.md, "The rate headroom", "The sure shrink").
    rate_headroom_z: float = Field(0.0, ge=0)
    #: ``sla`` mode: a pool shrinks at once, without the hysteresis' intervals, when the rate fell from the
    #: previous interval's by more than this many standard deviations and even a rate this many above the
    #: observed one needs fewer workers: a fall that noise cannot explain (at 3, one steady interval in 700
    #: passes the first test). 0 turns it off (docs/planner.md, "The sure shrink").
    sure_shrink_z: float = Field(3.0, ge=0)
    #: ``sla`` mode: the fast path grows a pool at once to what the rate of the interval so far needs when
    #: its arrivals passed the forecast's by more than this many standard deviations, within the cooldown
    #: of a shrink too (a ramp's first seconds, not a flap). 0 turns it off (docs/planner.md, "The sure rise").
    sure_rise_z: float = Field(3.0, ge=0)
    #: ``sla`` mode: a pool grows on its plan only when the plan's fractional need passes its size by more
    #: than this share of it (a need of 5.2 holds 5 workers at 0.05); the plan aims at ``sla_margin`` of the
    #: targets, so a few percent over still meets them. The floor, a sure rise and the burst thresholds grow
    #: past it. 0: grow on any excess (docs/planner.md, "The up-band").
    up_band: float = Field(0.05, ge=0, le=0.25)
    #: ``sla`` mode: the floor (the load already on a pool) grows a pool only while the arrivals are above
    #: the forecast by at least this many standard deviations: on the fast path those of the interval so far,
    #: at an interval's end those of the interval that ended; such a rise also lifts the floor's hold within
    #: the cooldown of a shrink, as the sure rise does. Otherwise it only keeps a loaded pool from shrinking.
    #: 0: the floor always grows a pool (docs/planner.md, "The floor on a rise").
    floor_rise_z: float = Field(0.0, ge=0)
    #: ``sla`` mode: fold each interval's observed over expected TTFT and ITL into the plan (Dynamo's
    #: correction factor). Off by default: the workers' own step models already scale the profile, and on
    #: the bench's day the latency ratios of intervals of a few requests swung the plan both ways
    #: (docs/planner.md, "The latency correction").
    correction: bool = False
    #: ``sla`` mode, ``disagg`` layout: the prefill pool may shrink to 0 when the decode pool alone, its
    #: workers computing the prompts themselves (conditional disaggregation, router/disagg.py: with no
    #: prefill worker live every prompt stays local), meets the targets with fewer workers than the two
    #: pools together (planner.modes.SlaPlanner.plan); the other pools keep ``min_replicas``. Off: every
    #: pool keeps ``min_replicas`` (docs/planner.md, "Prefill to zero").
    local_prefill: bool = False
    throughput_thresholds: PlannerThresholds = PlannerThresholds()
    latency_thresholds: PlannerThresholds = PlannerThresholds(kv_high=0.6, kv_low=0.25, queue_high=0.5)
    load_thresholds: PlannerThresholds = PlannerThresholds()
    #: The fast path grows a pool at once past these (a burst that cannot wait for the next interval).
    burst_kv: float = Field(0.9, gt=0, le=1)
    burst_queue: float = Field(4.0, gt=0)
    #: The leader's lock: a planner that stops renewing it loses it after this long.
    lock_ttl_s: float = Field(15.0, gt=0)
    #: Where the load is read: ``redis`` (what frontends and workers publish) or ``prometheus`` (the
    #: frontends' metrics through ``prometheus_url``; workers' load still from Redis).
    source: Literal["redis", "prometheus"] = "redis"
    prometheus_url: str | None = None
    #: ``local`` connector: where it keeps its workers' state and logs (unset: the cache dir's ``planner``),
    #: and the command that starts one worker (unset: this Python's ``-m sluice worker``); each worker
    #: gets ``--name`` and ``SLUICE_MODEL``/``SLUICE_WORKER__POOL`` in its environment.
    local_dir: Path | None = None
    worker_command: list[str] = Field(default_factory=list)
    #: ``kubernetes`` connector: the namespace, and each pool's Deployment (``{model}`` and ``{pool}`` are
    #: filled in).
    k8s_namespace: str = "sluice"
    k8s_deployment: str = "worker-{pool}"
    #: The planner's Prometheus ``/metrics`` (planner.metrics): address and port (0: a free one; -1: none),
    #: and the host name Prometheus reaches it at, published with its lease (router.discovery; unset:
    #: ``metrics_host``, or this machine's address when that is a wildcard).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=-1, le=65535)
    metrics_advertise_host: str | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SLUICE_", env_nested_delimiter="__", extra="ignore", populate_by_name=True
    )

    model: str = "smollm2"
    model_path: Path | None = None
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    redis: RedisSettings = RedisSettings()
    worker: WorkerSettings = WorkerSettings()
    router: RouterSettings = RouterSettings()
    frontend: FrontendSettings = FrontendSettings()
    disagg: DisaggSettings = DisaggSettings()
    database_url: str | None = None
    auth: bool = True
    #: How every process logs (core.logs): ``text`` lines, or one JSON object per line.
    log_format: Literal["text", "json"] = "text"
    accounts: AccountsSettings = AccountsSettings()
    kvbm: KvbmSettings = KvbmSettings()
    planner: PlannerSettings = PlannerSettings()

    # Flat aliases for the options people set most; they override the nested form, and are validated
    # as it is (``model_post_init`` copies them without validation).
    redis_url: str | None = Field(None, validation_alias=AliasChoices("SLUICE_REDIS_URL"))
    index_redis_url: str | None = Field(None, validation_alias=AliasChoices("SLUICE_INDEX_REDIS_URL"))
    namespace: str | None = Field(None, pattern=NAMESPACE_PATTERN, validation_alias=AliasChoices("SLUICE_NAMESPACE"))
    engine: EngineKind | None = Field(None, validation_alias=AliasChoices("SLUICE_ENGINE"))
    pool: Pool | None = Field(None, validation_alias=AliasChoices("SLUICE_POOL"))
    router_mode: RouterMode | None = Field(None, validation_alias=AliasChoices("SLUICE_ROUTER_MODE"))
    port: int | None = Field(None, validation_alias=AliasChoices("SLUICE_PORT"))

    def model_post_init(self, __context: object) -> None:
        if self.redis_url:
            self.redis.url = self.redis_url
        if self.index_redis_url:
            self.redis.index_url = self.index_redis_url
        if self.namespace:
            self.redis.namespace = self.namespace
        if self.engine:
            self.worker.engine = self.engine
        if self.pool:
            self.worker.pool = self.pool
        if self.router_mode:
            self.router.mode = self.router_mode
        if self.port:
            self.frontend.port = self.port

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    def resolved_model_path(self) -> Path:
        """Where the served model (or, for the mocker, its tokenizer) lives on disk."""
        return self.model_path or (self.models_dir / self.model)

    def worker_id(self) -> str:
        return self.worker.worker_id or f"{socket.gethostname()}-{os.getpid()}"


@functools.cache
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()
