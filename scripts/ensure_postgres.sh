#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 for the accounts tests: starts the
# machine's cluster if it is installed but stopped. Where none is installed the PostgreSQL tests
# skip with the reason printed; SQLite (the default database) needs no server.
set -uo pipefail
if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then exit 0; fi
if [ -d /etc/postgresql ] && command -v pg_ctlcluster >/dev/null 2>&1; then
  version=$(ls /etc/postgresql | sort -V | tail -1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null || true
  for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 0.2; done
fi
echo "note: no PostgreSQL on 127.0.0.1:5432; the PostgreSQL tests will be skipped" >&2
exit 0
