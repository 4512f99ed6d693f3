-- DECIDE: scores, decides, records and enqueues in one atomic step (ONE round trip per request);
-- with `dry`, scores and decides only (the standalone router's /best_worker).
-- How it finds overlaps and what it returns: router/index_scripts.py (DECIDE).
-- Returns {chosen (1-based), cost, overlap of the chosen, approx status ('' | 'ok' | 'busy')}, or
-- {0, '', 0, 'table'} when the candidate table it names is not stored (it changed nothing then).
-- include: helpers.lua

local sums_key = KEYS[1]      -- in-flight sums (two uint32 per slot: decode, queued prefill)
local requests_key = KEYS[2]  -- in-flight requests
local expiry_key = KEYS[3]    -- in-flight expiry zset
local owners_key = KEYS[4]    -- slot owners
local tags_key = KEYS[5]      -- slot owner tags
local table_key = KEYS[6]     -- the candidate table (its packed columns, below)
local replaced_key = KEYS[7]  -- the table it replaces (dropped when this one is stored), or KEYS[6]
-- KEYS[8..]: for every candidate in approximate mode, its approx zset and its meta, in order.
local FIRST_APPROX_KEY = 8

-- BEGIN GENERATED from router/decide_layout.py (python -m router.decide_layout); do not edit
-- The fixed arguments' positions:
local ARG_RID = 1
local ARG_PREDICTION_TTL_MS = 2
local ARG_U = 3
local ARG_TEMPERATURE = 4
local ARG_PINNED = 5
local ARG_WEIGHT = 6
local ARG_TABLE_TTL_MS = 7
local ARG_SENT = 8
local ARG_N = 9
local ARG_NSLOTS = 10
local ARG_MODEL = 11
local ARG_PREFIX = 12
local ARG_APPROX_TTL_MS = 13
local ARG_TASK_HEAD = 14
local ARG_TASK_TAIL = 15
local ARG_BROKER_PREFIX = 16
local ARG_COST_KIND = 17
local ARG_SLOWDOWN_WEIGHT = 18
local ARG_EVICTION_WEIGHT = 19
local ARG_DRY = 20
local ARG_TIERS = 21
local ARG_NCHAINS = 22
local FIRST_CHAIN_ARG = 23
-- The candidate table's columns, as byte offsets for n candidates and nslots lookup entries:
local function column_offsets(n, nslots)
  return 0, 4 * n, 8 * n, 8 * n + 2 * nslots, 16 * n + 2 * nslots, 17 * n + 2 * nslots, 21 * n + 2 * nslots, 65 * n + 2 * nslots, 77 * n + 2 * nslots, 125 * n + 2 * nslots
end
-- END GENERATED
local rid = ARGV[ARG_RID]
local prediction_ttl_ms = tonumber(ARGV[ARG_PREDICTION_TTL_MS])
local u = tonumber(ARGV[ARG_U])                  -- uniform in [0, 1): ties and sampling
local temperature = tonumber(ARGV[ARG_TEMPERATURE])
local pinned = tonumber(ARGV[ARG_PINNED])        -- the pinned candidate (1-based), 0 = none
local weight = tonumber(ARGV[ARG_WEIGHT])        -- overlap score weight
local table_ttl_ms = tonumber(ARGV[ARG_TABLE_TTL_MS])  -- > 0: store `sent` as the table for that long
local sent = ARGV[ARG_SENT]                      -- the table (below), or '' when it is stored already
local n = tonumber(ARGV[ARG_N])                  -- candidates
local nslots = tonumber(ARGV[ARG_NSLOTS])        -- entries of the slot lookup
-- The candidate table (router.inflight.Candidates), one string of columns, each little-endian
-- (router/decide_layout.py says what each holds).
local SLOTS, ACTIVE, LOOKUP, SCALE, CHAIN, TAGS, TIMING, TIER, COLD, NAMES = column_offsets(n, nslots)
local model = ARGV[ARG_MODEL]
local prefix = ARGV[ARG_PREFIX]  -- the model's block key prefix
local approx_ttl_ms = tonumber(ARGV[ARG_APPROX_TTL_MS])
local task_head, task_tail = ARGV[ARG_TASK_HEAD], ARGV[ARG_TASK_TAIL]  -- '' and '': enqueue nothing
local broker_prefix = ARGV[ARG_BROKER_PREFIX]
local cost_kind = ARGV[ARG_COST_KIND]  -- 'time' (router.time_cost) or 'blocks' (router.scoring)
local slowdown_weight = tonumber(ARGV[ARG_SLOWDOWN_WEIGHT])
local eviction_weight = tonumber(ARGV[ARG_EVICTION_WEIGHT])
local dry = ARGV[ARG_DRY] == '1'  -- decide only: record, enqueue and settle nothing
local tiered = ARGV[ARG_TIERS] == '1'  -- some candidate credits KV tiers: read them (else not a key more)
local nchains = tonumber(ARGV[ARG_NCHAINS])
-- Per chain c = 1..nchains: the prompt's length in blocks and its hex chain; then pending in-flight
-- operations (pairs, as RELEASE takes them).
local function chain_blocks(c) return tonumber(ARGV[FIRST_CHAIN_ARG + 2 * c - 2]) end
local function chain_hex(c) return ARGV[FIRST_CHAIN_ARG + 2 * c - 1] end
local FIRST_PENDING = FIRST_CHAIN_ARG + 2 * nchains

if table_ttl_ms > 0 then
  redis.call('SET', table_key, sent, 'PX', table_ttl_ms)
  if replaced_key ~= table_key then redis.call('DEL', replaced_key) end
end
-- Each decision reads only the columns it needs.
local function column(at, length)
  if length <= 0 then return '' end
  return redis.call('GETRANGE', table_key, at, at + length - 1)
end
local head = column(0, LOOKUP + 2 * nslots)
-- Gone (expired, or Redis restarted): nothing is done, the router sends the call again with the table.
if #head ~= LOOKUP + 2 * nslots then return {0, '', 0, 'table'} end

local function undo(id)
  local rec = redis.call('HGET', requests_key, id)
  if not rec then return false end
  local slot, d, p = string.match(rec, '^(%-?%d+) (%d+) (%d+) ')
  add_sums(sums_key, tonumber(slot), -tonumber(d), -tonumber(p))
  redis.call('HDEL', requests_key, id)
  return true
end

-- The values of a string packed as one repeated item of ``size`` bytes (a struct format with its byte
-- order, one value per item), as one flat table; chunked, since a Lua call returns at most about 8,000
-- values (LUAI_MAXCSTACK).
local UNPACK_CHUNK = 7000
local function unpack_all(item, size, data)
  local n = math.floor(#data / size)
  if n <= UNPACK_CHUNK then return {struct.unpack(string.rep(item, n), data)} end
  local out = {}
  for first = 0, n - 1, UNPACK_CHUNK do
    local m = math.min(UNPACK_CHUNK, n - first)
    local v = {struct.unpack(string.rep(item, m), data, size * first + 1)}
    for k = 1, m do out[first + k] = v[k] end
  end
  return out
end

local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', expiry_key, '-inf', now, 'LIMIT', 0, 64)
for _, id in ipairs(expired) do undo(id) end
if #expired > 0 then call_chunked('ZREM', expiry_key, expired) end
-- A request id decided before: its prediction is replaced, and its task (if any) was pushed then (a
-- call repeated after a lost reply must not enqueue the request twice).
local again = not dry and undo(rid)

-- Releases and prefill-done marks this router had pending ride along: applied before the costs.
if not dry then settle(sums_key, requests_key, expiry_key, ARGV, FIRST_PENDING, #ARGV) end

local SPLIT = 8
local unpack_at, byte, floor, band, rshift, max = struct.unpack, string.byte, math.floor, bit.band, bit.rshift, math.max
-- Per candidate i: SL[i] its slot, AC[i] its active blocks; with several block sizes SC[i] its scale
-- and CH[i] its chain (with one, every scale is 1 and every chain 1).
local SL = unpack_all('<i4', 4, string.sub(head, SLOTS + 1, ACTIVE))
local AC = unpack_all('<i4', 4, string.sub(head, ACTIVE + 1, LOOKUP))
local lookup = string.sub(head, LOOKUP + 1)
local SC, CH = nil, nil
if nchains > 1 then
  SC = unpack_all('<d', 8, column(SCALE, 8 * n))
  CH = {byte(column(CHAIN, n), 1, n)}
end
local function chain_of(i) return CH and CH[i] or 1 end
local own_tags = nil  -- the candidates' owner tags, read once some candidate needs its own
local tags = nil      -- the slots' owner tags as the index holds them
local overlap, prompt = {}, {}

local function holds(v, s)
  if not v then return false end
  local x = byte(v, floor(s / 8) + 1)
  return x ~= nil and band(x, rshift(128, s % 8)) ~= 0
end

-- The leading run of chain c's blocks (hex, count of them) each candidate holds under key prefix kp, for
-- the candidates of chain c holding its first block at a slot the index says is theirs: written to run[i]
-- (returned; the device's runs go straight into `overlap`).
local function runs(kp, c, hex, count, run)
  local R = {}
  local function fetch(pos)
    local block_keys = {}
    for j = 1, #pos do
      local q = pos[j]
      block_keys[j] = kp .. string.sub(hex, 16 * q + 1, 16 * q + 16)
    end
    local values = redis.call('MGET', unpack(block_keys))
    for j = 1, #pos do R[pos[j]] = values[j] end
  end
  if count > 0 then fetch(count > 1 and {0, count - 1} or {0}) end
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
            if i > 0 and chain_of(i) == c then
              tags = tags or redis.call('GET', tags_key) or ''
              own_tags = own_tags or column(TAGS, 4 * n)
              if #tags >= 4 * s + 4 and unpack_at('>I4', tags, 4 * s + 1) == unpack_at('<I4', own_tags, 4 * i - 3) then
                alive[#alive + 1] = i
              end
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
      local s, r = SL[i], count
      for _, b in ipairs(bounds) do
        if not holds(R[b], s) then r = b; break end
      end
      run[i] = r
    end
  end
  return run
end

-- The leading run of chain c's blocks in the model's shared KV tier (keys kp .. hash that exist): a binary
-- search, as the tier evicts a chain roughly from its tail.
local function shared_run(kp, hex, count)
  local lo, hi = 0, count  -- blocks [0, lo) are there; [hi, count) are not known to be
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if redis.call('EXISTS', kp .. string.sub(hex, 16 * mid + 1, 16 * mid + 16)) == 1 then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- KV tiers (docs/routing.md, "KV tiers"): credit[i] is the overlap candidate i is credited with, its device
-- run plus the blocks its tiers hold past it, each weighed by the tier's credit (TIER column: host, disk,
-- shared, one float each); overlap[i] stays the device run.
local credit = {}
local TC = tiered and unpack_all('<f', 4, column(TIER, 12 * n)) or nil
for c = 1, nchains do
  local hex = chain_hex(c)
  local count = #hex / 16
  prompt[c] = chain_blocks(c)
  runs(prefix, c, hex, count, overlap)
  if TC then
    local host, disk = runs(prefix .. 'h', c, hex, count, {}), runs(prefix .. 'd', c, hex, count, {})
    local shared = shared_run(prefix .. 'g', hex, count)
    for i = 1, n do
      if chain_of(i) == c then
        local b = 3 * (i - 1)
        local r0 = overlap[i] or 0
        local r1 = max(r0, host[i] or 0)
        local r2 = max(r1, disk[i] or 0)
        local r3 = max(r2, shared)
        credit[i] = r0 + TC[b + 1] * (r1 - r0) + TC[b + 2] * (r2 - r1) + TC[b + 3] * (r3 - r2)
      end
    end
  end
end
local function credited(i) return credit[i] or overlap[i] or 0 end

local sums = redis.call('GET', sums_key) or ''
-- S[2s+1], S[2s+2]: decode and queued prefill sums of slot s (slots past the string read as 0).
local top = math.min(nslots, floor(#sums / 8))
local S = top > 0 and unpack_all('>I4', 4, string.sub(sums, 1, 8 * top)) or {}
local costs, low, min, ceil = {}, math.huge, math.min, math.ceil
local ties = {}  -- the candidates of cost `low`, in order
-- The time cost (router.time_cost, same order of operations): T[b + 1 .. b + 11] = p0, p1, p2, d0,
-- d1, d2, step token budget, KV blocks, running requests, block size, cached blocks of candidate i
-- (b = 11 (i - 1)).
local T = cost_kind == 'time' and unpack_all('<f', 4, column(TIMING, 44 * n)) or nil
local function pre(b, t)
  if t <= 0 then return 0 end
  local v = T[b + 1] + T[b + 2] * t + T[b + 3] * t * t
  if v < 0 then return 0 end
  return v
end
local function prefill(b, nt)
  local m = T[b + 7]
  local k = ceil(nt / m)
  local full = max(k - 1, 0)
  return full * pre(b, m) + pre(b, nt - full * m), k
end
if not T and not SC then
  -- The block cost with one block size (every scale 1, so sw = weight and scale * x = x exactly): the
  -- loop below without what it would multiply by 1.
  local blocks = prompt[1]
  for i = 1, n do
    local s = SL[i]
    local dsum, psum = 0, 0
    if s >= 0 and s < top then dsum, psum = S[2 * s + 1], S[2 * s + 2] end
    local busy = AC[i]
    if dsum > busy then busy = dsum end
    local c = weight * (blocks - credited(i)) + weight * psum + busy
    costs[i] = c
    if c < low then
      low, ties = c, {i}
    elseif c == low then
      ties[#ties + 1] = i
    end
  end
end
for i = 1, (T or SC) and n or 0 do
  local s, scale, chain = SL[i], SC and SC[i] or 1, CH and CH[i] or 1
  local dsum, psum = 0, 0
  if s >= 0 and s < top then dsum, psum = S[2 * s + 1], S[2 * s + 2] end
  local c
  if T then
    local b = 11 * (i - 1)
    local bs = T[b + 10]
    local blocks = prompt[chain] - credited(i)
    local own = max(blocks * bs, 1)
    local q = psum * bs
    local busy = max(AC[i], dsum)
    local total, k = prefill(b, q + own)
    local before = prefill(b, q)
    local u = min(busy / T[b + 8], 1)
    local dec = 0
    if busy > 0 then dec = max(T[b + 4] + T[b + 5] * u + T[b + 6] * u * u, 0) end
    local ttft = total + k * dec + dec * 0.5
    local slowdown = T[b + 9] * (total - before)
    -- Blocks onboarded from a KV tier take device room as computed ones do: both count as new blocks.
    local new = prompt[chain] - (overlap[i] or 0)
    local evicted = max(new - (T[b + 8] - max(T[b + 11], busy) - psum), 0)
    c = ttft + slowdown_weight * slowdown + eviction_weight * (evicted * bs * T[b + 2])
  else
    local sw = scale * weight
    c = sw * (prompt[chain] - credited(i)) + sw * psum + scale * max(AC[i], dsum)
  end
  costs[i] = c
  if c < low then
    low, ties = c, {i}
  elseif c == low then
    ties[#ties + 1] = i
  end
end

local chosen = pinned
if chosen == 0 then
  if temperature <= 0 then
    chosen = ties[math.floor(u * #ties) + 1]
  else
    local cum, acc = {}, 0
    for i = 1, n do acc = acc + math.exp(-(costs[i] - low) / temperature); cum[i] = acc end
    local target = u * acc
    chosen = n
    for i = 1, n do if cum[i] > target then chosen = i; break end end
  end
end

local ov = overlap[chosen] or 0
local cost = string.format('%.17g', costs[chosen])
if dry then return {chosen, cost, ov, ''} end
local cap, approx_no, woff, wlen, qoff, qlen = unpack_at('<dddddd', column(COLD + 48 * (chosen - 1), 48))
local wid = column(NAMES + woff, wlen)
local s, c = SL[chosen], chain_of(chosen)
local d, p = prompt[c], prompt[c] - floor(credited(chosen))
redis.call('HSET', requests_key, rid, string.format('%d %d %d ', s, d, p) .. wid)
add_sums(sums_key, s, d, p)
redis.call('ZADD', expiry_key, now + prediction_ttl_ms, rid)
if task_head ~= '' and not again then
  -- The task message for the chosen worker's queue: enqueued in the same step as the prediction.
  local queue = column(NAMES + qoff, qlen)
  redis.call('LPUSH', broker_prefix .. queue, task_head .. queue .. task_tail)
end

if cap <= 0 then return {chosen, cost, ov, ''} end
-- Approximate mode: the chosen worker is taken to cache the prompt's blocks from now on.
local owner = redis.call('HGET', owners_key, s)
if owner and owner ~= wid then return {chosen, cost, ov, 'busy'} end
local zkey, mkey = KEYS[FIRST_APPROX_KEY + 2 * approx_no - 2], KEYS[FIRST_APPROX_KEY + 2 * approx_no - 1]
local old_slot = tonumber(redis.call('HGET', mkey, 'slot'))
if old_slot and old_slot ~= s then
  -- The worker registered again under another slot: its guesses at the old one go.
  clear_worker(mkey, nil, zkey)
  unclaim(owners_key, tags_key, old_slot, wid)
end
if not owner then claim(owners_key, tags_key, s, wid, (unpack_at('<I4', column(TAGS + 4 * (chosen - 1), 4)))) end
redis.call('HSET', mkey, 'slot', s, 'model', model, 'bprefix', prefix)
expire_guesses(zkey, mkey, now, 512)
local expiry, hex = now + approx_ttl_ms, chain_hex(c)
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
