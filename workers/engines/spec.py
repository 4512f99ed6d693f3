"""What an engine declares about itself (:class:`EngineSpec`), read before anything of it is built.

Each engine package declares one spec in its ``spec`` module (``workers.engines.mocker.spec``,
``workers.engines.vllm.spec``), and ``workers.engines.registry`` lists them. The factory, the worker's
start and the command line ask a spec what the engine needs and can do, never the engine's name::

    spec = ENGINES.get("vllm")
    spec.needs_weights                         # True: ``sluice models prepare`` converts the weights
    spec.check_pool(Pool.DECODE)               # None, or EngineConfigError naming what is missing
    engine = spec.build(settings, model_path)  # imports the engine now, not before

A spec module imports nothing heavy (its builder is named by module and function, and imported when
called): listing every engine must not drag vLLM and torch into a mocker worker or the CLI.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.pools import Pool
from core.settings import EngineSettings, Settings

if TYPE_CHECKING:
    from workers.engines.base import Engine

#: Builds the engine a worker is configured for, from the settings and the resolved model directory.
Builder = Callable[[Settings, Path], "Engine"]


class EngineConfigError(ValueError):
    """The worker's configuration asks of its engine what the engine's spec says it cannot do (a pool
    it cannot serve, a limit it would break), or names no known engine. Raised before the engine is
    built: a worker that cannot serve fails before it loads a model."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the engine can do. ``pools``: the pools a worker hosting it may join (core.pools); ``kv_events``:
    it can report its cache through the KV sink (an engine built with them off reports
    ``publishes_kv_events`` False, and routers guess its cache); ``lora``: it can serve LoRA adapters (its
    ``EngineInfo.features`` then name ``lora``, where its settings turn them on)."""

    pools: frozenset[Pool]
    kv_events: bool
    lora: bool

    @property
    def disaggregation(self) -> bool:
        """It prefills for another worker and decodes from another's prefill (``EngineRequest.kv_export``
        / ``kv_handle``): it serves the pools that move KV between workers."""
        return any(pool.transfers_kv for pool in self.pools)


@dataclass(frozen=True, slots=True)
class Limits:
    """What the engine refuses of its settings, checked before it is built (:meth:`check`).
    ``cpu_block_size_multiple``: on a CPU, a configured KV block size must be a multiple of it."""

    cpu_block_size_multiple: int = 1

    def check(self, engine: str, *, block_size: int | None, on_cpu: bool) -> None:
        """EngineConfigError when the configured ``block_size`` (None: the engine's own) breaks a limit."""
        multiple = self.cpu_block_size_multiple
        if on_cpu and block_size is not None and block_size % multiple:
            raise EngineConfigError(f"engine {engine!r} on a CPU needs a KV block size that is a multiple of "
                                    f"{multiple}, not {block_size} (SLUICE_WORKER__{engine.upper()}__BLOCK_SIZE)")


@dataclass(frozen=True, slots=True)
class BuilderRef:
    """A builder named by its module and function, imported only by :meth:`load`."""

    module: str
    function: str

    def load(self) -> Builder:
        builder: Builder = getattr(importlib.import_module(self.module), self.function)
        return builder


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine's declaration. ``name`` is ``SLUICE_ENGINE``'s value (``core.settings.EngineKind``), the
    name of its settings group on ``WorkerSettings`` and the ``engine`` its workers register.
    ``settings``: that group's class. ``needs_weights``: it serves from the model's weights (False: from
    the tokenizer alone, and ``sluice models prepare`` skips the weights)."""

    name: str
    settings: type[EngineSettings]
    capabilities: Capabilities
    needs_weights: bool
    builder: BuilderRef
    limits: Limits = field(default_factory=Limits)

    def settings_of(self, settings: Settings) -> EngineSettings:
        """This engine's settings group (whichever engine ``settings`` configures)."""
        group = getattr(settings.worker, self.name)
        if not isinstance(group, self.settings):
            raise TypeError(f"settings.worker.{self.name} is not a {self.settings.__name__}")
        return group

    def check_pool(self, pool: Pool) -> None:
        """EngineConfigError unless a worker hosting this engine may join ``pool``."""
        if pool in self.capabilities.pools:
            return
        if pool.transfers_kv and not self.capabilities.disaggregation:
            why = "it does not support disaggregated prefill"
        else:
            why = "its pools: " + ", ".join(sorted(self.capabilities.pools))
        raise EngineConfigError(f"engine {self.name!r} cannot serve the {pool} pool ({why})")

    def build(self, settings: Settings, model_path: Path) -> Engine:
        """The engine, built (not started) by this engine's builder, imported now."""
        return self.builder.load()(settings, model_path)
