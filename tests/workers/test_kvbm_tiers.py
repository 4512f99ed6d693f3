"""The KV tiers (workers/kvbm): frames, the host tier's admission, the disk tier across restarts, the
shared tier against a real Redis server, and the composed store's offload, onboard and recomputes."""

from __future__ import annotations

import time
from pathlib import Path

from bench.devstack import RedisServer, free_port
from core.settings import KvbmSettings
from workers.kvbm.disk import DiskTier
from workers.kvbm.frame import frame_size, seal, unseal
from workers.kvbm.host import HostTier
from workers.kvbm.tiers import KvTiers

BLOCK = 64
FRAME = frame_size(BLOCK)


def payload(h: int) -> bytes:
    return h.to_bytes(8, "little") * (BLOCK // 8)


def chain_blocks(hashes: list[int]) -> list[tuple[int, bytes, int | None]]:
    """One chain's blocks as the tiers take them: each with its parent, the first a root."""
    return [(h, payload(h), up) for h, up in zip(hashes, [None, *hashes[:-1]], strict=True)]


def test_a_frame_reads_back_only_as_the_block_it_was_sealed_for() -> None:
    frame = seal(7, b"kv bytes")
    assert unseal(7, frame) == b"kv bytes"
    assert unseal(8, frame) is None
    flipped = bytearray(frame)
    flipped[-1] ^= 1
    assert unseal(7, bytes(flipped)) is None
    assert unseal(7, frame[:10]) is None
    assert unseal(-5, seal(-5, b"x")) == b"x"  # signed hashes are stored as their unsigned bits


def test_the_host_tier_keeps_its_budget_and_evicts_the_least_recently_used() -> None:
    host = HostTier(3 * FRAME, FRAME)
    for h in (1, 2, 3):  # three chains of one block each
        assert host.put(h, seal(h, payload(h))) == (True, [])
    host.get(1)
    taken, evicted = host.put(4, seal(4, payload(4)))
    assert taken and evicted == [2]
    assert sorted(host.hashes()) == [1, 3, 4]
    assert host.used_bytes == 3 * FRAME <= host.budget_bytes


def test_the_host_tier_stays_prefix_closed_evicting_chains_from_their_tails() -> None:
    host = HostTier(4 * FRAME, FRAME)
    for h, up in ((1, None), (2, 1), (3, 2), (4, 3)):  # one chain of four
        assert host.put(h, seal(h, payload(h)), up)[0]
    host.get(1)  # its head is the most recently used, but a head cannot go before its tail
    assert host.put(5, seal(5, payload(5)), None) == (True, [4])
    assert host.put(6, seal(6, payload(6)), 99) == (False, [])  # its parent is not held: never taken
    assert host.discard(2) == [3, 2]  # a dropped block takes its descendants along, deepest first
    assert sorted(host.hashes()) == [1, 5]


def test_one_off_blocks_do_not_flush_a_hot_prefix_from_a_full_host_tier() -> None:
    host = HostTier(4 * FRAME, FRAME)
    hot = [1, 2, 3, 4]
    for _ in range(3):
        for h, up in zip(hot, [None, *hot[:-1]], strict=True):
            host.put(h, seal(h, payload(h)), up)
            host.get(h)
    for h in range(100, 140):  # a long one-off prompt
        taken, _ = host.put(h, seal(h, payload(h)), h - 1 if h > 100 else None)
        assert not taken
    assert sorted(host.hashes()) == hot


def test_the_disk_tier_survives_a_restart_and_drops_a_damaged_or_unfinished_file(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path, "m-64", 10 * FRAME, FRAME)
    for h in range(5):  # one chain: 0 <- 1 <- 2 <- 3 <- 4
        assert disk.put(h, seal(h, payload(h)), h - 1 if h else None)[0]
    (disk.dir / "0000000000000009-root.kv.123.tmp").write_bytes(b"half")
    (disk.dir / f"{7:016x}-{8:016x}.kv").write_bytes(seal(7, payload(7)))  # its parent's file is gone
    again = DiskTier(tmp_path, "m-64", 10 * FRAME, FRAME)
    assert sorted(again.hashes()) == list(range(5)) and again.parent_of(3) == 2
    assert not list(again.dir.glob("*.tmp")) and not list(again.dir.glob(f"{7:016x}-*"))
    assert unseal(3, again.get(3)) == payload(3)
    other_scope = DiskTier(tmp_path, "other-64", 10 * FRAME, FRAME)
    assert len(other_scope) == 0
    smaller = DiskTier(tmp_path, "m-64", 2 * FRAME, FRAME)  # a smaller budget after a restart: tails go
    assert sorted(smaller.hashes()) == [0, 1] and len(list(smaller.dir.glob("*.kv"))) == 2


def _settings(**kw: object) -> KvbmSettings:
    return KvbmSettings.model_validate({"timeout_ms": 500, "down_backoff_s": 30, **kw})


def test_offloaded_blocks_onboard_from_host_verified_and_are_announced(tmp_path: Path) -> None:
    tiers = KvTiers(_settings(host_bytes=8 * FRAME), scope="m", block_bytes=BLOCK)
    try:
        tiers.offload(chain_blocks([10, 11, 12]))
        assert tiers.flush()
        events = tiers.take_events()
        assert [(e.tier, e.stored, e.block_hashes) for e in events] == [("host", True, [10, 11, 12])]
        assert tiers.lookup([10, 11, 12, 13]) == 3
        read = tiers.onboard([10, 11, 12, 13])
        assert read.payloads == [payload(10), payload(11), payload(12)]
        assert read.tiers == ["host"] * 3 and read.stopped == "miss"
        assert tiers.stats.hits["host"] == 3 and tiers.stats.onboarded_bytes["host"] == 3 * BLOCK
    finally:
        tiers.close()


def test_the_host_budget_is_respected_and_evictions_are_announced() -> None:
    tiers = KvTiers(_settings(host_bytes=4 * FRAME), scope="m", block_bytes=BLOCK)
    try:
        tiers.offload(chain_blocks(list(range(10))))
        assert tiers.flush()
        held = tiers.held()["host"]
        assert held == (4, 4 * FRAME)
        stored: set[int] = set()
        for e in tiers.take_events():
            stored = stored | set(e.block_hashes) if e.stored else stored - set(e.block_hashes)
        assert stored == set(tiers.host.hashes()) if tiers.host else False
    finally:
        tiers.close()


def test_a_corrupt_disk_block_ends_the_run_and_is_recomputed(tmp_path: Path) -> None:
    tiers = KvTiers(_settings(disk_dir=str(tmp_path), disk_bytes=16 * FRAME), scope="m", block_bytes=BLOCK)
    try:
        tiers.offload(chain_blocks([1, 2, 3, 4]))
        assert tiers.flush()
        assert tiers.disk is not None
        (path,) = tiers.disk.dir.glob(f"{3:016x}-*.kv")
        damaged = bytearray(path.read_bytes())
        damaged[-1] ^= 0xFF
        path.write_bytes(bytes(damaged))
        tiers.take_events()
        read = tiers.onboard([1, 2, 3, 4])
        assert len(read) == 2 and read.stopped == "corrupt"
        assert tiers.stats.recomputes["corrupt"] == 1
        assert 3 not in tiers.disk and 4 not in tiers.disk  # with the block after it, which hung from it
        assert [(e.tier, e.stored, e.block_hashes) for e in tiers.take_events()] == [("disk", False, [4, 3])]
    finally:
        tiers.close()


def test_a_restarted_worker_comes_back_warm_from_its_disk_tier(tmp_path: Path) -> None:
    settings = _settings(disk_dir=str(tmp_path), disk_bytes=16 * FRAME)
    first = KvTiers(settings, scope="m", block_bytes=BLOCK)
    first.offload(chain_blocks([1, 2, 3]))
    assert first.flush()
    first.close()
    second = KvTiers(settings, scope="m", block_bytes=BLOCK)
    try:
        assert second.snapshot() == {"disk": [1, 2, 3]}
        assert [(e.tier, e.stored, sorted(e.block_hashes)) for e in second.take_events()] == [("disk", True, [1, 2, 3])]
        assert second.onboard([1, 2, 3]).payloads == [payload(1), payload(2), payload(3)]
    finally:
        second.close()


def test_any_worker_onboards_from_the_shared_tier(redis_server: RedisServer, namespace: str) -> None:
    settings = _settings(redis_url=redis_server.url)
    writer = KvTiers(settings, scope=namespace, block_bytes=BLOCK)
    reader = KvTiers(_settings(redis_url=redis_server.url, host_bytes=8 * FRAME), scope=namespace, block_bytes=BLOCK)
    try:
        writer.offload(chain_blocks([5, 6, 7]))
        assert writer.flush()
        assert [(e.tier, e.block_hashes) for e in writer.take_events()] == [("shared", [5, 6, 7])]
        assert reader.lookup([5, 6, 7, 8]) == 3
        read = reader.onboard([5, 6, 7, 8])
        assert read.payloads == [payload(5), payload(6), payload(7)] and read.tiers == ["shared"] * 3
        assert reader.flush()  # onboarded blocks are promoted to the reader's host tier
        assert reader.onboard([5, 6, 7]).tiers == ["host"] * 3
    finally:
        writer.close()
        reader.close()


def test_a_down_shared_tier_costs_a_recompute_quickly_not_an_error() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    tiers = KvTiers(_settings(redis_url=dead, timeout_ms=100), scope="m", block_bytes=BLOCK)
    try:
        tiers.offload(chain_blocks([1]))
        assert tiers.flush()
        start = time.monotonic()
        read = tiers.onboard([1, 2])
        assert len(read) == 0 and read.stopped == "down"
        assert tiers.lookup([1]) == 0
        assert time.monotonic() - start < 2.0
        assert tiers.stats.recomputes["down"] == 2
    finally:
        tiers.close()


def test_no_tier_on_means_no_store() -> None:
    assert KvTiers.open(KvbmSettings(), scope="m", block_bytes=BLOCK) is None


def test_a_full_offload_queue_drops_blocks_and_never_waits() -> None:
    tiers = KvTiers(_settings(host_bytes=64 * FRAME, offload_queue_blocks=1), scope="m", block_bytes=BLOCK)
    try:
        start = time.monotonic()
        tiers.offload([(h, payload(h), None) for h in range(200)])
        assert time.monotonic() - start < 0.5
        assert tiers.flush()
        taken = tiers.stats.offloaded_bytes["host"] // FRAME
        assert tiers.stats.offloads_dropped + taken == 200  # every block either written or counted as dropped
    finally:
        tiers.close()


def test_the_worker_exports_each_tiers_metrics(tmp_path: Path) -> None:
    from prometheus_client import generate_latest

    from workers.metrics import WorkerMetrics

    tiers = KvTiers(_settings(host_bytes=8 * FRAME, disk_dir=str(tmp_path), disk_bytes=8 * FRAME), scope="m",
                    block_bytes=BLOCK)
    metrics = WorkerMetrics()
    current: list[KvTiers | None] = [None]
    metrics.watch_tiers(lambda: current[0].report() if current[0] is not None else None)
    assert b"kv_tier" not in generate_latest(metrics.registry)  # an engine without tiers exports none
    current[0] = tiers
    try:
        tiers.offload(chain_blocks([1, 2]))
        assert tiers.flush()
        tiers.onboard([1, 2, 3])
        text = generate_latest(metrics.registry).decode()
        assert 'sluice_worker_kv_tier_blocks{tier="host"} 2.0' in text
        assert 'sluice_worker_kv_tier_blocks{tier="disk"} 2.0' in text
        assert f'sluice_worker_kv_tier_bytes{{tier="disk"}} {2.0 * FRAME}' in text
        assert 'sluice_worker_kv_tier_hits_total{tier="host"} 2.0' in text
        assert 'sluice_worker_kv_tier_onboard_seconds_count{tier="host"} 1.0' in text
        assert 'sluice_worker_kv_tier_recomputes_total{reason="corrupt"} 0.0' in text
    finally:
        tiers.close()


def test_a_tier_is_credited_what_an_onboard_saves_against_a_recompute() -> None:
    from workers.kvbm.credit import format_credits, tier_credits

    credits = tier_credits({"host": 0.1, "disk": 0.5, "shared": 2.0}, prefill_s_per_block=1.0)
    assert credits == {"host": 0.9, "disk": 0.5, "shared": 0.0}  # slower than recomputing: nothing
    assert format_credits(credits) == "host=0.900,disk=0.500,shared=0.000"
    assert tier_credits({"host": 0.1}, prefill_s_per_block=0.0) == {"host": 0.0}


def test_measured_onboards_replace_the_configured_prior(tmp_path: Path) -> None:
    from core.timing import TimingModel
    from workers.kvbm.credit import measured_credit

    tiers = KvTiers(_settings(host_bytes=8 * FRAME, host_gb_per_s=1e-6), scope="m", block_bytes=BLOCK)
    try:
        timing = TimingModel((0.0, 1.0, 0.0), (0.0, 0.0, 0.0))  # 1 ms a token: 16 ms a 16-token block
        assert measured_credit(tiers.report(), None, 16) == ""  # no step-time model yet
        assert measured_credit(tiers.report(), timing, 16) == "host=0.000"  # the prior: 64 s a block
        tiers.offload(chain_blocks([1, 2]))
        assert tiers.flush()
        tiers.onboard([1, 2])  # measured: microseconds a block
        credit = float(measured_credit(tiers.report(), timing, 16).split("=")[1])
        assert 0.9 < credit <= 1.0
    finally:
        tiers.close()

