"""vLLM with Sluice's KV tiers (workers/engines/vllm/kvbm_connector.py) against the real default model.

vLLM starts in about a minute on CPU and a 2,000-token prefill takes seconds, so the module runs one
scenario once (:func:`scenario`) on two engines in turn, and each test asserts one part of it:

* engine A (host and disk tiers, beside NIXL through vLLM's MultiConnector, as a prefill or decode
  worker's engine runs them) serves prompts cold, then ``P`` again after its prefix cache is cleared:
  offload (a) and onboard from the host tier (b);
* engine B (the same disk directory, no host tier, a shared tier whose Redis is not running) then serves
  ``E`` from disk (e), ``C`` whose block 5 was corrupted on disk in between (c), and ``D`` whose blocks
  were removed from disk, with the shared tier down (d).

Engine B runs the tiers' connector alone, so both ways of composing it are served. Greedy outputs are
compared with engine A's cold runs. The time to the first token of the 2,000-token
prompts (cold, from host, from disk) is printed: run with ``-s`` to see it.

Run in the vLLM environment: ``.venv-vllm/bin/python -m pytest -m vllm -p no:cacheprovider
tests/workers/test_vllm_kvbm.py -s``.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (it lives in .venv-vllm)")

from core.messages import BlockStored, SamplingParams, Usage  # noqa: E402
from core.settings import KvbmSettings  # noqa: E402
from core.shm import ShmEntries  # noqa: E402
from router.hashing import block_hashes, root_hash  # noqa: E402
from tests.engines.conftest import shut_down  # noqa: E402
from tests.support.kv_events import KvEventLog  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.workers.vllm_support import MODEL, TEST_SETTINGS, smollm2_weights_dir  # noqa: E402
from workers.engines.base import EngineRequest  # noqa: E402
from workers.engines.vllm.engine import VllmEngine  # noqa: E402
from workers.engines.vllm.kv_transfer import KvTransferSetup  # noqa: E402
from workers.kvbm.stats import TierStats  # noqa: E402

pytestmark = pytest.mark.vllm

BLOCK = 32
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
_MiB = 1 << 20


@dataclass
class Run:
    tokens: list[int]
    usage: Usage | None
    ttft_s: float


@dataclass
class Scenario:
    prompts: dict[str, list[int]]
    cold: dict[str, Run] = field(default_factory=dict)
    again: dict[str, Run] = field(default_factory=dict)
    host_after_cold: list[int] = field(default_factory=list)
    tier_events: list[BlockStored] = field(default_factory=list)
    stats_a: TierStats = field(default_factory=TierStats)
    stats_b: TierStats = field(default_factory=TierStats)
    served_a_s: float = 0.0  # engine A's time serving the prompts, from the first to the stats' read
    connector_a: str = ""  # the KV connector vLLM ran engine A with


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 30000) for _ in range(n)]


def full_blocks(tokens: list[int]) -> list[int]:
    return block_hashes(tokens, BLOCK, root_hash(MODEL))


async def run(engine: VllmEngine, tokens: list[int]) -> Run:
    request = EngineRequest(f"kvbm-{uuid.uuid4().hex[:12]}", tokens, GREEDY)
    start = time.monotonic()
    ttft = None
    out: list[int] = []
    usage = None
    async for step in engine.generate(request):
        if ttft is None and step.token_ids:
            ttft = time.monotonic() - start
        out.extend(step.token_ids)
        usage = step.usage or usage
    assert ttft is not None
    return Run(out, usage, ttft)


def block_file(disk_dir: Path, block_hash: int) -> Path:
    (path,) = disk_dir.glob(f"*/{block_hash:016x}*")
    return path


@pytest.fixture(scope="module")
async def scenario(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Scenario]:
    disk = tmp_path_factory.mktemp("kvbm-disk")
    s = Scenario({"P": prompt(1, 2000), "E": prompt(2, 2000), "C": prompt(3, 400), "D": prompt(4, 400)})
    weights = smollm2_weights_dir()

    tiers_a = KvbmSettings(host_bytes=512 * _MiB, disk_dir=disk, disk_bytes=1024 * _MiB)
    log_a = KvEventLog()
    # NIXL beside the tiers: one engine start serves both compositions' checks (a start is most of a minute).
    nixl = KvTransferSetup("127.0.0.1", free_port(), 30.0)
    a = VllmEngine(MODEL, weights, TEST_SETTINGS, kvbm=tiers_a, transfer=nixl)
    await a.start(log_a)
    held = ShmEntries.held_by_descendants()
    try:
        assert a._llm is not None
        transfer_config = a._llm.vllm_config.kv_transfer_config
        s.connector_a = transfer_config.kv_connector if transfer_config is not None else ""
        start = time.monotonic()
        for name in ("P", "E", "C", "D"):
            s.cold[name] = await run(a, s.prompts[name])
        assert a.flush_tiers()
        s.host_after_cold = a.tier_block_hashes().get("host", [])
        await a.clear_kv_cache()
        s.again["P"] = await run(a, s.prompts["P"])
        s.stats_a = a.tier_stats()
        s.served_a_s = time.monotonic() - start
        s.tier_events = [e for e in log_a.events if isinstance(e, BlockStored) and e.tier != "device"]
        assert a.flush_tiers()
    finally:
        await shut_down(a, held)

    block_file(disk, full_blocks(s.prompts["C"])[5]).write_bytes(b"\0" * 64)  # shorter and wrong: corrupt
    for h in full_blocks(s.prompts["D"]):
        block_file(disk, h).unlink()
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    tiers_b = KvbmSettings(disk_dir=disk, disk_bytes=1024 * _MiB, redis_url=dead_redis, timeout_ms=500)
    b = VllmEngine(MODEL, weights, TEST_SETTINGS, kvbm=tiers_b)
    await b.start(KvEventLog())
    held = ShmEntries.held_by_descendants()
    try:
        for name in ("E", "C", "D"):
            s.again[name] = await run(b, s.prompts[name])
        s.stats_b = b.tier_stats()
    finally:
        await shut_down(b, held)
    print("\nTTFT of a 2,000-token prompt (SmolLM2, fp32, CPU): "
          f"cold {s.cold['P'].ttft_s:.2f} s / {s.cold['E'].ttft_s:.2f} s, "
          f"onboarded from host {s.again['P'].ttft_s:.2f} s, from disk {s.again['E'].ttft_s:.2f} s")
    print(f"tier stats A: {s.stats_a}\ntier stats B: {s.stats_b}")
    yield s


async def test_offload_puts_a_prompts_blocks_in_the_host_tier(scenario: Scenario) -> None:
    blocks = full_blocks(scenario.prompts["P"])
    assert set(blocks) <= set(scenario.host_after_cold)
    announced = {h for e in scenario.tier_events if e.tier == "host" for h in e.block_hashes}
    assert set(blocks) <= announced  # the router heard of them, as Sluice hashes


async def test_the_tiers_count_what_they_cost_the_engine(scenario: Scenario) -> None:
    stats = scenario.stats_a
    assert stats.offloaded_bytes["host"] > 0
    # Their time inside the steps (copies, onboard reads, planning) and the offload thread's CPU, both
    # well under the time it took to serve the prompts.
    assert 0 < stats.step_seconds < scenario.served_a_s / 2
    assert 0 < stats.offload_cpu_seconds < scenario.served_a_s / 2


async def test_onboard_from_host_gives_the_same_output(scenario: Scenario) -> None:
    cold, again = scenario.cold["P"], scenario.again["P"]
    assert again.tokens == cold.tokens
    assert again.usage is not None and again.usage.cached_tokens >= (len(scenario.prompts["P"]) - 1) // BLOCK * BLOCK
    assert scenario.stats_a.hits.get("host", 0) >= len(scenario.prompts["P"]) // BLOCK - 1


async def test_corrupt_block_is_recomputed(scenario: Scenario) -> None:
    assert scenario.again["C"].tokens == scenario.cold["C"].tokens
    assert scenario.stats_b.recomputes.get("corrupt", 0) >= 1


async def test_shared_tier_down_is_a_recompute(scenario: Scenario) -> None:
    assert scenario.again["D"].tokens == scenario.cold["D"].tokens
    assert scenario.again["D"].usage is not None and scenario.again["D"].usage.cached_tokens == 0


async def test_new_engine_serves_a_prompt_from_disk(scenario: Scenario) -> None:
    assert scenario.again["E"].tokens == scenario.cold["E"].tokens
    assert scenario.again["E"].usage is not None and scenario.again["E"].usage.cached_tokens > 0
    assert scenario.stats_b.hits.get("disk", 0) >= len(scenario.prompts["E"]) // BLOCK - 1


async def test_tiers_serve_beside_nixl(scenario: Scenario) -> None:
    """Engine A ran NIXL and the tiers through MultiConnector, as a prefill or decode worker's engine does:
    an aggregated request still offloads (above) and onboards after the prefix cache is cleared."""
    assert scenario.connector_a == "MultiConnector"
    again, full = scenario.again["P"], len(scenario.prompts["P"]) // BLOCK
    assert again.tokens == scenario.cold["P"].tokens
    # Every full block of the prompt, onboarded from the host tier (its device cache was cleared).
    assert again.usage is not None and again.usage.cached_tokens == full * BLOCK
    assert scenario.stats_a.hits["host"] == full


def test_default_has_no_connector() -> None:
    from workers.engines.vllm.engine import engine_args

    args = engine_args(Path("/nonexistent"), TEST_SETTINGS, "tcp://127.0.0.1:1")
    assert args.kv_transfer_config is None
    assert VllmEngine(MODEL, Path("/nonexistent"), TEST_SETTINGS, kvbm=KvbmSettings()).kvbm is None


def test_tiers_and_nixl_compose_through_multiconnector() -> None:
    from workers.engines.vllm.kv_transfer import KvbmSetup, KvTransferSetup, connector_config

    kvbm = KvbmSetup.new(KvbmSettings(host_bytes=_MiB), MODEL)
    config = connector_config(KvTransferSetup("127.0.0.1", 5600, 30.0), kvbm, on_cpu=True)
    assert config is not None and config.kv_connector == "MultiConnector"
    assert config.kv_load_failure_policy == "recompute"
    names = [c["kv_connector"] for c in config.kv_connector_extra_config["connectors"]]
    assert names == ["NixlConnector", "SluiceKvbmConnector"]
    alone = connector_config(None, kvbm, on_cpu=True)
    assert alone is not None and alone.kv_connector == "SluiceKvbmConnector"

