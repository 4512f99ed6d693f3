-- FORGET: the registry's part of reaping a gone worker when the routing state lives apart from the
-- Celery broker (router.reaper: its index blocks and its queue are dropped by calls of their own, on
-- the index's model slot and on the broker). Touches only registry keys, which share the namespace's
-- hash tag on a Redis Cluster (core.keys).
-- With ARGV[3] = '0' it only checks; with '1' it also drops the worker's queue record, its load, its
-- registry slot and its registry entry, checking again in the same atomic step, so a worker that
-- registered again meanwhile (router/lua/claim_slot.lua starts the lease) keeps its registration.
-- Returns {status, removed}; status: 'spared' (live, or its lease ended after ended_before: nothing
-- done), 'gone' (check only), 'done'; removed: 1 when this call removed the registry entry.
-- include: helpers.lua

local workers_key = KEYS[1]  -- registry: worker id -> lease expiry (zset)
local worker_key = KEYS[2]   -- the worker's registration (hash with the lease TTL)
local load_key = KEYS[3]     -- the worker's load (hash with the lease TTL)
local slots_key = KEYS[4]    -- registry: slot -> worker id
local queues_key = KEYS[5]   -- registry: worker id -> its queue record

local worker_id = ARGV[1]
local ended_before = tonumber(ARGV[2])  -- unix seconds: only a lease that ended before this is reaped
local forget = ARGV[3] == '1'

if redis.call('EXISTS', worker_key) == 1 then return {'spared', 0} end
local expiry = redis.call('ZSCORE', workers_key, worker_id)
if expiry and tonumber(expiry) >= ended_before then return {'spared', 0} end
if not forget then return {'gone', 0} end

return {'done', drop_registration(workers_key, load_key, slots_key, queues_key, worker_id)}
