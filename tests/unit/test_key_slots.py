"""Hash tags (core.keys): on a Redis Cluster every key one script touches lies in one hash slot, the
registry's keys in the namespace's, one model's routing state in the model's; without hash tags the
names are what they always were."""

from __future__ import annotations

from redis.crc import key_slot

from core.keys import Keys
from router.inflight import InflightStore
from router.prefix_index import PrefixIndex

KEYS = Keys("ns", hash_tags=True)


def _slots(*names: str) -> set[int]:
    return {key_slot(name.encode()) for name in names}


def test_a_models_index_and_inflight_keys_share_one_slot() -> None:
    index = PrefixIndex.__new__(PrefixIndex)
    index.keys = KEYS
    inflight = InflightStore.__new__(InflightStore)
    inflight.keys = KEYS
    worker_keys = index._worker_keys("w1", "llama")  # what APPLY, RESYNC and PURGE take
    names = [*worker_keys, KEYS.kv_events_of("llama"), KEYS.kv_block("llama", 0xABC), KEYS.kv_block("llama", 7),
             *inflight._keys("llama"), KEYS.kv_worker_approx("w2", "llama"), KEYS.kv_worker_meta("w2", "llama"),
             KEYS.router_table("llama", "0a1b2c3d4e5f-7")]
    assert len(_slots(*names)) == 1
    assert all(name.startswith("sluice:ns:{llama}:") for name in names)


def test_the_registry_keys_share_the_namespaces_slot() -> None:
    names = [KEYS.workers, KEYS.worker("w1"), KEYS.load("w1"), KEYS.slots, KEYS.worker_queues, KEYS.worker("w2")]
    assert _slots(*names) == _slots("{ns}")
    assert all(name.startswith("sluice:ns:{ns}:") for name in names)


def test_models_spread_over_slots() -> None:
    assert len({key_slot(KEYS.kv_block_prefix(f"model-{i}").encode()) for i in range(20)}) == 20


def test_without_hash_tags_the_names_are_unchanged() -> None:
    k = Keys("ns")
    assert (k.workers, k.kv_block("m", 1), k.kv_worker("w", "m"), k.kv_slot_owners_of("m"), k.router_inflight("m"),
            k.kv_events_of("m")) == ("sluice:ns:workers", "sluice:ns:m:kv:0000000000000001", "sluice:ns:kvw:w",
                                     "sluice:ns:kv-slots", "sluice:ns:m:inflight", "sluice:ns:kv-events")


def test_namespace_wide_index_keys_are_refused_with_hash_tags() -> None:
    import pytest
    for name in ("kv_slot_owners", "kv_slot_tags", "kv_events"):
        with pytest.raises(ValueError):
            getattr(KEYS, name)
    with pytest.raises(ValueError):
        KEYS.kv_worker("w1")
