-- RESYNC: sets (or adds to) a worker's whole state in the prefix index from its own block list.
-- Returns {'ok', blocks_added} | {'busy', owner} (another worker's bits are still at the slot) |
-- {'big', n} (the previous state is too large to drop in one step: purge it first, then call again).
-- include: helpers.lua

local meta_key = KEYS[1]    -- the worker's meta hash
local blocks_key = KEYS[2]  -- the worker's set of stored block hashes
local approx_key = KEYS[3]  -- the worker's approximate zset
local owners_key = KEYS[4]  -- slot owners
local tags_key = KEYS[5]    -- slot owner tags
local stream_key = KEYS[6]  -- the model's KV events stream

local worker_id = ARGV[1]
local slot = tonumber(ARGV[2])
local event_id = ARGV[3]
local model = ARGV[4]
local prefix = ARGV[5]
local stream_maxlen = ARGV[6]
local payload = ARGV[7]         -- '' = nothing to add to the stream
local owner_tag = tonumber(ARGV[8])
local replace = ARGV[9] == '1'  -- drop the worker's previous state first (else add to it)
local max_inline_drop = tonumber(ARGV[10])
local chain_hex = ARGV[11]      -- the blocks to add
local host_hex = ARGV[12] or ''  -- the blocks to add in the worker's host and disk tiers (docs/kvbm.md)
local disk_hex = ARGV[13] or ''

local owner = redis.call('HGET', owners_key, slot)
if owner and owner ~= worker_id then return {'busy', owner} end
if replace then
  local old = redis.call('SCARD', blocks_key) + redis.call('ZCARD', approx_key)
  if old > max_inline_drop then return {'big', old} end
  local _, old_slot = clear_worker(meta_key, blocks_key, approx_key)
  if old_slot and old_slot ~= slot then unclaim(owners_key, tags_key, old_slot, worker_id) end
end
local added = call_chunked('SADD', blocks_key, set_chain(prefix, chain_hex, slot))
if host_hex ~= '' then call_chunked('SADD', blocks_key, set_tier(prefix, 'h', host_hex, slot)) end
if disk_hex ~= '' then call_chunked('SADD', blocks_key, set_tier(prefix, 'd', disk_hex, slot)) end
redis.call('HSET', meta_key, 'eid', event_id, 'slot', slot, 'model', model, 'bprefix', prefix)
if not owner then claim(owners_key, tags_key, slot, worker_id, owner_tag) end
if payload ~= '' then
  redis.call('XADD', stream_key, 'MAXLEN', '~', stream_maxlen, '*', 'b', payload)
end
return {'ok', added}
