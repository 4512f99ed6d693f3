#!/usr/bin/env bash
# Device: vLLM's own OpenAI server against Sluice (one vLLM worker; frontend processes as given) on the
# one GPU, CUDA graphs on both, at each concurrency (bench/vllm_bench.py --device cuda). Results: $OUT.
#   C="1 32 128" ROUNDS=1 PROCESSES="1 4" bash scripts/device/bench.sh
set -euo pipefail
source scripts/device/env.sh
OUT=${OUT:-/tmp/sluice-gpu/out}
mkdir -p "$OUT"
# shellcheck disable=SC2086
python3 -m bench.vllm_bench --device cuda --concurrency ${C:-1 32 128} --rounds "${ROUNDS:-1}" \
  --frontend-processes ${PROCESSES:-1 4} --max-tokens "${MAX_TOKENS:-128}" --out "$OUT/vllm_gpu.json" 2>&1 | tee "$OUT/bench.log"
nvidia-smi --query-gpu=name,memory.used --format=csv | tee -a "$OUT/bench.log"
