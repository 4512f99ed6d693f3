-- REAP: forgets a gone worker (its lease ended: it expired, or the worker deregistered) unless it is live
-- again or its lease ended too recently, in steps:
-- each call clears up to a budget of its prefix-index blocks; the call that clears the last one also
-- deletes its own Celery queue with the messages in it (every priority's list) and unbinds it, drops its
-- queue record and its load, frees its registry slot and removes it from the registry (router.reaper).
-- Each call first checks the lease, in the same atomic step as its deletions: a worker that registered
-- again under the same name (router/lua/claim_slot.lua starts the lease) is never touched, however
-- the reapers' reads and its registration interleave. Idempotent; any number of reapers may run it.
-- Returns {status, blocks cleared, messages dropped, removed (1: this call removed the registry entry)};
-- status: 'spared' (live, or ended after ended_before: nothing done), 'more' (blocks are left: call
-- again), 'done'.
-- include: helpers.lua

local workers_key = KEYS[1]   -- registry: worker id -> lease expiry (zset)
local worker_key = KEYS[2]    -- the worker's registration (hash with the lease TTL)
local load_key = KEYS[3]      -- the worker's load (hash with the lease TTL)
local slots_key = KEYS[4]     -- registry: slot -> worker id
local queues_key = KEYS[5]    -- registry: worker id -> its queue record
local meta_key = KEYS[6]      -- index: the worker's meta hash
local blocks_key = KEYS[7]    -- index: the worker's set of stored block hashes
local approx_key = KEYS[8]    -- index: the worker's approximate zset
local owners_key = KEYS[9]    -- index: slot owners
local tags_key = KEYS[10]     -- index: slot owner tags
local FIRST_QUEUE_KEY = 11    -- then the queue's lists (ARGV[4] of them), then its exchange's binding sets

local worker_id = ARGV[1]
local ended_before = tonumber(ARGV[2])  -- unix seconds: only a lease that ended before this is reaped
local budget = tonumber(ARGV[3])  -- most index blocks to clear in this call
local n_lists = tonumber(ARGV[4])
local member = ARGV[5]            -- the queue's member in the binding sets

if redis.call('EXISTS', worker_key) == 1 then return {'spared', 0, 0, 0} end
local expiry = redis.call('ZSCORE', workers_key, worker_id)
if expiry and tonumber(expiry) >= ended_before then return {'spared', 0, 0, 0} end

local more, cleared = purge_worker(meta_key, blocks_key, approx_key, owners_key, tags_key, worker_id, budget)
if more == 1 then return {'more', cleared, 0, 0} end

local dropped = 0
local last_list = FIRST_QUEUE_KEY + n_lists - 1
for i = FIRST_QUEUE_KEY, last_list do
  dropped = dropped + redis.call('LLEN', KEYS[i])
  redis.call('DEL', KEYS[i])
end
for i = last_list + 1, #KEYS do redis.call('SREM', KEYS[i], member) end
local removed = drop_registration(workers_key, load_key, slots_key, queues_key, worker_id)
return {'done', cleared, dropped, removed}
