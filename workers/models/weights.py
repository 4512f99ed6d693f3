"""Dequantized safetensors weights from a GGUF file, through transformers' GGUF loader.

Needs torch, transformers and gguf (the vLLM environment has all three); imported lazily so the
tokenizer-only path runs without them. Weights are saved in float32 by default: the dequantized
values exactly, and the dtype CPU engines run fastest in (``dtype="auto"`` then picks it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class MissingDependencyError(RuntimeError):
    """An optional dependency needed for this preparation step is not installed."""


def convert_weights(gguf_path: Path, out_dir: Path, *, dtype: str = "float32", quiet: bool = False) -> None:
    """Write ``config.json`` and ``model.safetensors`` for the GGUF's model into ``out_dir``."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise MissingDependencyError(
            f"preparing model weights needs torch and transformers ({exc}); "
            "install them (the vLLM environment has both) or prepare the tokenizer only"
        ) from exc

    if quiet:
        hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        dtype=getattr(torch, dtype),
        local_files_only=True,
    )
    drop_gguf_marker(model)
    model.save_pretrained(out_dir, safe_serialization=True)


def drop_gguf_marker(model: PreTrainedModel) -> None:
    """Make a model loaded from GGUF savable as plain weights.

    transformers' GGUF loader marks the model as quantized (its private ``hf_quantizer``, and
    ``config.quantization_config``); the tensors are already dequantized, but ``save_pretrained``
    refuses to write a model that still carries the marker (tests/third_party/test_transformers.py
    checks both halves against the installed transformers).
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
