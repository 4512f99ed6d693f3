"""The Lua scripts behind the prefix index (router.prefix_index) and the routers' shared in-flight
predictions (router.inflight). Each runs atomically inside Redis: one call is one consistent step. The sources are
``router/lua/*.lua`` (each names its KEYS and ARGV at the top); this module loads them.

A routing decision (``DECIDE``) finds each candidate's overlap by searching the prompt's chain for the
blocks where its bitmap changes (the index holds prefix-closed chains, router.prefix_index), a few
``MGET`` of a few keys each instead of one read per block: on a 1M-block index a key read costs Redis
about 0.5 µs (memory latency), and Redis time is what every frontend shares. The standalone router's
query runs the same script in its dry mode (it records, pushes and settles nothing). Its arguments and
the candidate table's columns are declared in router.decide_layout, which writes the script's block
of positions.

Conventions shared by every script:

* Block hashes travel as one string of 16 lowercase hex digits per hash (``router.resp.hex_digits``); a block's
  bitmap key is the model's block key prefix (``Keys.kv_block_prefix``) followed by those 16 digits,
  exactly ``Keys.kv_block``. Python names every other key.
* A bitmap key exists only while some bit is set: clearing the last bit deletes it.
* Slot ownership lives in two places written together: the ``kv-slots`` hash (slot -> worker id, the
  authority) and the ``kv-slot-tags`` string (4 bytes per slot, a 32-bit tag of the owner's id, read
  by routers in the same round trip as the bitmaps).
* In-flight sums are a string of two big-endian uint32 per slot (decode blocks, then queued prefill
  blocks), updated with ``BITFIELD ... OVERFLOW SAT INCRBY`` so they never wrap below zero.

The scripts reach the block keys (and DECIDE the chosen queue) without declaring them in KEYS: fine on a standalone or Sentinel
Redis; a Redis Cluster would need one model's keys under one hash tag.
"""

from __future__ import annotations

from core.lua import lua_script

#: Applies one batch of a worker's KV events (router/lua/apply.lua).
APPLY = lua_script("router", "apply.lua")
#: Replaces or extends a worker's whole state from its own block list (router/lua/resync.lua).
RESYNC = lua_script("router", "resync.lua")
#: Clears a worker's blocks, a budget at a time (router/lua/purge.lua).
PURGE = lua_script("router", "purge.lua")
#: Drops expired approximate-mode guesses (router/lua/expire_guesses.lua).
EXPIRE_GUESSES = lua_script("router", "expire_guesses.lua")
#: Scores, decides, records and enqueues in one atomic step (ONE round trip per request): finds each
#: candidate's leading overlap in the prompt's block bitmaps (checking the slot owner tags), reads the
#: in-flight sums, computes the costs, picks, records the prediction and pushes the task message.
#: Routers deciding at the same moment take turns: each decision sees every prediction recorded before it.
#:
#: Overlaps are found by search, not by reading every block: the index holds prefix-closed chains (a
#: worker holding a block holds its parent; see router.prefix_index), so along a prompt's chain the
#: bitmap R(i) of block i only ever loses bits, and each candidate's run ends where R changes. The
#: script reads R at the chain's two ends, then, while two read positions a < b have different
#: bitmaps, reads SPLIT - 1 evenly spaced positions between them (one MGET per round for every such
#: span), until every change is pinned to two neighbouring blocks: about 3 rounds and 10-20 keys for a
#: 512-block prompt, against one read per block. Only candidates whose bit is set in the first block's
#: bitmap (found from its set bits through the slot lookup) can have an overlap, so the per-candidate
#: work is the cost alone.
#:
#: Cost of candidate i (router.scoring's formula; the tests' numpy oracle uses this order of operations), sw = scale * weight:
#:   sw * (prompt - overlap) + sw * queued_sum + scale * max(active, decode_sum)
#: The candidates come as a table the script stores the first time a router sends it and reads by its id
#: afterwards, one column at a time (``GETRANGE``), only the columns the decision needs.
#: Returns {chosen (1-based), cost, overlap of the chosen, approx status ('' | 'ok' | 'busy')}, or
#: {0, '', 0, 'table'} (nothing done) when the table it names is not stored: the router sends it again.
DECIDE = lua_script("router", "decide.lua")
#: Settles in-flight predictions: 'all' or 'prefill' per request (router/lua/release.lua).
RELEASE = lua_script("router", "release.lua")
