"""What a tier's block is worth to the router: the share of its prefill time an onboard saves. Pure.

``credit = 1 - onboard_s_per_block / prefill_s_per_block``, clamped to [0, 1]: a tier that reads a block in
a tenth of the time computing it takes is credited 0.9 of a device block; one slower than recomputing is
credited nothing. Workers publish the credits with their load (``WorkerLoad.tier_credit``) and the routing
script weighs each tier's share of a prompt's overlap by them (docs/routing.md, "KV tiers").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from core.settings import KvbmSettings
from core.timing import TimingModel

if TYPE_CHECKING:
    from workers.kvbm.tiers import TierReport

#: Blocks an onboard is taken to read at once when a tier's fixed latency is spread over blocks.
TYPICAL_RUN_BLOCKS = 16


def configured_onboard_s(settings: KvbmSettings, tier: str, block_bytes: int) -> float:
    """Seconds per block a tier's configured bandwidth and latency give (the mocker's simulated time, and
    every engine's prior until it has measured onboards)."""
    return settings.read_s(tier, TYPICAL_RUN_BLOCKS, block_bytes) / TYPICAL_RUN_BLOCKS


def tier_credits(onboard_s_per_block: Mapping[str, float], prefill_s_per_block: float) -> dict[str, float]:
    if prefill_s_per_block <= 0:
        return {tier: 0.0 for tier in onboard_s_per_block}
    return {tier: min(1.0, max(0.0, 1.0 - s / prefill_s_per_block)) for tier, s in onboard_s_per_block.items()}


def format_credits(credits: Mapping[str, float]) -> str:
    """``host=0.70,disk=0.12``: the form ``WorkerLoad.tier_credit`` carries."""
    return ",".join(f"{tier}={credit:.3f}" for tier, credit in credits.items())


def measured_credit(report: TierReport, timing: TimingModel | None, block_size: int, *,
                    batch_tokens: int = 2048) -> str:
    """The credits of an engine's tiers from what they measured (onboard seconds per block read; the
    configured prior for a tier not read yet) against the prefill time per block of the worker's fitted
    step-time model at ``batch_tokens`` (its average, so a step's fixed cost is spread); "" until the
    worker has a model."""
    if timing is None:
        return ""
    prefill_s_per_block = timing.prefill_ms(batch_tokens) / batch_tokens * block_size / 1000.0
    onboard: dict[str, float] = {}
    for tier in report.names:
        blocks = report.stats.hits[tier]
        seconds = report.stats.onboard_seconds.get(tier)
        onboard[tier] = seconds[1] / blocks if seconds and blocks else report.prior_onboard_s[tier]
    return format_credits(tier_credits(onboard, prefill_s_per_block))


def tier_blocks(report: TierReport) -> str:
    """``host=120,disk=3000``: what ``WorkerLoad.tier_blocks`` carries (the worker's own tiers)."""
    return ",".join(f"{tier}={blocks}" for tier, (blocks, _bytes) in report.held.items())
