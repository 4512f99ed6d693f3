"""Hugging Face tokenizer and config files built from GGUF metadata, without torch.

The tokenizer is rebuilt with the ``tokenizers`` library: GGUF's ``gpt2`` tokenizer model is a
byte-level BPE whose vocabulary is stored already byte-encoded (``Ġ`` for a space), so vocab and
merges go into a BPE model as they are. The pre-tokenizer is not stored in GGUF, only named
(``tokenizer.ggml.pre``); :data:`PRE_TOKENIZERS` maps those names to the equivalent Hugging Face
pre-tokenizer (the split llama.cpp applies for that name). Control tokens become special added
tokens, so chat markup such as ``<|im_start|>`` encodes to one id and decodes back verbatim.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from workers.models.gguf_meta import TOKEN_CONTROL, TOKEN_USER_DEFINED, GgufMetadata


class UnsupportedModelError(ValueError):
    """The GGUF uses a tokenizer or architecture this module cannot convert."""


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    # llama.cpp splits every digit on its own ("\p{N}") before the GPT-2 regex.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "gpt-2": _gpt2,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
}

ARCHITECTURES = {"llama": "LlamaForCausalLM"}


def build_tokenizer(meta: GgufMetadata) -> Tokenizer:
    if meta.tokenizer_model != "gpt2":
        raise UnsupportedModelError(f"GGUF tokenizer model {meta.tokenizer_model!r} is not supported (only 'gpt2')")
    make_pre = PRE_TOKENIZERS.get(meta.pre_tokenizer)
    if make_pre is None:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise UnsupportedModelError(f"GGUF pre-tokenizer {meta.pre_tokenizer!r} is not supported ({known})")
    vocab = {token: i for i, token in enumerate(meta.tokens)}
    merges = [(left, right) for left, right in (m.split(" ", 1) for m in meta.merges)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = make_pre()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([_added(meta.tokens[i], True) for i in _ids(meta, TOKEN_CONTROL)])
    tokenizer.add_tokens([_added(meta.tokens[i], False) for i in _ids(meta, TOKEN_USER_DEFINED)])
    return tokenizer


def _ids(meta: GgufMetadata, token_type: int) -> list[int]:
    return [i for i, t in enumerate(meta.token_types) if t == token_type]


def _added(content: str, special: bool) -> AddedToken:
    return AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)


def tokenizer_config(meta: GgufMetadata) -> dict[str, Any]:
    context = meta.hparams.get("context_length")
    added = {
        str(i): {
            "content": meta.tokens[i],
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t == TOKEN_CONTROL,
        }
        for i, t in enumerate(meta.token_types)
        if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    }
    config: dict[str, Any] = {
        "add_bos_token": meta.add_bos_token,
        "add_eos_token": meta.add_eos_token,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": meta.token(meta.bos_token_id),
        "eos_token": meta.token(meta.eos_token_id),
        "unk_token": meta.token(meta.unk_token_id),
        "pad_token": meta.token(meta.pad_token_id),
        "clean_up_tokenization_spaces": False,
        "model_max_length": context or 1_000_000_000,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if meta.chat_template:
        config["chat_template"] = meta.chat_template
    return config


def _f32(value: float) -> float:
    """GGUF stores float32: print 1e-05, not 9.999999747378752e-06."""
    return float(f"{value:.7g}")


def model_config(meta: GgufMetadata) -> dict[str, Any]:
    """``config.json`` for the architectures in :data:`ARCHITECTURES` (Llama's field names)."""
    if meta.architecture not in ARCHITECTURES:
        raise UnsupportedModelError(f"GGUF architecture {meta.architecture!r} is not supported")
    hp = meta.hparams
    hidden = hp["embedding_length"]
    heads = hp["attention.head_count"]
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[meta.architecture]],
        "model_type": meta.architecture,
        "vocab_size": len(meta.tokens),
        "hidden_size": hidden,
        "intermediate_size": hp["feed_forward_length"],
        "num_hidden_layers": hp["block_count"],
        "num_attention_heads": heads,
        "num_key_value_heads": hp.get("attention.head_count_kv", heads),
        "head_dim": hp.get("rope.dimension_count", hidden // heads),
        "max_position_embeddings": hp["context_length"],
        "rms_norm_eps": _f32(hp.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _f32(hp.get("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in meta.tensor_names,
        "bos_token_id": meta.bos_token_id,
        "eos_token_id": meta.eos_token_id,
        "pad_token_id": meta.pad_token_id,
    }
    return config


def generation_config(meta: GgufMetadata, sampling: dict[str, float] | None = None) -> dict[str, Any]:
    """Token ids from the GGUF, and the publisher's recommended sampling (``temperature``, ``top_p``...)."""
    config: dict[str, Any] = {"bos_token_id": meta.bos_token_id, "eos_token_id": meta.eos_token_id,
                              "pad_token_id": meta.pad_token_id}
    if sampling:
        config.update({"do_sample": True, **sampling})
    return config


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer_files(meta: GgufMetadata, out_dir: Path) -> None:
    """``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``."""
    build_tokenizer(meta).save(str(out_dir / "tokenizer.json"))
    tok_config = tokenizer_config(meta)
    _write_json(out_dir / "tokenizer_config.json", tok_config)
    special = {k: tok_config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if tok_config[k]}
    _write_json(out_dir / "special_tokens_map.json", special)


def write_model_config(meta: GgufMetadata, out_dir: Path) -> None:
    """``config.json``: the tokenizer-only directory's description of the model."""
    _write_json(out_dir / "config.json", model_config(meta))


def write_generation_config(meta: GgufMetadata, out_dir: Path, sampling: dict[str, float] | None = None) -> None:
    _write_json(out_dir / "generation_config.json", generation_config(meta, sampling))
