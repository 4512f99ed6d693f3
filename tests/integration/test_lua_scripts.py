"""The Redis scripts live in .lua files (core/lua.py): each compiles in a real Redis, every include
resolves, and no Lua is left inside Python strings."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import pytest
import redis

from core.lua import lua_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_DIRS = {"router": ROOT / "router" / "lua", "app.accounts": ROOT / "app" / "accounts" / "lua"}
SCRIPTS = [(pkg, p.name) for pkg, folder in SCRIPT_DIRS.items() for p in sorted(folder.glob("*.lua"))]


@pytest.mark.parametrize(("package", "name"), SCRIPTS)
def test_each_script_compiles_in_redis(redis_server, package: str, name: str) -> None:  # noqa: ANN001
    source = lua_script(package, name)
    assert "-- include:" not in source, "an include was left unresolved"
    assert files(package).joinpath("lua", name).is_file()
    client = redis.Redis.from_url(redis_server.url)
    try:
        sha = client.script_load(source)  # compiles the script; a syntax error raises
        assert client.script_exists(sha) == [True]
    finally:
        client.close()


def test_no_lua_left_in_python_sources() -> None:
    pattern = re.compile(r"redis\.call\(|redis\.pcall\(")
    offenders = [str(p.relative_to(ROOT)) for top in ("core", "router", "app", "workers", "sluice")
                 for p in (ROOT / top).rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_every_script_names_its_keys_and_args_at_the_top() -> None:
    """KEYS[n] and ARGV[n] with a literal n appear only in top-level ``local name = ...`` lines that
    give them names; the rest of the script uses the names."""
    declaration = re.compile(r"^local \w+(?:, \w+)* = ")
    for folder in SCRIPT_DIRS.values():
        for path in folder.glob("*.lua"):
            if path.name == "helpers.lua":
                continue
            body = path.read_text(encoding="utf-8").splitlines()
            literal = [i for i, line in enumerate(body) if re.search(r"(?:KEYS|ARGV)\[\d+\]", line)
                       and not declaration.match(line) and not line.lstrip().startswith("--")]
            assert literal == [], f"{path.name}: KEYS/ARGV used by number on lines {[i + 1 for i in literal]}"
