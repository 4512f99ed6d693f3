#!/usr/bin/env bash
# Device call 1..N (docs/gpu.md): keep the bundle part this call carried (.gpu/part-K, and with the last
# one .gpu/bundle.sha256) where later calls on the same warm machine find it.
set -euo pipefail
PARTS_DIR=${SLUICE_GPU_DIR:-/tmp/sluice-gpu}/parts
mkdir -p "$PARTS_DIR"
find .gpu -maxdepth 1 -type f \( -name 'part-*' -o -name bundle.sha256 \) -exec mv {} "$PARTS_DIR"/ \;
ls -l "$PARTS_DIR"
nvidia-smi -L
