-- EXPIRE_GUESSES: drops the approximate-mode guesses that expired, for several workers.
-- KEYS: pairs of (the worker's approximate zset, its meta hash), one pair per worker.
-- Returns how many expired guesses were dropped.
-- include: helpers.lua

local limit = tonumber(ARGV[1])  -- most guesses dropped per worker

local now, n = now_ms(), 0
for j = 1, #KEYS, 2 do n = n + expire_guesses(KEYS[j], KEYS[j + 1], now, limit) end
return n
