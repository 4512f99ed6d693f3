#!/usr/bin/env bash
# Makes sure redis-server is installed (apt-get if missing) and, with --start, that one answers
# on 127.0.0.1:${SLUICE_REDIS_PORT:-6379} (started in the background, keeping nothing on disk).
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server with apt-get..."
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
[ "${1:-}" = "--start" ] || exit 0
port=${SLUICE_REDIS_PORT:-6379}
if redis-cli -p "$port" ping >/dev/null 2>&1; then exit 0; fi
dir=${TMPDIR:-/tmp}/sluice-redis-$port; mkdir -p "$dir"
redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log"
for _ in $(seq 1 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && exit 0; sleep 0.1; done
echo "redis-server did not start on port $port (see $dir/redis.log)" >&2; exit 1
