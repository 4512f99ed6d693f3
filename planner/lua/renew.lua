-- Renew the planner's leadership if this process still holds it.
-- KEYS[1]: the leader key; ARGV[1]: this process's token; ARGV[2]: the lease in ms.
-- Returns 1 when renewed, 0 when another process holds the key (or nobody does).
if redis.call("GET", KEYS[1]) == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
  return 1
end
return 0
