"""The settings object (core/settings.py): the flat aliases are validated as the nested fields they
override, so a bad value stops a process at start-up instead of reaching Redis."""

from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError

from core.keys import Keys
from core.settings import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLUICE_NAMESPACE", "SLUICE_REDIS__NAMESPACE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("variable", ["SLUICE_NAMESPACE", "SLUICE_REDIS__NAMESPACE"])
@pytest.mark.parametrize("bad", ["a:b", "prod:celery", "a b", "a*", "ns.1", "", "é"])
def test_a_bad_namespace_fails_at_load_naming_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str,
                                                           bad: str) -> None:
    """``:`` would let one namespace's prefix start another's (``sluice:a:`` and ``sluice:a:b:``); glob
    characters would widen the reaper's and the tests' key patterns."""
    monkeypatch.setenv(variable, bad)
    with pytest.raises(ValidationError) as info:
        Settings()
    (error,) = info.value.errors()
    assert error["type"] in ("string_pattern_mismatch", "string_too_short")
    where = "SLUICE_NAMESPACE" if variable == "SLUICE_NAMESPACE" else "redis.namespace"
    assert where in str(info.value) and "[A-Za-z0-9_-]" in str(info.value)


@pytest.mark.parametrize("good", ["default", "prod-eu_1", "A"])
def test_a_good_namespace_is_used_and_the_alias_wins(monkeypatch: pytest.MonkeyPatch, good: str) -> None:
    monkeypatch.setenv("SLUICE_REDIS__NAMESPACE", "nested")
    monkeypatch.setenv("SLUICE_NAMESPACE", good)
    assert Settings().redis.namespace == good


#: Keys' members that name Celery queues, not Redis keys: queue names are routing keys, and each queue's
#: lists are under the broker prefix (``Keys.broker_queue_lists``).
QUEUE_NAMES = {"pool_queue", "worker_queue", "bookkeeping_queue"}


def _every_name(keys: Keys) -> dict[str, list[str]]:
    """What every member of ``keys`` names (methods called with a sample argument per parameter)."""
    names: dict[str, list[str]] = {}
    for member, _ in inspect.getmembers(Keys):
        if member.startswith("_") or member in QUEUE_NAMES or member in ("namespace", "prefix", "hash_tags"):
            continue
        value = getattr(keys, member)
        if callable(value):
            params = inspect.signature(value).parameters.values()
            value = value(*(1 if p.annotation == "int" else "sluice.ns.m.agg" for p in params))
        names[member] = value if isinstance(value, list) else [value]
    return names


def test_every_key_and_channel_is_under_the_namespace() -> None:
    """Everything Sluice names in Redis starts with ``sluice:{ns}:``, the Celery broker's keys and channels
    too (kombu puts its own under ``broker_prefix``)."""
    keys = Keys("ns")
    names = _every_name(keys)
    assert {"broker_prefix", "broker_queue_lists", "broker_binding_sets", "token_channel", "workers"} <= names.keys()
    assert {member: n for member, n in names.items() if not all(x.startswith("sluice:ns:") for x in n)} == {}
    assert keys.broker_prefix == "sluice:ns:celery:"
    assert keys.broker_queue_lists("q")[0] == keys.broker_queue_list("q") == "sluice:ns:celery:q"

