-- Give up the planner's leadership if this process holds it (a clean stop: the standby takes over at once).
-- KEYS[1]: the leader key; ARGV[1]: this process's token. Returns 1 when released.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
