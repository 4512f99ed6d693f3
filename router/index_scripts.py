"""Lua scripts behind the prefix index (router.prefix_index) and the routers' shared in-flight
predictions (router.inflight). Each runs atomically inside Redis: one call is one consistent step.

A routing decision (``DECIDE``) finds each candidate's overlap by searching the prompt's chain for the
blocks where its bitmap changes (the index holds prefix-closed chains, router.prefix_index), a few
``MGET`` of a few keys each instead of one read per block: on a 1M-block index a key read costs Redis
about 0.5 µs (memory latency), and Redis time is what every frontend shares. The standalone router's
read-only query is a plain pipelined ``MGET``/``GETRANGE`` of the whole chain, scored in numpy.

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
#: KEYS: in-flight sums, in-flight requests, in-flight expiry, slot owners, slot tags, then for every
#: candidate in approximate mode its approx zset and its meta (in candidate order).
#: ARGV: 1 request_id, 2 prediction ttl ms, 3 u (uniform in [0, 1): ties and sampling), 4 temperature,
#: 5 pinned candidate (1-based, 0 = none), 6 overlap score weight, 7 hot columns (5 little-endian doubles
#: per candidate: slot, scale B_w/B_min, heartbeat active blocks, chain number (1-based), owner tag), 8
#: cold columns (6 little-endian doubles per candidate: approx cap (0: not approximate), its number among
#: the approximate candidates, offset and length of its worker id in ARGV 9, offset and length of its
#: queue in ARGV 9), 9 the candidates' worker ids and queues, concatenated, 10 slot lookup (a
#: little-endian uint16 per slot from 0 to the highest candidate slot: the candidate at that slot,
#: 1-based, or 0), 11 model, 12 block key prefix, 13 approx ttl ms, 14 and 15 the task message's head and
#: tail ('' and '': enqueue nothing; the script LPUSHes ``head .. queue .. tail`` onto the chosen
#: worker's queue, workers.wire.task_message_parts), 16 number of chains c (one per distinct block
#: size), then per chain the prompt's length in blocks (the partial last block included) and its hex
#: chain (``router.resp.hex_digits``), then any number of pending in-flight operations (pairs, as RELEASE takes
#: them), applied first.
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

-- The values of a string packed as one repeated item of ``size`` bytes (a struct format with its byte
-- order, one value per item), as one flat table; chunked, since a Lua call returns at most a few
-- thousand values.
local function unpack_all(item, size, data)
  local n = math.floor(#data / size)
  if n <= 2000 then return {struct.unpack(string.rep(item, n), data)} end
  local out = {}
  for first = 0, n - 1, 2000 do
    local m = math.min(2000, n - first)
    local v = {struct.unpack(string.rep(item, m), data, size * first + 1)}
    for k = 1, m do out[first + k] = v[k] end
  end
  return out
end

local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 64)
for _, rid in ipairs(expired) do undo(rid) end
if #expired > 0 then call_chunked('ZREM', KEYS[3], expired) end
local rid = ARGV[1]
-- A request id decided before: its prediction is replaced, and its task (if any) was pushed then (a
-- call repeated after a lost reply must not enqueue the request twice).
local again = undo(rid)

local nchains = tonumber(ARGV[16])
-- Releases and prefill-done marks this router had pending ride along: applied before the costs.
settle(KEYS[1], KEYS[2], KEYS[3], ARGV, 17 + 2 * nchains, #ARGV)

local SPLIT = 8
local unpack_at, byte, floor, band, rshift = struct.unpack, string.byte, math.floor, bit.band, bit.rshift
-- H[5i-4 .. 5i]: slot, scale, active, chain, tag of candidate i.
local H = unpack_all('<d', 8, ARGV[7])
local n = #ARGV[7] / 40
local lookup, prefix = ARGV[10], ARGV[12]
local nslots = #lookup / 2
local tags = nil
local overlap, prompt = {}, {}

local function holds(v, s)
  if not v then return false end
  local x = byte(v, floor(s / 8) + 1)
  return x ~= nil and band(x, rshift(128, s % 8)) ~= 0
end

for c = 1, nchains do
  local hex = ARGV[16 + 2 * c]
  local count = #hex / 16
  prompt[c] = tonumber(ARGV[15 + 2 * c])
  local R = {}
  local function fetch(pos)
    local names = {}
    for j = 1, #pos do
      local q = pos[j]
      names[j] = prefix .. string.sub(hex, 16 * q + 1, 16 * q + 16)
    end
    local values = redis.call('MGET', unpack(names))
    for j = 1, #pos do R[pos[j]] = values[j] end
  end
  if count > 0 then fetch(count > 1 and {0, count - 1} or {0}) end
  -- The candidates of this chain holding its first block, at a slot the index says is theirs.
  local alive = {}
  local first = R[0]
  local nbytes = first and math.min(#first, floor((nslots + 7) / 8)) or 0
  if nbytes > 0 then
    local bytes = {byte(first, 1, nbytes)}
    for b = 1, nbytes do
      local x = bytes[b]
      if x ~= 0 then
        for k = 0, 7 do
          local s = 8 * b - 8 + k
          if band(x, rshift(128, k)) ~= 0 and s < nslots then
            local i = unpack_at('<I2', lookup, 2 * s + 1)
            if i > 0 and H[5 * i - 1] == c then
              tags = tags or redis.call('GET', KEYS[5]) or ''
              if #tags >= 4 * s + 4 and unpack_at('>I4', tags, 4 * s + 1) == H[5 * i] then alive[#alive + 1] = i end
            end
          end
        end
      end
    end
  end
  if #alive > 0 then
    -- bounds: the positions b where R(b - 1) ~= R(b), i.e. where some bit's run ends.
    local bounds = {}
    local open = {}
    if count > 1 and R[0] ~= R[count - 1] then open = {0, count - 1} end
    while #open > 0 do
      local pos, spans = {}, {}
      for k = 1, #open, 2 do
        local lo, hi = open[k], open[k + 1]
        if hi - lo == 1 then
          bounds[#bounds + 1] = hi
        else
          local points, last = {lo}, lo
          for j = 1, SPLIT - 1 do
            local q = lo + floor(j * (hi - lo) / SPLIT)
            if q > last then points[#points + 1] = q; pos[#pos + 1] = q; last = q end
          end
          points[#points + 1] = hi
          spans[#spans + 1] = points
        end
      end
      if #pos > 0 then fetch(pos) end
      open = {}
      for _, points in ipairs(spans) do
        for j = 1, #points - 1 do
          local a, b = points[j], points[j + 1]
          if R[a] ~= R[b] then open[#open + 1] = a; open[#open + 1] = b end
        end
      end
    end
    table.sort(bounds)
    for _, i in ipairs(alive) do
      local s, run = H[5 * i - 4], count
      for _, b in ipairs(bounds) do
        if not holds(R[b], s) then run = b; break end
      end
      overlap[i] = run
    end
  end
end

local weight = tonumber(ARGV[6])
local sums = redis.call('GET', KEYS[1]) or ''
-- S[2s+1], S[2s+2]: decode and queued prefill sums of slot s (slots past the string read as 0).
local top = math.min(nslots, floor(#sums / 8))
local S = top > 0 and unpack_all('>I4', 4, string.sub(sums, 1, 8 * top)) or {}
local costs, low, max = {}, math.huge, math.max
for i = 1, n do
  local o = 5 * i - 5
  local s, scale = H[o + 1], H[o + 2]
  local dsum, psum = 0, 0
  if s >= 0 and s < top then dsum, psum = S[2 * s + 1], S[2 * s + 2] end
  local sw = scale * weight
  local c = sw * (prompt[H[o + 4]] - (overlap[i] or 0)) + sw * psum + scale * max(H[o + 3], dsum)
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

local cap, approx_no, woff, wlen, qoff, qlen = unpack_at('<dddddd', ARGV[8], 48 * chosen - 47)
local wid = string.sub(ARGV[9], woff + 1, woff + wlen)
local s, c, tag = H[5 * chosen - 4], H[5 * chosen - 1], H[5 * chosen]
local ov = overlap[chosen] or 0
local d, p = prompt[c], prompt[c] - ov
redis.call('HSET', KEYS[2], rid, string.format('%d %d %d ', s, d, p) .. wid)
add_sums(KEYS[1], s, d, p)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), rid)
local head = ARGV[14]
if head ~= '' and not again then
  -- The task message for the chosen worker's queue: enqueued in the same step as the prediction.
  local queue = string.sub(ARGV[9], qoff + 1, qoff + qlen)
  redis.call('LPUSH', queue, head .. queue .. ARGV[15])
end
local cost = string.format('%.17g', costs[chosen])

if cap <= 0 then return {chosen, cost, ov, ''} end
-- Approximate mode: the chosen worker is taken to cache the prompt's blocks from now on.
local owner = redis.call('HGET', KEYS[4], s)
if owner and owner ~= wid then return {chosen, cost, ov, 'busy'} end
local zkey, mkey = KEYS[5 + 2 * approx_no - 1], KEYS[5 + 2 * approx_no]
local old_slot = tonumber(redis.call('HGET', mkey, 'slot'))
if old_slot and old_slot ~= s then
  -- The worker registered again under another slot: its guesses at the old one go.
  clear_worker(mkey, nil, zkey)
  unclaim(KEYS[4], KEYS[5], old_slot, wid)
end
if not owner then claim(KEYS[4], KEYS[5], s, wid, tag) end
redis.call('HSET', mkey, 'slot', s, 'model', ARGV[11], 'bprefix', prefix)
expire_guesses(zkey, mkey, now, 512)
local expiry, hex = now + tonumber(ARGV[13]), ARGV[16 + 2 * c]
-- Deeper blocks get slightly earlier expiries, so the size cap (and expiry) evicts a chain from its
-- tail: the guesses stay prefix-closed, as the search above needs.
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
local over = redis.call('ZCARD', zkey) - cap
if over > 0 then
  local popped = redis.call('ZPOPMIN', zkey, over)
  for j = 1, #popped, 2 do clear(prefix .. popped[j], s) end
end
return {chosen, cost, ov, 'ok'}
"""

#: KEYS: in-flight sums, in-flight requests, in-flight expiry. ARGV: pairs of request_id and 'all'
#: (forget the prediction) or 'prefill' (its prefill is done: keep only its decode blocks), applied in
#: order (``settle``). Returns how many of them found their prediction.
RELEASE = _HELPERS + r"""
return settle(KEYS[1], KEYS[2], KEYS[3], ARGV, 1, #ARGV)
"""
