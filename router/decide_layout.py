"""The deciding script's interface, declared once: its arguments in order and the columns of the
candidate table it reads.

router.inflight packs each call from it, and ``router/lua/decide.lua`` holds a block generated from it
(between its ``BEGIN GENERATED`` and ``END GENERATED`` lines): ``python -m router.decide_layout``
rewrites that block; tests/router/test_decide_layout.py fails when the file and this module disagree,
and when a packed call puts a value anywhere but at its name's position.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: DECIDE's fixed arguments, ARGV[1], ARGV[2], ...; after them, per chain, the prompt's length in
#: blocks and its hex chain, then the pending in-flight operations (pairs, as RELEASE takes them).
ARGS = (
    "rid",                # the request id
    "prediction_ttl_ms",  # how long its prediction counts
    "u",                  # uniform in [0, 1): ties and sampling
    "temperature",
    "pinned",             # the pinned candidate (1-based), 0 = none
    "weight",             # overlap score weight
    "table_ttl_ms",       # > 0: store `sent` as the candidate table for that long; 0: it is stored
    "sent",               # the candidate table, or '' when it is stored already
    "n",                  # candidates
    "nslots",             # entries of the slot lookup
    "model",
    "prefix",             # the model's block key prefix
    "approx_ttl_ms",
    "task_head",          # the task message around its queue ('' and '': enqueue nothing)
    "task_tail",
    "broker_prefix",      # what a queue's Redis list is named with before the queue (core.keys)
    "cost_kind",          # 'time' (router.time_cost) or 'blocks' (router.scoring)
    "slowdown_weight",
    "eviction_weight",
    "dry",                # 1: decide only (record, enqueue and settle nothing): the standalone router's query
    "tiers",              # 1: some candidate credits KV tiers (the TIER column); 0: no tier key is read
    "nchains",
)
#: ARGV position of each fixed argument (1-based, as Lua counts).
ARG = {name: i + 1 for i, name in enumerate(ARGS)}
FIRST_CHAIN_ARG = len(ARGS) + 1

#: The candidate table (router.inflight.Candidates): its columns in order, each with its bytes per
#: candidate and per slot-lookup entry; the last one (the worker ids and queues) runs to the end.
COLUMNS = (
    ("SLOTS", 4, 0),    # int32: the candidate's slot (-1: none)
    ("ACTIVE", 4, 0),   # int32: its active blocks (heartbeat)
    ("LOOKUP", 0, 2),   # uint16 per slot: the candidate at that slot (1-based) or 0
    ("SCALE", 8, 0),    # double: its block size / the smallest
    ("CHAIN", 1, 0),    # uint8: the number of the chain of its block size
    ("TAGS", 4, 0),     # uint32: its owner tag
    ("TIMING", 44, 0),  # 11 floats (router.time_cost.COLUMNS)
    ("TIER", 12, 0),    # 3 floats: its credit per KV tier, host, disk, shared (workers.kvbm.credit)
    ("COLD", 48, 0),    # 6 doubles: approx cap, approx number, offset and length of its id and its queue
    ("NAMES", 0, 0),    # the candidates' worker ids and queues, concatenated
)

LUA_FILE = Path(__file__).with_name("lua") / "decide.lua"
_BLOCK = re.compile(r"-- BEGIN GENERATED.*?-- END GENERATED\n", re.S)


def column_offsets(n: int, nslots: int) -> dict[str, int]:
    """Each column's byte offset in a table of ``n`` candidates and ``nslots`` lookup entries."""
    out, at = {}, 0
    for name, per_candidate, per_slot in COLUMNS:
        out[name] = at
        at += per_candidate * n + per_slot * nslots
    return out


def _term(a: int, b: int) -> str:
    parts = [f"{a} * n"] if a else []
    parts += [f"{b} * nslots"] if b else []
    return " + ".join(parts) or "0"


def lua_block() -> str:
    """The generated block of decide.lua."""
    lines = ["-- BEGIN GENERATED from router/decide_layout.py (python -m router.decide_layout); do not edit",
             "-- The fixed arguments' positions:"]
    lines += [f"local ARG_{name.upper()} = {ARG[name]}" for name in ARGS]
    lines += [f"local FIRST_CHAIN_ARG = {FIRST_CHAIN_ARG}",
              "-- The candidate table's columns, as byte offsets for n candidates and nslots lookup entries:",
              "local function column_offsets(n, nslots)"]
    at = [0, 0]
    offsets = []
    for _name, per_candidate, per_slot in COLUMNS:
        offsets.append(_term(*at))
        at = [at[0] + per_candidate, at[1] + per_slot]
    lines += [f"  return {', '.join(offsets)}", "end", "-- END GENERATED"]
    return "\n".join(lines) + "\n"


def column_names() -> str:
    """The Lua names the offsets are unpacked into, in order."""
    return ", ".join(name for name, _, _ in COLUMNS)


def check(text: str) -> list[str]:
    """What in decide.lua's text disagrees with this module (empty: nothing)."""
    found = _BLOCK.search(text)
    if found is None:
        return ["no generated block"]
    problems = [] if found.group(0) == lua_block() else ["the generated block is stale"]
    if f"local {column_names()} = column_offsets(n, nslots)" not in text:
        problems.append("the columns are not unpacked in their declared order")
    stray = re.findall(r"ARGV\[\d+\]", text)
    if stray:
        problems.append(f"positions written by hand: {', '.join(stray)}")
    return problems


def main() -> int:
    text = LUA_FILE.read_text()
    if _BLOCK.search(text) is None:
        print(f"{LUA_FILE}: no '-- BEGIN GENERATED' ... '-- END GENERATED' block", file=sys.stderr)
        return 1
    LUA_FILE.write_text(_BLOCK.sub(lambda _: lua_block(), text, count=1))
    problems = check(LUA_FILE.read_text())
    for problem in problems:
        print(f"{LUA_FILE}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
