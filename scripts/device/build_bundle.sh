#!/usr/bin/env bash
# make gpu-bundle: everything an offline GPU machine lacks to run Sluice on vLLM's CUDA build, as one
# tar.xz split into parts that each fit a device call (64 MiB at most, the working tree included).
#
#   scripts/device/build_bundle.sh            # -> .gpu/part-0 ... part-{N-1}, .gpu/bundle.sha256
#
# Environment: GPU_BUNDLE_PARTS (4), GPU_BUNDLE_WORK (/tmp/sluice-gpu-bundle: downloads, kept for the
# next build), GPU_BUNDLE_OUT (.gpu in the project root, ignored by git). Needs PyPI (pip download) and
# about 1.5 GB in the work folder; 3 to 6 minutes on 2 cores, most of it xz.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=${GPU_BUNDLE_WORK:-/tmp/sluice-gpu-bundle}
OUT=${GPU_BUNDLE_OUT:-$ROOT/.gpu}
PARTS=${GPU_BUNDLE_PARTS:-4}
PYTHON=${PYTHON:-python3}
# The device's interpreter: CPython 3.12 on x86-64 Linux (glibc 2.31 or newer wheels only).
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp)
for tag in manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  PLATFORM+=(--platform "$tag")
done

mkdir -p "$W/wheels"
echo "==> downloading the wheels of requirements/gpu-device.txt into $W/wheels"
"$PYTHON" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$W/wheels" -r "$ROOT/requirements/gpu-device.txt"
rm -rf "$W/site"
echo "==> installing them into $W/site"
"$PYTHON" -m pip install -q --no-deps --no-compile --no-index "${PLATFORM[@]}" --target "$W/site" "$W"/wheels/*.whl

# What a dense bf16 model on a Hopper GPU (H100, H200) never loads, removed to fit the calls:
removed=(
  bin                                               # console scripts, with this machine's interpreter path
  vllm/vllm-rs                                      # vLLM's Rust frontend (Sluice is the frontend)
  vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so          # FlashAttention 2: Hopper runs FlashAttention 3
  vllm/_moe_C_stable_libtorch.abi3.so               # mixture-of-experts kernels: SmolLM2 and Llama are dense
  vllm/third_party/fmha_sm100                       # Blackwell (sm100) attention kernels
  vllm/third_party/deep_gemm/include                # DeepGEMM's JIT headers (FP8 MoE GEMMs)
  nixl_ep_cu13                                      # NIXL's expert-parallel part (MoE all-to-all)
  nixl_cu13.libs/ucx/libucx_perftest*               # UCX's benchmark tool
  nixl_cu13-*.data                                  # NIXL's headers and scripts, not its libraries
)
(cd "$W/site" && rm -rf "${removed[@]}" vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so)  # DeepGEMM for other Pythons

echo "==> packing (xz)"
tar -C "$W/site" -cf - . | xz -9 -T0 > "$W/bundle.tar.xz"
(cd "$W" && sha256sum bundle.tar.xz > bundle.sha256)
rm -rf "$OUT"
mkdir -p "$OUT"
(cd "$OUT" && split -n "$PARTS" -d -a 1 "$W/bundle.tar.xz" part-)
cp "$W/bundle.sha256" "$OUT/"
ls -l "$W/bundle.tar.xz" "$OUT"
echo "==> $PARTS parts in $OUT: one device call each (docs/gpu.md)"
