-- Functions shared by the prefix index's scripts (router/index_scripts.py): each includes this
-- file (core/lua.py pastes it where the script names it). Conventions: see the docstring of
-- router/index_scripts.py.
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

-- KV tiers below a worker's cache (docs/kvbm.md): a host or disk tier block is a bit at the worker's slot
-- under prefix .. letter .. hash ('h' host, 'd' disk), listed in the worker's set as letter .. hash, so
-- that purging and clearing the worker take them too; a device block is a bare 16-digit hash.
-- Sets the worker's bit on every block of a hex chain in one tier; returns the set members.
local function set_tier(prefix, letter, hex, slot)
  local ms = {}
  for p = 1, #hex, 16 do
    local m = letter .. string.sub(hex, p, p + 15)
    redis.call('SETBIT', prefix .. m, slot, 1)
    ms[#ms + 1] = m
  end
  return ms
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

-- Clears up to budget of a worker's blocks (events set, then approximate zset) at its recorded slot.
-- Returns more (1: blocks are left, call again), blocks cleared. When none is left the worker's meta
-- and its slot ownership go too, and only then may another worker write at that slot.
local function purge_worker(meta_key, blocks_key, approx_key, owners_key, tags_key, worker_id, budget)
  local meta = redis.call('HMGET', meta_key, 'slot', 'bprefix')
  local slot, prefix = tonumber(meta[1]), meta[2]
  if not slot then
    redis.call('DEL', blocks_key, approx_key)
    return 0, 0
  end
  local hs = redis.call('SPOP', blocks_key, budget)
  for _, h in ipairs(hs) do clear(prefix .. h, slot) end
  local n = #hs
  if n < budget then
    local zs = redis.call('ZPOPMIN', approx_key, budget - n)
    for i = 1, #zs, 2 do clear(prefix .. zs[i], slot); n = n + 1 end
  end
  if redis.call('EXISTS', blocks_key, approx_key) > 0 then return 1, n end
  redis.call('DEL', meta_key)
  unclaim(owners_key, tags_key, slot, worker_id)
  return 0, n
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

-- A gone worker's registry entry: its queue record, its load, its slot(s) and its lease; returns 1
-- when this call removed the lease entry (of several reapers racing, exactly one does).
local function drop_registration(workers_key, load_key, slots_key, queues_key, worker_id)
  redis.call('HDEL', queues_key, worker_id)
  redis.call('DEL', load_key)
  local slots = redis.call('HGETALL', slots_key)
  for i = 1, #slots, 2 do
    if slots[i + 1] == worker_id then redis.call('HDEL', slots_key, slots[i]) end
  end
  return redis.call('ZREM', workers_key, worker_id)
end
