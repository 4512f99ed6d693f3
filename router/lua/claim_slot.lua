-- CLAIM_SLOT: takes the lowest free worker slot, or the one this worker already holds (router.registry),
-- and starts the worker's lease: from now on the reaper (router/lua/reap.lua) leaves the worker alone,
-- even before its registration is written. A slot whose holder's lease has expired counts as free.
-- Returns the slot, or -1 if none is free (then no lease is started).
--
-- Two reads whatever the number of workers (the slot hash, the live part of the lease zset), then a
-- walk over Lua tables: one call per slot made a registration cost Redis milliseconds at a thousand
-- workers (4096 HGETs and a ZSCORE per held slot), and a burst of registrations starved everyone's
-- heartbeats.

local slots_key = KEYS[1]    -- slot -> worker id
local workers_key = KEYS[2]  -- workers zset (score: lease expiry)

local worker_id = ARGV[1]
local max_slots = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local lease_expiry = ARGV[4]  -- unix seconds

local owner_of, mine = {}, nil
local flat = redis.call('HGETALL', slots_key)
for j = 1, #flat, 2 do
  local slot = tonumber(flat[j])
  owner_of[slot] = flat[j + 1]
  if flat[j + 1] == worker_id and (mine == nil or slot < mine) then mine = slot end
end

local free = -1
if mine ~= nil and mine < max_slots then
  free = mine
else
  local live = {}
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', workers_key, now, '+inf')) do live[w] = true end
  for i = 0, max_slots - 1 do
    local owner = owner_of[i]
    if not owner or not live[owner] then
      free = i
      break
    end
  end
end
if free >= 0 then
  redis.call('HSET', slots_key, free, worker_id)
  redis.call('ZADD', workers_key, lease_expiry, worker_id)
end
return free
