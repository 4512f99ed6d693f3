"""Pools as a type: each one's capabilities, and names read back as the type."""

from __future__ import annotations

import time

import pytest

from core.pools import Pool
from core.settings import Settings
from router.registry import WorkerRecord


def test_every_pool_says_what_it_does() -> None:
    table = {p: (p.serves_clients, p.prefills_for_others, p.decodes_handoffs, p.transfers_kv) for p in Pool}
    assert table == {
        Pool.AGG: (True, False, False, False),
        Pool.PREFILL: (False, True, False, True),
        Pool.DECODE: (True, False, True, True),
    }


def test_a_pool_name_reads_as_the_type_and_an_unknown_one_is_refused() -> None:
    assert Pool("decode") is Pool.DECODE and Pool.DECODE == "decode"
    with pytest.raises(ValueError, match="not a valid Pool"):
        Pool("kv-cache")
    rec = WorkerRecord(worker_id="w", model="m", model_path="", pool="prefill", queue="q", pool_queue="p",  # type: ignore[arg-type]
                       engine="mocker", block_size=16, kv_blocks=8, max_num_seqs=1, context_length=128,
                       started_at=time.time())
    assert rec.pool is Pool.PREFILL and not rec.pool.serves_clients


def test_the_settings_take_a_pool_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_POOL", "decode")
    assert Settings().worker.pool is Pool.DECODE
    monkeypatch.setenv("SLUICE_POOL", "cache")
    with pytest.raises(ValueError, match="(?s)SLUICE_POOL.*'agg', 'prefill' or 'decode'"):
        Settings()
