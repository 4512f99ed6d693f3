"""transformers: ``convert_weights`` (workers/models/weights.py) saves a model loaded from GGUF
as plain safetensors, which transformers refuses while the model carries the GGUF loader's
quantization marker: the private ``hf_quantizer`` attribute (and ``config.quantization_config``).
``drop_gguf_marker`` clears both. If transformers moved the marker, saving would fail (or the
written config would claim a quantization the weights do not have).

Runs in the vLLM environment (``-m vllm``: torch and transformers live there); they are imported
inside the tests so that the main environment still collects this module."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.third_party.guard import drift, installed
from workers.models.weights import drop_gguf_marker

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None,
        reason="torch and transformers live in the vLLM environment (.venv-vllm)",
    ),
]

LIBRARY = installed("transformers")
WHERE = "workers/models/weights.py (drop_gguf_marker)"


def test_save_pretrained_refuses_the_gguf_marker_until_it_is_dropped(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.quantizers import AutoHfQuantizer
    from transformers.utils.quantization_config import GgufConfig

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    # What the GGUF loader leaves on the model (modeling_utils: ``model.hf_quantizer = hf_quantizer``).
    quantizer = AutoHfQuantizer.from_config(GgufConfig(gguf_file="model.gguf"), pre_quantized=True)
    model.hf_quantizer = quantizer
    model.config.quantization_config = quantizer.quantization_config
    try:
        model.save_pretrained(tmp_path / "marked")
    except ValueError:
        pass
    else:
        pytest.fail(drift(LIBRARY, "save_pretrained no longer refuses a model whose hf_quantizer is GGUF's", WHERE,
                          "which attribute save_pretrained reads the quantizer from"))

    drop_gguf_marker(model)
    model.save_pretrained(tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert "quantization_config" not in config, drift(
        LIBRARY, "the saved config still names a quantization after the marker was dropped", WHERE,
        "where transformers keeps the quantization config")
    assert (tmp_path / "plain" / "model.safetensors").is_file()


def test_the_gguf_loader_puts_its_marker_where_it_is_dropped() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from workers.models.catalog import MODELS
    from workers.models.fetch import fetch_gguf
    from workers.models.prepare import DOWNLOADS
    from workers.models.progress import Reporter

    downloads = Path.home() / ".cache" / "sluice" / "models" / DOWNLOADS
    downloads.mkdir(parents=True, exist_ok=True)
    gguf = fetch_gguf(MODELS["smollm2"], downloads, Reporter(enabled=False))
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 local_files_only=True)
    method = getattr(getattr(getattr(model, "hf_quantizer", None), "quantization_config", None), "quant_method", None)
    assert str(method).lower().endswith("gguf"), drift(
        LIBRARY, f"a model loaded from GGUF has hf_quantizer={getattr(model, 'hf_quantizer', None)!r}", WHERE,
        "where the GGUF loader marks the model as quantized")
    drop_gguf_marker(model)
    assert model.hf_quantizer is None and not hasattr(model.config, "quantization_config")
