-- RELEASE: settles in-flight predictions (router.inflight).
-- ARGV: pairs of request id and 'all' (forget the prediction) or 'prefill' (its prefill is done:
-- keep only its decode blocks), applied in order. Returns how many of them found their prediction.
-- include: helpers.lua

local sums_key = KEYS[1]      -- in-flight sums (two uint32 per slot)
local requests_key = KEYS[2]  -- in-flight requests (request id -> 'slot decode prefill worker')
local expiry_key = KEYS[3]    -- in-flight expiry zset

return settle(sums_key, requests_key, expiry_key, ARGV, 1, #ARGV)
