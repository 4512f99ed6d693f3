-- PURGE: clears up to a budget of a worker's blocks from the prefix index.
-- Returns {more (1: call again), blocks cleared}. When nothing is left the worker's meta and its
-- slot ownership go too, and only then may another worker write at that slot.
-- include: helpers.lua

local meta_key = KEYS[1]    -- the worker's meta hash
local blocks_key = KEYS[2]  -- the worker's set of stored block hashes
local approx_key = KEYS[3]  -- the worker's approximate zset
local owners_key = KEYS[4]  -- slot owners
local tags_key = KEYS[5]    -- slot owner tags

local worker_id = ARGV[1]
local budget = tonumber(ARGV[2])  -- most blocks to clear in this call

local meta = redis.call('HMGET', meta_key, 'slot', 'bprefix')
local slot, prefix = tonumber(meta[1]), meta[2]
if not slot then
  redis.call('DEL', blocks_key, approx_key)
  return {0, 0}
end
local hs = redis.call('SPOP', blocks_key, budget)
for _, h in ipairs(hs) do clear(prefix .. h, slot) end
local n = #hs
if n < budget then
  local zs = redis.call('ZPOPMIN', approx_key, budget - n)
  for i = 1, #zs, 2 do clear(prefix .. zs[i], slot); n = n + 1 end
end
if redis.call('EXISTS', blocks_key, approx_key) > 0 then return {1, n} end
redis.call('DEL', meta_key)
unclaim(owners_key, tags_key, slot, worker_id)
return {0, n}
