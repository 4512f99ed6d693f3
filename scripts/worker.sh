#!/usr/bin/env bash
# Runs `sluice worker "$@"` from the virtual environment its engine needs (the Procfile's worker line):
#   SLUICE_ENGINE=vllm    .venv-vllm (vLLM and torch live only there; `make venv-vllm` builds it)
#   anything else         .venv      (the mocker needs nothing heavy)
# On a machine without a CUDA GPU, vLLM computes on the CPU with OpenMP threads: unless
# SLUICE_WORKER__VLLM__OMP_THREADS is set, the cores are shared among the $SLUICE_WORKERS workers
# of this machine (left to itself, vLLM pins one thread per physical core and keeps one core back).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
if [ "${SLUICE_ENGINE:-mocker}" = vllm ]; then
  venv=.venv-vllm
  if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    threads=$(( $(nproc) / ${SLUICE_WORKERS:-1} ))
    [ "$threads" -ge 1 ] || threads=1
    export SLUICE_WORKER__VLLM__OMP_THREADS="${SLUICE_WORKER__VLLM__OMP_THREADS:-$threads}"
  fi
fi
if [ ! -x "$venv/bin/sluice" ]; then
  echo "scripts/worker.sh: $venv is missing (make venv$([ "$venv" = .venv ] || echo -vllm))" >&2
  exit 1
fi
exec "$venv/bin/sluice" worker "$@"
