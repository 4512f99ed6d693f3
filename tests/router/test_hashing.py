"""Block hashing: pinned values (a change here invalidates every index and engine cache mapping)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash

from router.hashing import block_hashes, root_hash, token_bytes


def test_root_hash_pinned() -> None:
    assert root_hash("smollm2") == 17732890918659490882
    assert root_hash("smollm2", "ad1") == 4702107584671781456
    assert root_hash("smollm2", None, "img") == 3342593286740293915


def test_root_hash_is_the_documented_formula() -> None:
    assert root_hash("smollm2") == xxhash.xxh3_64_intdigest(b"sluice-kv-v1|smollm2||", 0)
    assert root_hash("smollm2", "ad1", "img") == xxhash.xxh3_64_intdigest(b"sluice-kv-v1|smollm2|ad1|img", 0)


def test_root_hash_separates_model_lora_and_extra() -> None:
    assert len({root_hash("a"), root_hash("b"), root_hash("a", "x"), root_hash("a", None, "x")}) == 4
    assert root_hash("a", None) == root_hash("a", "") == root_hash("a", None, "")


def test_block_hashes_pinned() -> None:
    assert block_hashes(list(range(10)), 4, root_hash("smollm2")) == [0xBAFA8680D4A31593, 0xB172BF059E036169]
    assert block_hashes(list(range(10)), 4, 0) == [0xA1D0BD893C9531AC, 0x244C2E40BDC3593D]


def test_block_hashes_chain_formula() -> None:
    tokens = [7, 70000, 3, 2**32 - 1, 5, 6, 7, 8]
    root = root_hash("m")
    h0 = xxhash.xxh3_64_intdigest(struct.pack("<4I", *tokens[:4]), root)
    h1 = xxhash.xxh3_64_intdigest(struct.pack("<4I", *tokens[4:]), h0)
    assert block_hashes(tokens, 4, root) == [h0, h1]


def test_partial_last_block_is_not_hashed() -> None:
    root = root_hash("m")
    assert block_hashes(list(range(11)), 4, root) == block_hashes(list(range(8)), 4, root)
    assert block_hashes([1, 2, 3], 4, root) == []


def test_hash_names_the_whole_prefix() -> None:
    root = root_hash("m")
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, root)
    b = block_hashes([1, 2, 3, 4, 5, 6, 7, 9], 4, root)
    c = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4, root)
    assert a[0] == b[0] and a[1] != b[1]
    assert c[0] != a[0] and c[1] != a[1]


def test_continuing_a_chain_matches_hashing_it_whole() -> None:
    root = root_hash("m")
    tokens = np.arange(40, dtype=np.uint32)
    whole = block_hashes(tokens, 4, root)
    assert block_hashes(tokens, 4, root, start_block=6, parent=whole[5]) == whole[6:]
    assert block_hashes(tokens.tolist(), 4, root) == whole
    with pytest.raises(ValueError):
        block_hashes(tokens, 4, root, start_block=2)
    with pytest.raises(ValueError):
        block_hashes(tokens, 0, root)


def test_token_ids_as_list_array_or_bytes_hash_alike() -> None:
    root = root_hash("m")
    tokens = [7, 70000, 3, 2**32 - 1, 5, 6, 7, 8, 9]
    packed = token_bytes(tokens)
    assert packed == struct.pack("<9I", *tokens)
    assert token_bytes(np.array(tokens, dtype=np.int64)) == packed
    assert block_hashes(packed, 4, root) == block_hashes(tokens, 4, root) == block_hashes(np.array(tokens), 4, root)
    assert block_hashes(packed, 4, root, start_block=1, parent=block_hashes(tokens, 4, root)[0]) == \
        block_hashes(tokens, 4, root)[1:]
