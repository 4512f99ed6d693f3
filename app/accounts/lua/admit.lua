-- ADMIT: counts a request against its API key's per-minute limits, or refuses it (app.accounts.ratelimit).
-- Returns 0 admitted (and counted), 1 over rpm, 2 over tpm.

local window_key = KEYS[1]  -- the key's window hash: r (requests), t (tokens)

local rpm = tonumber(ARGV[1])            -- -1 = no limit
local tpm = tonumber(ARGV[2])            -- -1 = no limit
local prompt_tokens = tonumber(ARGV[3])
local ttl_s = ARGV[4]

local counts = redis.call('HMGET', window_key, 'r', 't')
local requests = tonumber(counts[1]) or 0
local tokens = tonumber(counts[2]) or 0
if rpm >= 0 and requests >= rpm then return 1 end
if tpm >= 0 and tokens + prompt_tokens > tpm then return 2 end
redis.call('HINCRBY', window_key, 'r', 1)
redis.call('EXPIRE', window_key, ttl_s)
return 0
