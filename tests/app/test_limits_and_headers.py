"""Context-length budget and the x-sluice-router header (pure)."""

from __future__ import annotations

import pytest

from app.api.deps import parse_router_header, router_overrides
from app.requests.generation import resolve_max_tokens
from core.errors import ContextLengthExceeded, InvalidRequest
from core.settings import Settings


def test_max_tokens_defaults_to_what_fits() -> None:
    assert resolve_max_tokens(None, 100, 8192, 1024) == 1024
    assert resolve_max_tokens(None, 8000, 8192, 1024) == 192


def test_a_chat_completion_that_names_no_max_tokens_gets_a_small_settable_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """256 (core/settings.py says why), not 1,024: a small model that repeats itself on a CPU worker
    stops after seconds, not a minute. ``/v1/completions`` keeps OpenAI's 16."""
    for name in ("SLUICE_FRONTEND__DEFAULT_MAX_TOKENS", "SLUICE_FRONTEND__DEFAULT_COMPLETION_MAX_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    frontend = Settings().frontend
    assert (frontend.default_max_tokens, frontend.default_completion_max_tokens) == (256, 16)
    monkeypatch.setenv("SLUICE_FRONTEND__DEFAULT_MAX_TOKENS", "1024")
    assert Settings().frontend.default_max_tokens == 1024


def test_prompt_longer_than_context_is_rejected_with_the_limit() -> None:
    with pytest.raises(ContextLengthExceeded, match="8192"):
        resolve_max_tokens(None, 8192, 8192, 16)


def test_requested_completion_that_does_not_fit_is_rejected() -> None:
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 100"):
        resolve_max_tokens(50, 60, 100, 16)
    assert resolve_max_tokens(40, 60, 100, 16) == 40


def test_router_header_parses_and_body_wins() -> None:
    assert parse_router_header("mode=kv, temperature=0.5") == {"mode": "kv", "temperature": 0.5}
    o = router_overrides("mode=kv,overlap_score_weight=2", {"mode": "random", "temperature": None})
    assert (o.mode, o.overlap_score_weight, o.temperature) == ("random", 2.0, None)
    assert router_overrides("max_migrations=1", {"max_migrations": 0}).max_migrations == 0
    assert parse_router_header("max_migrations=2") == {"max_migrations": 2.0}


@pytest.mark.parametrize("bad", ["mode", "bogus=1", "temperature=hot", "temperature=-1", "temperature=nan",
                                 "disagg_min_tokens=inf", "max_migrations=-1"])
def test_bad_router_header_is_a_client_error(bad: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_router_header(bad)
