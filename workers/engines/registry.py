"""Every engine a worker can host: one spec per engine package (workers.engines.spec), listed once.

Adding an engine is adding its package's spec to :data:`ENGINES` (and its name to
``core.settings.EngineKind``, which a unit test holds equal to this list). Importing this module imports
the specs alone, never an engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from workers.engines.mocker.spec import SPEC as MOCKER
from workers.engines.spec import EngineConfigError, EngineSpec
from workers.engines.vllm.spec import SPEC as VLLM


@dataclass(frozen=True, slots=True)
class EngineRegistry:
    """Engine specs, in the order listed; names are unique."""

    specs: tuple[EngineSpec, ...]

    def __post_init__(self) -> None:
        names = [spec.name for spec in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique: {names}")

    def __iter__(self) -> Iterator[EngineSpec]:
        return iter(self.specs)

    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.specs)

    def get(self, name: str) -> EngineSpec:
        """The spec of engine ``name``; EngineConfigError naming the known ones when there is none."""
        for spec in self.specs:
            if spec.name == name:
                return spec
        raise EngineConfigError(f"unknown engine {name!r} (known: {', '.join(self.names())})")


ENGINES = EngineRegistry((MOCKER, VLLM))
