"""The decode side's view of a vLLM transfer handle (workers/engines/vllm/kv_transfer.py)."""

from __future__ import annotations

from workers.engines.vllm.kv_transfer import export_params, import_params

HANDLE = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[4, 5, 6]],
          "remote_engine_id": "e", "remote_request_id": "r-1", "remote_host": "127.0.0.1", "remote_port": 5601,
          "remote_prefill_cached_tokens": 32}


def test_a_prefill_asks_vllm_to_keep_its_blocks_for_a_decode_worker() -> None:
    assert export_params() == {"do_remote_decode": True}


def test_the_handle_covers_the_block_the_first_token_opens() -> None:
    # 96 prompt tokens fill 3 blocks of 32; with the first token the decode holds 97: 4 blocks.
    params = import_params(HANDLE, num_tokens=97, block_size=32)
    assert params["remote_block_ids"] == [[4, 5, 6, 6]]
    assert HANDLE["remote_block_ids"] == [[4, 5, 6]]  # the handle itself is left alone


def test_a_partial_last_block_needs_no_padding() -> None:
    assert import_params(HANDLE, num_tokens=90, block_size=32)["remote_block_ids"] == [[4, 5, 6]]


def test_the_decode_reports_its_own_cache_hits_not_the_prefill_workers() -> None:
    params = import_params(HANDLE, num_tokens=90, block_size=32)
    assert "remote_prefill_cached_tokens" not in params
    assert {k: v for k, v in params.items() if k != "remote_block_ids"} == {
        k: v for k, v in HANDLE.items() if k not in ("remote_block_ids", "remote_prefill_cached_tokens")}
