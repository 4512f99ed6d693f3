-- CLAIM_SLOT: takes the lowest free worker slot, or the one this worker already holds (router.registry),
-- and starts the worker's lease: from now on the reaper (router/lua/reap.lua) leaves the worker alone,
-- even before its registration is written. A slot whose holder's lease has expired counts as free.
-- Returns the slot, or -1 if none is free (then no lease is started).

local slots_key = KEYS[1]    -- slot -> worker id
local workers_key = KEYS[2]  -- workers zset (score: lease expiry)

local worker_id = ARGV[1]
local max_slots = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local lease_expiry = ARGV[4]  -- unix seconds

local free = -1
for i = 0, max_slots - 1 do
  local owner = redis.call('HGET', slots_key, i)
  if owner == worker_id then
    free = i
    break
  end
  if free < 0 then
    if not owner then
      free = i
    else
      local expires = redis.call('ZSCORE', workers_key, owner)
      if (not expires) or tonumber(expires) < now then free = i end
    end
  end
end
if free >= 0 then
  redis.call('HSET', slots_key, free, worker_id)
  redis.call('ZADD', workers_key, lease_expiry, worker_id)
end
return free
