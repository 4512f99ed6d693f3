"""vLLM's own OpenAI server beside the Sluice stack, on the same model and engine settings, for
answers compared request by request; and a LoRA adapter for the default model, made with PEFT."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from bench.devstack import Processes, free_port, wait_until

#: The settings the vLLM stack's worker gives vLLM (tests/e2e/test_vllm_stack.py), as server flags.
ENGINE_FLAGS = ["--dtype", "float32", "--block-size", "32", "--max-num-seqs", "8",
                "--kv-cache-memory-bytes", str(1 << 30), "--enable-prefix-caching", "--enforce-eager",
                "--disable-log-stats"]
LORA_RANK = 8


def make_adapter(model_dir: Path, out: Path, seed: int = 0) -> Path:
    """A rank-8 LoRA adapter on the attention's q and v projections with random weights (PEFT's
    default leaves B at zero, an adapter that changes nothing)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(str(out))
    return out


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` serving ``name`` with the adapters given, started
    at once; :meth:`wait_up` waits until it answers (a caller may start other things meanwhile: a vLLM
    start is mostly one core's imports)."""

    def __init__(self, model_dir: Path, name: str, loras: dict[str, Path]) -> None:
        self.port = free_port()
        self.processes = Processes(prefix="sluice-test-vllm-server-")
        threads = str(os.cpu_count() or 1)
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--served-model-name", name, "--host", "127.0.0.1", "--port", str(self.port), *ENGINE_FLAGS,
                "--enable-lora", "--max-loras", "1", "--max-lora-rank", str(LORA_RANK),
                "--lora-modules", *(f"{k}={v}" for k, v in loras.items())]
        # Its engine sockets in the processes' own directory, removed with them (vLLM's default, the system's
        # temporary directory, keeps those of a killed server for good).
        self.proc = self.processes.spawn("vllm", argv, {**os.environ, "OMP_NUM_THREADS": threads,
                                                         "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                                                         "VLLM_RPC_BASE_PATH": str(self.processes.workdir)})

    def wait_up(self, timeout_s: float = 300) -> None:
        """Until the server answers; stops it if it does not (or exits) within ``timeout_s``."""
        try:
            wait_until(self._up, timeout_s, "vLLM's OpenAI server", interval=0.5)
        except BaseException:
            self.processes.stop()
            raise

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _up(self) -> bool:
        if not self.proc.alive():
            raise RuntimeError(f"vLLM's server exited ({self.proc.popen.returncode}):\n{self.proc.tail()}")
        try:
            return httpx.get(f"{self.base_url}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.processes.stop()
