-- APPLY: applies one batch of a worker's KV events to the prefix index, in event-id order.
-- Returns {status, last_event_id, blocks_stored, blocks_removed}; status is 'ok', 'dup' (already
-- applied), 'gap' (events are missing: resync) or 'busy' (the slot still holds another worker's bits).
-- include: helpers.lua

local meta_key = KEYS[1]    -- the worker's meta hash (eid, slot, model, bprefix)
local blocks_key = KEYS[2]  -- the worker's set of stored block hashes
-- KEYS[3], the worker's approximate zset, is passed to every index script; APPLY leaves it alone.
local owners_key = KEYS[4]  -- slot owners (slot -> worker id)
local tags_key = KEYS[5]    -- slot owner tags (4 bytes per slot)
local stream_key = KEYS[6]  -- the model's KV events stream

local worker_id = ARGV[1]
local slot = tonumber(ARGV[2])
local event_id = tonumber(ARGV[3])
local model = ARGV[4]
local prefix = ARGV[5]          -- the model's block key prefix
local stream_maxlen = ARGV[6]
local payload = ARGV[7]         -- '' = nothing to add to the stream
local owner_tag = tonumber(ARGV[8])
local shared_ttl_ms = ARGV[9]   -- how long a shared-tier block is credited after it was stored
-- ARGV[10..]: 'S' .. hex (stored), 'R' .. hex (removed), 'C' (the engine's cache cleared: its tiers stay);
-- KV tiers: 'T' .. letter .. hex (stored in tier 'h' host or 'd' disk), 'U' .. letter .. hex (removed),
-- 'G' .. hex (stored in the model's shared tier: keys of their own, no worker's), 'g' .. hex (gone from it).
local FIRST_EVENT = 10

local owner = redis.call('HGET', owners_key, slot)
if owner and owner ~= worker_id then return {'busy', -1, 0, 0} end
local meta = redis.call('HMGET', meta_key, 'eid', 'slot')
local last = tonumber(meta[1])
if not last then
  if event_id ~= 1 then return {'gap', -1, 0, 0} end
  last = 0
elseif tonumber(meta[2]) ~= slot then
  return {'gap', last, 0, 0}
end
if event_id <= last then return {'dup', last, 0, 0} end
if event_id > last + 1 then return {'gap', last, 0, 0} end

local stored, removed = 0, 0
for i = FIRST_EVENT, #ARGV do
  local op = ARGV[i]
  local kind = string.sub(op, 1, 1)
  if kind == 'S' then
    stored = stored + call_chunked('SADD', blocks_key, set_chain(prefix, string.sub(op, 2), slot))
  elseif kind == 'R' then
    local hs = {}
    for p = 2, #op, 16 do hs[#hs + 1] = string.sub(op, p, p + 15) end
    removed = removed + call_chunked('SREM', blocks_key, hs)
    for _, h in ipairs(hs) do clear(prefix .. h, slot) end
  elseif kind == 'C' then
    local gone = {}
    for _, h in ipairs(redis.call('SMEMBERS', blocks_key)) do
      if #h == 16 then clear(prefix .. h, slot); gone[#gone + 1] = h end
    end
    if #gone > 0 then removed = removed + call_chunked('SREM', blocks_key, gone) end
  elseif kind == 'T' then
    call_chunked('SADD', blocks_key, set_tier(prefix, string.sub(op, 2, 2), string.sub(op, 3), slot))
  elseif kind == 'U' then
    local letter, ms = string.sub(op, 2, 2), {}
    for p = 3, #op, 16 do ms[#ms + 1] = letter .. string.sub(op, p, p + 15) end
    call_chunked('SREM', blocks_key, ms)
    for _, m in ipairs(ms) do clear(prefix .. m, slot) end
  elseif kind == 'G' then
    for p = 2, #op, 16 do redis.call('SET', prefix .. 'g' .. string.sub(op, p, p + 15), '1', 'PX', shared_ttl_ms) end
  elseif kind == 'g' then
    for p = 2, #op, 16 do redis.call('DEL', prefix .. 'g' .. string.sub(op, p, p + 15)) end
  end
end
redis.call('HSET', meta_key, 'eid', event_id, 'slot', slot, 'model', model, 'bprefix', prefix)
if not owner then claim(owners_key, tags_key, slot, worker_id, owner_tag) end
if payload ~= '' then
  redis.call('XADD', stream_key, 'MAXLEN', '~', stream_maxlen, '*', 'b', payload)
end
return {'ok', event_id, stored, removed}
