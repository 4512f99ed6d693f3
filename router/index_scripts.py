"""Lua scripts behind the prefix index (router.prefix_index) and the routers' shared in-flight
predictions (router.inflight). Each runs atomically inside Redis: one call is one consistent step.

A routing decision (``DECIDE``) reads the prompt's bitmaps with ONE ``MGET`` from inside the script,
the block keys passed as KEYS (built by numpy in the router): a script calling ``GET`` per block costs
about 1 µs of Redis time per block, ten times one ``MGET`` of the same keys, and Redis time is what
every frontend shares. The standalone router's read-only query is a plain pipelined ``MGET``/``GETRANGE``.

Conventions shared by every script:

* Block hashes travel as one string of 16 lowercase hex digits per hash (``hex_chain``); a block's
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

_HELPERS = r"""
local function clear(key, slot)
  redis.call('SETBIT', key, slot, 0)
  if redis.call('BITCOUNT', key) == 0 then redis.call('DEL', key) end
end

-- Commands take at most this many arguments from one unpack (Lua's C stack is about 8000).
local CHUNK = 4000

local function call_chunked(cmd, key, items)
  local n = 0
  for i = 1, #items, CHUNK do
    n = n + redis.call(cmd, key, unpack(items, i, math.min(i + CHUNK - 1, #items)))
  end
  return n
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Sets the worker's bit on every block of a hex chain; returns the list of hex hashes.
local function set_chain(prefix, hex, slot)
  local hs = {}
  for p = 1, #hex, 16 do
    local h = string.sub(hex, p, p + 15)
    redis.call('SETBIT', prefix .. h, slot, 1)
    hs[#hs + 1] = h
  end
  return hs
end

local function claim(owners, tags, slot, wid, tag)
  redis.call('HSET', owners, slot, wid)
  redis.call('SETRANGE', tags, slot * 4, struct.pack('>I4', tag))
end

local function unclaim(owners, tags, slot, wid)
  if redis.call('HGET', owners, slot) == wid then
    redis.call('HDEL', owners, slot)
    redis.call('SETRANGE', tags, slot * 4, '\0\0\0\0')
  end
end

-- Clears every block a worker holds (events set, if given, and approximate zset) at its recorded slot.
local function clear_worker(meta_key, set_key, zset_key)
  local meta = redis.call('HMGET', meta_key, 'slot', 'bprefix')
  local slot, prefix = tonumber(meta[1]), meta[2]
  local n = 0
  if slot then
    if set_key then
      for _, h in ipairs(redis.call('SMEMBERS', set_key)) do clear(prefix .. h, slot); n = n + 1 end
    end
    for _, h in ipairs(redis.call('ZRANGE', zset_key, 0, -1)) do clear(prefix .. h, slot); n = n + 1 end
  end
  if set_key then redis.call('DEL', set_key) end
  redis.call('DEL', zset_key)
  return n, slot
end

-- Adds to a slot's in-flight sums (decode, queued prefill), saturating at 0 and 2^32 - 1.
local function add_sums(key, slot, d, p)
  if slot >= 0 and (d ~= 0 or p ~= 0) then
    redis.call('BITFIELD', key, 'OVERFLOW', 'SAT',
               'INCRBY', 'u32', '#' .. string.format('%d', 2 * slot), string.format('%d', d),
               'INCRBY', 'u32', '#' .. string.format('%d', 2 * slot + 1), string.format('%d', p))
  end
end

-- Applies in-flight operations args[first..last]: pairs of request id and 'all' (forget the
-- prediction) or 'prefill' (its prefill is done: keep only its decode blocks). Returns how many found
-- their prediction.
local function settle(sums, reqs, expiry, args, first, last)
  local found = 0
  for a = first, last, 2 do
    local rid = args[a]
    local rec = redis.call('HGET', reqs, rid)
    if rec then
      found = found + 1
      local slot, d, p, w = string.match(rec, '^(%-?%d+) (%d+) (%d+) (.*)$')
      slot, d, p = tonumber(slot), tonumber(d), tonumber(p)
      if args[a + 1] == 'prefill' then
        if p ~= 0 then
          add_sums(sums, slot, 0, -p)
          redis.call('HSET', reqs, rid, string.format('%d %d 0 ', slot, d) .. w)
        end
      else
        add_sums(sums, slot, -d, -p)
        redis.call('HDEL', reqs, rid)
        redis.call('ZREM', expiry, rid)
      end
    end
  end
  return found
end

-- Drops a worker's approximate guesses that expired (at most limit); returns how many.
local function expire_guesses(zset_key, meta_key, now, limit)
  local gone = redis.call('ZRANGEBYSCORE', zset_key, '-inf', now, 'LIMIT', 0, limit)
  if #gone == 0 then return 0 end
  local meta = redis.call('HMGET', meta_key, 'slot', 'bprefix')
  local slot, prefix = tonumber(meta[1]), meta[2]
  if slot then
    for _, h in ipairs(gone) do clear(prefix .. h, slot) end
  end
  call_chunked('ZREM', zset_key, gone)
  return #gone
end
"""

#: KEYS: worker meta, worker block set, worker approx zset, slot owners, slot tags, events stream.
#: ARGV: worker_id, slot, event_id, model, block key prefix, stream maxlen, payload ('' = none), owner
#: tag, then one argument per event: 'S' .. hex (stored), 'R' .. hex (removed), 'C' (all cleared).
#: Returns {status, last_event_id, blocks_stored, blocks_removed}; status is 'ok', 'dup' (already
#: applied), 'gap' (events are missing: resync) or 'busy' (the slot still holds another worker's bits).
APPLY = _HELPERS + r"""
local wid, slot, eid = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local owner = redis.call('HGET', KEYS[4], slot)
if owner and owner ~= wid then return {'busy', -1, 0, 0} end
local meta = redis.call('HMGET', KEYS[1], 'eid', 'slot')
local last = tonumber(meta[1])
if not last then
  if eid ~= 1 then return {'gap', -1, 0, 0} end
  last = 0
elseif tonumber(meta[2]) ~= slot then
  return {'gap', last, 0, 0}
end
if eid <= last then return {'dup', last, 0, 0} end
if eid > last + 1 then return {'gap', last, 0, 0} end

local prefix = ARGV[5]
local stored, removed = 0, 0
for i = 9, #ARGV do
  local op = ARGV[i]
  local kind = string.sub(op, 1, 1)
  if kind == 'S' then
    stored = stored + call_chunked('SADD', KEYS[2], set_chain(prefix, string.sub(op, 2), slot))
  elseif kind == 'R' then
    local hs = {}
    for p = 2, #op, 16 do hs[#hs + 1] = string.sub(op, p, p + 15) end
    removed = removed + call_chunked('SREM', KEYS[2], hs)
    for _, h in ipairs(hs) do clear(prefix .. h, slot) end
  elseif kind == 'C' then
    for _, h in ipairs(redis.call('SMEMBERS', KEYS[2])) do clear(prefix .. h, slot); removed = removed + 1 end
    redis.call('DEL', KEYS[2])
  end
end
redis.call('HSET', KEYS[1], 'eid', eid, 'slot', slot, 'model', ARGV[4], 'bprefix', prefix)
if not owner then claim(KEYS[4], KEYS[5], slot, wid, tonumber(ARGV[8])) end
if ARGV[7] ~= '' then
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[6], '*', 'b', ARGV[7])
end
return {'ok', eid, stored, removed}
"""

#: KEYS: worker meta, worker block set, worker approx zset, slot owners, slot tags, events stream.
#: ARGV: worker_id, slot, event_id, model, block key prefix, stream maxlen, payload ('' = none), owner
#: tag, replace (1: drop the worker's previous state first; 0: add to it), most old blocks to drop
#: inline, hex chain of the blocks to add.
#: Returns {'ok', blocks_added} | {'busy', owner} (another worker's bits are still at the slot) |
#: {'big', n} (the previous state is too large to drop in one step: purge it first, then call again).
RESYNC = _HELPERS + r"""
local wid, slot = ARGV[1], tonumber(ARGV[2])
local owner = redis.call('HGET', KEYS[4], slot)
if owner and owner ~= wid then return {'busy', owner} end
if ARGV[9] == '1' then
  local old = redis.call('SCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
  if old > tonumber(ARGV[10]) then return {'big', old} end
  local _, old_slot = clear_worker(KEYS[1], KEYS[2], KEYS[3])
  if old_slot and old_slot ~= slot then unclaim(KEYS[4], KEYS[5], old_slot, wid) end
end
local added = call_chunked('SADD', KEYS[2], set_chain(ARGV[5], ARGV[11], slot))
redis.call('HSET', KEYS[1], 'eid', ARGV[3], 'slot', slot, 'model', ARGV[4], 'bprefix', ARGV[5])
if not owner then claim(KEYS[4], KEYS[5], slot, wid, tonumber(ARGV[8])) end
if ARGV[7] ~= '' then
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[6], '*', 'b', ARGV[7])
end
return {'ok', added}
"""

#: KEYS: worker meta, worker block set, worker approx zset, slot owners, slot tags.
#: ARGV: worker_id, most blocks to clear in this call.
#: Returns {more (1: call again), blocks cleared}. When nothing is left the worker's meta and its
#: slot ownership go too, and only then may another worker write at that slot.
PURGE = _HELPERS + r"""
local meta = redis.call('HMGET', KEYS[1], 'slot', 'bprefix')
local slot, prefix = tonumber(meta[1]), meta[2]
if not slot then
  redis.call('DEL', KEYS[2], KEYS[3])
  return {0, 0}
end
local budget = tonumber(ARGV[2])
local hs = redis.call('SPOP', KEYS[2], budget)
for _, h in ipairs(hs) do clear(prefix .. h, slot) end
local n = #hs
if n < budget then
  local zs = redis.call('ZPOPMIN', KEYS[3], budget - n)
  for i = 1, #zs, 2 do clear(prefix .. zs[i], slot); n = n + 1 end
end
if redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then return {1, n} end
redis.call('DEL', KEYS[1])
unclaim(KEYS[4], KEYS[5], slot, ARGV[1])
return {0, n}
"""

#: KEYS: pairs of (approx zset, meta), one per worker. ARGV: most guesses dropped per worker.
#: Returns how many expired guesses were dropped.
EXPIRE_GUESSES = _HELPERS + r"""
local now, limit, n = now_ms(), tonumber(ARGV[1]), 0
for j = 1, #KEYS, 2 do n = n + expire_guesses(KEYS[j], KEYS[j + 1], now, limit) end
return n
"""

#: Scores, decides, records and enqueues in one atomic step (ONE round trip per request): reads the
#: prompt's block bitmaps and the slot owner tags, finds each candidate's leading overlap, reads the
#: in-flight sums, computes the costs, picks, records the prediction and pushes the task message. Routers deciding at
#: the same moment take turns: each decision sees every prediction recorded before it.
#: KEYS: in-flight sums, in-flight requests, in-flight expiry, slot owners, slot tags, then for every
#: candidate in approximate mode its approx zset and its meta (in candidate order).
#: ARGV: 1 request_id, 2 prediction ttl ms, 3 u (uniform in [0, 1): ties and sampling), 4 temperature,
#: 5 pinned candidate (1-based, 0 = none), 6 overlap score weight, 7 candidate columns (6 little-endian
#: doubles per candidate: slot, scale B_w/B_min, heartbeat active blocks, chain number (1-based), approx
#: cap (0: not approximate), owner tag), 8 model, 9 block key prefix, 10 approx ttl ms, 11 number of
#: chains c (one per distinct block size), then per chain the prompt's length in blocks (the partial last
#: block included) and its hex chain (``hex_chain``), then the candidates' worker ids, then their
#: queues, then the task message's head and tail ('' and '': enqueue nothing): the script LPUSHes
#: ``head .. queue .. tail`` onto the chosen worker's queue (workers.wire.task_message_parts), then
#: any number of pending in-flight operations (pairs, as RELEASE takes them), applied first.
#: The bitmaps are read in slices of READ_CHUNK blocks, up to the first block nobody holds.
#: Cost of candidate i, in the same order of operations as router.scoring.evaluate (sw = scale * weight):
#:   sw * (prompt - overlap) + sw * queued_sum + scale * max(active, decode_sum)
#: Returns {chosen (1-based), cost, overlap of the chosen, approx status ('' | 'ok' | 'busy')}.
DECIDE = _HELPERS + r"""

local function undo(rid)
  local rec = redis.call('HGET', KEYS[2], rid)
  if not rec then return false end
  local slot, d, p = string.match(rec, '^(%-?%d+) (%d+) (%d+) ')
  add_sums(KEYS[1], tonumber(slot), -tonumber(d), -tonumber(p))
  redis.call('HDEL', KEYS[2], rid)
  return true
end

local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 64)
for _, rid in ipairs(expired) do undo(rid) end
if #expired > 0 then call_chunked('ZREM', KEYS[3], expired) end
local rid = ARGV[1]
-- A request id decided before: its prediction is replaced, and its task (if any) was pushed then (a
-- call repeated after a lost reply must not enqueue the request twice).
local again = undo(rid)

local READ_CHUNK = 64
local cols, unpack_cols, band, rshift, floor = ARGV[7], struct.unpack, bit.band, bit.rshift, math.floor
local n = #cols / 48
-- Releases and prefill-done marks this router had pending ride along: applied before the costs.
settle(KEYS[1], KEYS[2], KEYS[3], ARGV, 11 + 2 * tonumber(ARGV[11]) + 2 * n + 3, #ARGV)
local slot, scale, active, chain, cap, tag, overlap = {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
  slot[i], scale[i], active[i], chain[i], cap[i], tag[i] = unpack_cols('<dddddd', cols, 48 * i - 47)
  overlap[i] = 0
end

-- Overlaps: per chain, the candidates whose slot the index says is theirs start 'alive'; walking the
-- chain's bitmaps, a candidate drops out at the first block without its bit. Consecutive blocks nearly
-- always have the same holders, so only blocks whose bitmap differs from the previous one are looked at.
local tags = redis.call('GET', KEYS[5]) or ''
local prefix, nchains = ARGV[9], tonumber(ARGV[11])
local prompt = {}
for c = 1, nchains do
  local hex = ARGV[11 + 2 * c]
  local count = #hex / 16
  prompt[c] = tonumber(ARGV[10 + 2 * c])
  local alive = {}
  for i = 1, n do
    local s = slot[i]
    if chain[i] == c and s >= 0 and #tags >= 4 * s + 4 and unpack_cols('>I4', tags, 4 * s + 1) == tag[i] then
      alive[#alive + 1] = i
    end
  end
  if count > 0 and #alive > 0 then
    local held = count
    local prev = nil
    local b = 0
    -- Read in slices, stopping after the first block nobody holds: the run cannot go past it, and a
    -- missing key costs Redis more than a present one.
    for a = 0, count - 1, READ_CHUNK do
      local names = {}
      for q = a, math.min(a + READ_CHUNK, count) - 1 do names[#names + 1] = prefix .. string.sub(hex, 16 * q + 1, 16 * q + 16) end
      local part = redis.call('MGET', unpack(names))
      for j = 1, #part do
        local v = part[j]
        b = b + 1
        if not v then held = b - 1; break end
        if v ~= prev then
          local keep = {}
          for _, i in ipairs(alive) do
            local s = slot[i]
            local byte = string.byte(v, floor(s / 8) + 1)
            if byte and band(byte, rshift(128, s % 8)) ~= 0 then keep[#keep + 1] = i else overlap[i] = b - 1 end
          end
          alive = keep
          if #alive == 0 then break end
          prev = v
        end
      end
      if #alive == 0 or held < count then break end
    end
    for _, i in ipairs(alive) do overlap[i] = held end
  end
end

local weight = tonumber(ARGV[6])
local sums = redis.call('GET', KEYS[1]) or ''
local nsums = #sums
local costs, low, max = {}, math.huge, math.max
for i = 1, n do
  local s = slot[i]
  local dsum, psum = 0, 0
  if s >= 0 and nsums >= s * 8 + 8 then dsum, psum = unpack_cols('>I4I4', sums, s * 8 + 1) end
  local sw = scale[i] * weight
  local c = sw * (prompt[chain[i]] - overlap[i]) + sw * psum + scale[i] * max(active[i], dsum)
  costs[i] = c
  if c < low then low = c end
end

local u, temperature, chosen = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if chosen == 0 then
  if temperature <= 0 then
    local ties = {}
    for i = 1, n do if costs[i] == low then ties[#ties + 1] = i end end
    chosen = ties[math.floor(u * #ties) + 1]
  else
    local cum, acc = {}, 0
    for i = 1, n do acc = acc + math.exp(-(costs[i] - low) / temperature); cum[i] = acc end
    local target = u * acc
    chosen = n
    for i = 1, n do if cum[i] > target then chosen = i; break end end
  end
end

local base = 11 + 2 * nchains
local wid = ARGV[base + chosen]
local s, c = slot[chosen], chain[chosen]
local d, p = prompt[c], prompt[c] - overlap[chosen]
redis.call('HSET', KEYS[2], rid, string.format('%d %d %d ', s, d, p) .. wid)
add_sums(KEYS[1], s, d, p)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), rid)
local head = ARGV[base + 2 * n + 1]
if head ~= '' and not again then
  -- The task message for the chosen worker's queue: enqueued in the same step as the prediction.
  local queue = ARGV[base + n + chosen]
  redis.call('LPUSH', queue, head .. queue .. ARGV[base + 2 * n + 2])
end
local cost = string.format('%.17g', costs[chosen])

if cap[chosen] <= 0 then return {chosen, cost, overlap[chosen], ''} end
-- Approximate mode: the chosen worker is taken to cache the prompt's blocks from now on.
local owner = redis.call('HGET', KEYS[4], s)
if owner and owner ~= wid then return {chosen, cost, overlap[chosen], 'busy'} end
local approx_no = 0
for i = 1, chosen do
  if cap[i] > 0 then approx_no = approx_no + 1 end
end
local zkey, mkey = KEYS[5 + 2 * approx_no - 1], KEYS[5 + 2 * approx_no]
local old_slot = tonumber(redis.call('HGET', mkey, 'slot'))
if old_slot and old_slot ~= s then
  -- The worker registered again under another slot: its guesses at the old one go.
  clear_worker(mkey, nil, zkey)
  unclaim(KEYS[4], KEYS[5], old_slot, wid)
end
if not owner then claim(KEYS[4], KEYS[5], s, wid, tag[chosen]) end
redis.call('HSET', mkey, 'slot', s, 'model', ARGV[8], 'bprefix', prefix)
expire_guesses(zkey, mkey, now, 512)
local expiry, hex = now + tonumber(ARGV[10]), ARGV[11 + 2 * c]
-- Deeper blocks get slightly earlier expiries, so the size cap evicts a chain from its tail.
local args, k = {}, 0
for q = 1, #hex, 16 do
  local h = string.sub(hex, q, q + 15)
  redis.call('SETBIT', prefix .. h, s, 1)
  args[#args + 1] = expiry - k / 1024
  args[#args + 1] = h
  k = k + 1
end
for a = 1, #args, CHUNK do
  redis.call('ZADD', zkey, unpack(args, a, math.min(a + CHUNK - 1, #args)))
end
local over = redis.call('ZCARD', zkey) - cap[chosen]
if over > 0 then
  local popped = redis.call('ZPOPMIN', zkey, over)
  for j = 1, #popped, 2 do clear(prefix .. popped[j], s) end
end
return {chosen, cost, overlap[chosen], 'ok'}
"""

#: KEYS: in-flight sums, in-flight requests, in-flight expiry. ARGV: pairs of request_id and 'all'
#: (forget the prediction) or 'prefill' (its prefill is done: keep only its decode blocks), applied in
#: order (``settle``). Returns how many of them found their prediction.
RELEASE = _HELPERS + r"""
return settle(KEYS[1], KEYS[2], KEYS[3], ARGV, 1, #ARGV)
"""
