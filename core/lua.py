"""Redis Lua scripts, kept as ``.lua`` files in a ``lua/`` folder beside the module that runs them.

A line ``-- include: NAME.lua`` is replaced by that file of the same folder (the prefix index's
scripts share ``router/lua/helpers.lua``). Files ship as package data (pyproject.toml) and are read
with importlib.resources, so an installed wheel finds them too; ``make lint`` runs luacheck on them.
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files

_INCLUDE = re.compile(r"^-- include: (\S+\.lua)$", re.MULTILINE)


@functools.cache
def lua_script(package: str, name: str) -> str:
    """The source of ``package/lua/name`` with its includes pasted in."""
    text = files(package).joinpath("lua", name).read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: lua_script(package, m.group(1)), text)
