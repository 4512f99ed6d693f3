"""The deciding script's arguments and table columns are declared once (router.decide_layout): the Lua
file's generated block matches the declaration, no position is written by hand, and a call packed by
router.inflight carries each value at its name's position and each column at its offset."""

from __future__ import annotations

import struct
from typing import Any

import hiredis
import numpy as np

from core.keys import Keys
from core.wire import TaskParts
from router.decide_layout import ARG, ARGS, FIRST_CHAIN_ARG, LUA_FILE, check, column_offsets, lua_block
from router.inflight import InflightStore
from router.time_cost import TimeWeights


def test_the_lua_file_matches_the_declaration() -> None:
    assert check(LUA_FILE.read_text()) == []


def test_drift_is_caught() -> None:
    text = LUA_FILE.read_text()
    assert check(text.replace("local ARG_MODEL = 11", "local ARG_MODEL = 12")) == ["the generated block is stale"]
    assert "positions written by hand: ARGV[3]" in check(text.replace("ARGV[ARG_U]", "ARGV[3]"))
    assert check(text.replace("SCALE, CHAIN", "CHAIN, SCALE")) == ["the columns are not unpacked in their declared order"]
    assert check("-- nothing generated here") == ["no generated block"]
    assert lua_block() in text


class Recording:
    """A channel that keeps the command it is given and answers as the script would (candidate 1)."""

    client: Any = None

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def call(self, packed: bytes, replies: int) -> list[Any]:
        self.sent.append(packed)
        return [[1, b"2.5", 3, b""]]


def _arguments(packed: bytes) -> list[bytes]:
    reader = hiredis.Reader()
    reader.feed(packed)
    command = reader.gets()
    assert command[0] == b"EVALSHA"
    n_keys = int(command[2])
    return command[3 + n_keys:]


async def test_a_packed_call_puts_every_value_at_its_names_position() -> None:
    keys = Keys("layout")
    channel = Recording()
    store = InflightStore(None, keys, 30.0, channel=channel)  # type: ignore[arg-type]
    roster = store.roster("m", ["w0", "w1"], ["q.w0", "q.w1"], np.array([0, 5]), np.array([1.0, 2.0]),
                          np.array([0, 1]), np.array([0, 0]), np.array([11, 22], dtype=np.uint32))
    candidates = store.candidates("m", roster, np.array([7, 9]), np.zeros((2, 11)), "t1",
                                  tier_credit=np.array([[0.5, 0.25, 0.0], [0.0, 0.0, 0.75]]))
    decision = await store.decide("m", "r1", candidates, [[1, 2], [3]], [2, 1], weight=1.5, temperature=0.25,
                                  u=0.125, pinned=1, approx_ttl_s=2.0, task=TaskParts(b"H", b"T"),
                                  settle=[("old", "all")], time_weights=TimeWeights(0.5, 0.75))
    assert (decision.index, decision.cost, decision.overlap) == (0, 2.5, 3)
    args = _arguments(channel.sent[0])
    value = {name: args[ARG[name] - 1] for name in ARGS}
    assert value | {"sent": b""} == {
        "rid": b"r1", "prediction_ttl_ms": b"30000", "u": b"0.125", "temperature": b"0.25", "pinned": b"2",
        "weight": b"1.5", "table_ttl_ms": value["table_ttl_ms"], "sent": b"", "n": b"2", "nslots": b"6",
        "model": b"m", "prefix": keys.kv_block_prefix("m").encode(), "approx_ttl_ms": b"2000",
        "task_head": b"H", "task_tail": b"T", "broker_prefix": keys.broker_prefix.encode(), "cost_kind": b"time",
        "slowdown_weight": b"0.5", "eviction_weight": b"0.75", "dry": b"0", "tiers": b"1", "nchains": b"2"}
    assert args[FIRST_CHAIN_ARG - 1:] == [b"2", f"{1:016x}{2:016x}".encode(), b"1", f"{3:016x}".encode(),
                                          b"old", b"all"]
    table = value["sent"]  # the first decision over a table sends it
    at = column_offsets(2, 6)
    assert struct.unpack_from("<2i", table, at["SLOTS"]) == (0, 5)
    assert struct.unpack_from("<2i", table, at["ACTIVE"]) == (7, 9)
    assert struct.unpack_from("<6H", table, at["LOOKUP"]) == (1, 0, 0, 0, 0, 2)
    assert struct.unpack_from("<2d", table, at["SCALE"]) == (1.0, 2.0)
    assert struct.unpack_from("<2B", table, at["CHAIN"]) == (1, 2)
    assert struct.unpack_from("<2I", table, at["TAGS"]) == (11, 22)
    assert struct.unpack_from("<6f", table, at["TIER"]) == (0.5, 0.25, 0.0, 0.0, 0.0, 0.75)
    assert table[at["NAMES"]:] == b"w0q.w0w1q.w1"
