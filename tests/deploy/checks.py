"""What deployment files say about Sluice, checked against the code: the ``SLUICE_*`` variables they
set are settings that exist (core/settings.py) with values the settings accept, and the ``sluice``
commands they run parse with the real command line (sluice/cli.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from pydantic import AliasChoices, BaseModel

from core.settings import Settings
from sluice.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
FLOWER_SCRIPT = ROOT / "docker" / "flower.sh"
PREFIX = "SLUICE_"


def _aliases() -> dict[str, str]:
    """Flat alias (``SLUICE_REDIS_URL``) -> the field it sets."""
    out: dict[str, str] = {}
    for name, field in Settings.model_fields.items():
        if isinstance(field.validation_alias, AliasChoices):
            out.update({c.upper(): name for c in field.validation_alias.choices if isinstance(c, str)})
    return out


def is_setting(variable: str) -> bool:
    """Whether ``variable`` is read by :class:`Settings`: a flat alias, or a field path with ``__``
    between nested groups (matched case-insensitively, as pydantic-settings does)."""
    upper = variable.upper()
    if not upper.startswith(PREFIX):
        return False
    if upper in _aliases():
        return True
    model: type[BaseModel] = Settings
    parts = upper[len(PREFIX):].lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None or field.validation_alias is not None:
            return False
        last = i == len(parts) - 1
        nested = isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        if last:
            return not nested
        if not nested:
            return False
        model = field.annotation  # type: ignore[assignment]
    return False


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process started with exactly these ``SLUICE_*`` variables builds (raises
    pydantic's ValidationError for a value it refuses)."""
    import os

    for name in [n for n in os.environ if n.upper().startswith(PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def sluice_argv(command: list[str]) -> list[str] | None:
    """The ``sluice`` arguments a container command runs, or None when it runs something else:
    ``sluice ...``; the image's ``sluice-flower`` (the last line of docker/flower.sh);
    ``sh -c "sluice ... || true"``, with shell variables standing for a word."""
    if command[:1] == ["sluice"]:
        return command[1:]
    if command[:1] == ["sluice-flower"]:
        line = FLOWER_SCRIPT.read_text().strip().splitlines()[-1]
        words = shlex.split(line)
        assert words[:2] == ["exec", "sluice"], line
        return [w for w in words[2:] if w != "$@"] + command[1:]
    if command[:2] == ["sh", "-c"] and len(command) == 3:
        script = re.sub(r'"?\$\{?(\w+)\}?"?', r"\1", command[2])
        words = shlex.split(script.split("||")[0])
        return words[1:] if words[:1] == ["sluice"] else None
    return None


def parse_sluice(argv: list[str]) -> None:
    """Fails the test unless ``sluice <argv>`` parses (a known command with known options)."""
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`sluice {' '.join(argv)}` does not parse with sluice/cli.py")


#: Redis' memory units (redis.conf): ``k``/``m``/``g`` are powers of 1000, ``kb``/``mb``/``gb`` of 1024.
_REDIS_UNITS = {"": 1, "k": 10**3, "kb": 1 << 10, "m": 10**6, "mb": 1 << 20, "g": 10**9, "gb": 1 << 30}
#: Kubernetes' quantity suffixes for bytes.
_QUANTITY_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                   "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def redis_options(argv: list[str]) -> dict[str, str]:
    """The ``--name value`` options of a ``redis-server`` command line (the program name may lead)."""
    words = argv[1:] if argv[:1] == ["redis-server"] else argv
    assert len(words) % 2 == 0 and all(w.startswith("--") for w in words[::2]), argv
    return {name[2:]: value for name, value in zip(words[::2], words[1::2], strict=True)}


def redis_bytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([a-z]*)", size.lower()).groups()  # type: ignore[union-attr]
    return int(number) * _REDIS_UNITS[unit]


def quantity_bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * _QUANTITY_UNITS[unit]
