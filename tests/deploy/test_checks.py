"""The helpers the deployment tests lean on (tests/deploy/checks.py)."""

from __future__ import annotations

import pytest

from tests.deploy.checks import is_setting, parse_sluice, sluice_argv


@pytest.mark.parametrize("name", ["SLUICE_REDIS__URL", "SLUICE_REDIS_URL", "SLUICE_NAMESPACE", "SLUICE_MODEL",
                                  "SLUICE_WORKER__DRAIN_TIMEOUT_S", "SLUICE_WORKER__VLLM__NIXL_HOST",
                                  "sluice_worker__pool"])
def test_settings(name: str) -> None:
    assert is_setting(name)


@pytest.mark.parametrize("name", ["SLUICE_WORKER__DRAIN_TIMEOUT", "SLUICE_WORKER", "SLUICE_REDIS__URL__X",
                                  "SLUICE_MODEL__X", "SLUICE_REDIS_URL__X", "SLUICE_WORKERS", "FLOWER_BASIC_AUTH"])
def test_not_settings(name: str) -> None:
    assert not is_setting(name)


def test_sluice_argv() -> None:
    assert sluice_argv(["sluice", "serve", "--port", "8000"]) == ["serve", "--port", "8000"]
    assert sluice_argv(["sluice-flower"]) == ["flower", "--port", "5555", "--address", "0.0.0.0"]
    assert sluice_argv(["sh", "-c", 'sluice drain "$SLUICE_WORKER__WORKER_ID" || true']) == \
        ["drain", "SLUICE_WORKER__WORKER_ID"]
    assert sluice_argv(["sleep", "5"]) is None
    assert sluice_argv(["sh", "-c", "sleep 5"]) is None


def test_parse_sluice_fails_on_an_unknown_option() -> None:
    parse_sluice(["worker", "--name", "w1"])
    with pytest.raises(pytest.fail.Exception):
        parse_sluice(["worker", "--pool", "agg"])
