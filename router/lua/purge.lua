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

local more, n = purge_worker(meta_key, blocks_key, approx_key, owners_key, tags_key, worker_id, budget)
return {more, n}
