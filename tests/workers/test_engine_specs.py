"""Engine specs (workers.engines.spec, .registry, .factory): each engine package declares itself, the
registry lists them without importing an engine, and a worker asked for a pool its engine cannot serve
fails before anything is built."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import get_args

import pytest

from core.messages import LORA
from core.pools import Pool
from core.settings import EngineKind, MockerSettings, Settings, VllmSettings, WorkerSettings
from workers import signals
from workers.engines.factory import create_engine
from workers.engines.mocker.engine import MockerEngine
from workers.engines.registry import ENGINES, EngineRegistry
from workers.engines.spec import BuilderRef, Capabilities, EngineConfigError, EngineSpec, Limits

#: A builder that cannot be imported: a spec that reaches it has built, or tried to.
UNBUILDABLE = BuilderRef("tests.workers.no_such_module", "build")


def agg_only(name: str = "agg-only") -> EngineSpec:
    return EngineSpec(name=name, settings=MockerSettings, needs_weights=False, builder=UNBUILDABLE,
                      capabilities=Capabilities(pools=frozenset({Pool.AGG}), kv_events=True, lora=False))


def settings_for(engine: str, pool: Pool, model_path: Path) -> Settings:
    return Settings(model_path=model_path, worker=WorkerSettings(engine=engine, pool=pool),  # type: ignore[arg-type]
                    engine=engine, pool=pool)  # the flat aliases win over the nested form: set them too


def test_the_registry_lists_every_engine_with_its_declaration() -> None:
    assert ENGINES.names() == ("mocker", "vllm")
    mocker, vllm = ENGINES.get("mocker"), ENGINES.get("vllm")
    assert (mocker.settings, vllm.settings) == (MockerSettings, VllmSettings)
    assert (mocker.needs_weights, vllm.needs_weights) == (False, True)
    for spec in ENGINES:
        assert spec.capabilities.pools == frozenset(Pool) and spec.capabilities.disaggregation
        assert spec.capabilities.kv_events and spec.capabilities.lora
    assert (mocker.limits.cpu_block_size_multiple, vllm.limits.cpu_block_size_multiple) == (1, 32)


def test_engine_kind_and_the_registry_agree() -> None:
    """core.settings cannot import the registry (it lives above core/): the two lists are held equal
    here, and each engine's settings group is the field of WorkerSettings named as it."""
    assert set(get_args(EngineKind)) == set(ENGINES.names())
    worker = WorkerSettings()
    for spec in ENGINES:
        assert type(getattr(worker, spec.name)) is spec.settings
        settings = Settings(worker=WorkerSettings(engine=spec.name))  # type: ignore[arg-type]
        assert spec.settings_of(settings) is getattr(settings.worker, spec.name)
        assert spec.settings_of(settings).max_num_seqs >= 1
        module, _, _ = spec.builder.module.rpartition(".")
        assert importlib.util.find_spec(spec.builder.module) is not None, f"{spec.name}: no {spec.builder.module}"
        assert module == f"workers.engines.{spec.name}"  # each builder lives in its engine's package


def test_an_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(EngineConfigError, match=r"unknown engine 'nope' \(known: mocker, vllm\)"):
        ENGINES.get("nope")
    with pytest.raises(ValueError, match="unique"):
        EngineRegistry((agg_only(), agg_only()))


def test_listing_the_engines_imports_no_engine() -> None:
    """The CLI and a mocker worker import the registry and the factory: vLLM's spec must not drag vLLM
    (nor torch, nor an engine module) along."""
    probe = (
        "import sys, sluice.cli, workers.engines.factory\n"
        "from workers.engines.registry import ENGINES\n"
        "assert ENGINES.names()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'vllm', 'torch'}\n"
        "             or m.startswith(('workers.engines.vllm.', 'workers.engines.mocker.'))\n"
        "             and not m.endswith('.spec'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"listing the engines imported: {out.stdout.strip()}"


@pytest.mark.parametrize(("pool", "why"), [
    (Pool.PREFILL, "it does not support disaggregated prefill"),
    (Pool.DECODE, "it does not support disaggregated prefill"),
])
def test_an_engine_refuses_a_pool_it_cannot_serve(pool: Pool, why: str) -> None:
    with pytest.raises(EngineConfigError) as info:
        agg_only().check_pool(pool)
    assert str(info.value) == f"engine 'agg-only' cannot serve the {pool} pool ({why})"
    agg_only().check_pool(Pool.AGG)


def test_a_pool_outside_a_disaggregating_engines_list_names_its_pools() -> None:
    spec = replace(agg_only("split"), capabilities=Capabilities(frozenset({Pool.PREFILL, Pool.DECODE}), True, False))
    assert spec.capabilities.disaggregation
    with pytest.raises(EngineConfigError, match=r"^engine 'split' cannot serve the agg pool \(its pools: decode, prefill\)$"):
        spec.check_pool(Pool.AGG)


def test_create_engine_checks_the_pool_before_it_builds(tmp_path: Path) -> None:
    """The builder is never imported: a misconfigured worker fails before it loads a model."""
    with pytest.raises(EngineConfigError, match="cannot serve the decode pool"):
        create_engine(settings_for("mocker", Pool.DECODE, tmp_path),
                      EngineRegistry((agg_only("mocker"),)))


def test_the_worker_exits_with_the_refusal_before_building(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(signals, "get_settings", lambda: settings_for("mocker", Pool.PREFILL, tmp_path))
    monkeypatch.setattr(signals, "create_engine", partial(create_engine, engines=EngineRegistry((agg_only("mocker"),))))

    def die(message: str) -> None:
        raise SystemExit(message)

    monkeypatch.setattr(signals, "_die", die)
    queues = SimpleNamespace(consume_from={}, select_add=lambda queue: None)
    instance = SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(queues=queues),
                                                   conf=SimpleNamespace(broker_transport_options={})))
    with pytest.raises(SystemExit) as info:
        signals._start_engine("w1", instance)
    assert str(info.value) == "engine 'mocker' cannot serve the prefill pool (it does not support disaggregated prefill)"


@pytest.mark.parametrize(("block_size", "on_cpu", "refused"), [
    (16, True, True), (48, True, True), (32, True, False), (64, True, False), (None, True, False), (16, False, False),
])
def test_vllm_refuses_a_cpu_block_size_off_its_multiple(block_size: int | None, on_cpu: bool, refused: bool) -> None:
    limits = ENGINES.get("vllm").limits
    if refused:
        with pytest.raises(EngineConfigError, match=rf"multiple of 32, not {block_size} \(SLUICE_WORKER__VLLM__BLOCK_SIZE\)"):
            limits.check("vllm", block_size=block_size, on_cpu=on_cpu)
    else:
        limits.check("vllm", block_size=block_size, on_cpu=on_cpu)
    Limits().check("mocker", block_size=block_size, on_cpu=on_cpu)  # no limit declared: nothing refused


@pytest.mark.parametrize("pool", list(Pool))
async def test_the_mocker_built_from_its_spec_is_what_the_spec_declares(pool: Pool, tmp_path: Path) -> None:
    spec = ENGINES.get("mocker")
    engine = create_engine(settings_for("mocker", pool, tmp_path))
    assert isinstance(engine, MockerEngine)
    await engine.start()
    try:
        assert engine.info.engine == spec.name
        assert engine.publishes_kv_events == spec.capabilities.kv_events
        assert (LORA in engine.info.features) == spec.capabilities.lora
    finally:
        await engine.shutdown()
