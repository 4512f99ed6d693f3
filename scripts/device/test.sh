#!/usr/bin/env bash
# Device: the vLLM suite (engine conformance, the vLLM adapter, the stack on the real model) on CUDA from
# the bundle (make test-gpu runs the same where a CUDA vLLM is installed). JUnit report and log: $OUT.
set -uo pipefail
source scripts/device/env.sh || exit $?
OUT=${OUT:-/tmp/sluice-gpu/out}
mkdir -p "$OUT"
python3 -m pytest -p no:cacheprovider -q -m vllm --junitxml "$OUT/junit-gpu.xml" "$@" 2>&1 | tee "$OUT/test.log"
