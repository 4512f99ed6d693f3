#!/usr/bin/env bash
# Makes sure Prometheus and promtool are installed (Debian's prometheus package, without its
# recommended exporters; apt-get if missing). Nothing is started: `sluice observe` runs it.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then exit 0; fi
echo "installing prometheus with apt-get..."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
