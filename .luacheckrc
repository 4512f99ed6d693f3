-- luacheck configuration for the Redis scripts (router/lua, app/accounts/lua); `make lint` runs it.
-- Redis runs Lua 5.1 with these globals; the scripts' includes (core/lua.py) paste helpers.lua in
-- front of a script, so its functions are known names in the scripts that include it.
std = "lua51"
max_line_length = 120
read_globals = {"redis", "KEYS", "ARGV", "struct", "bit", "cjson", "cmsgpack", "unpack"}

local helpers = {"clear", "CHUNK", "call_chunked", "now_ms", "set_chain", "claim", "unclaim",
                 "purge_worker", "clear_worker", "add_sums", "settle", "expire_guesses"}

files["router/lua/helpers.lua"] = {unused = false}
for _, name in ipairs({"apply", "resync", "purge", "reap", "expire_guesses", "decide", "release"}) do
  files["router/lua/" .. name .. ".lua"] = {read_globals = helpers}
end
