"""The key format and the checks on a presented key (pure functions)."""

from __future__ import annotations

import hashlib

import pytest

from app.accounts.apikey import format_key, hash_secret, new_key, parse_bearer, parse_key, secret_matches
from core.errors import Unauthorized


def test_a_new_key_round_trips() -> None:
    key_id, secret = new_key()
    key = format_key(key_id, secret)
    assert key.startswith("sk-sluice-")
    presented = parse_key(key)
    assert presented is not None and (presented.key_id, presented.secret) == (key_id, secret)
    assert parse_bearer(f"Bearer {key}") == presented
    assert parse_bearer(f"bearer   {key}  ") == presented


def test_only_the_hash_of_the_secret_is_kept_and_compared() -> None:
    _, secret = new_key()
    stored = hash_secret(secret)
    assert stored == hashlib.sha256(secret.encode()).hexdigest() and secret not in stored
    assert secret_matches(secret, stored)
    assert not secret_matches(secret[:-1] + ("A" if secret[-1] != "A" else "B"), stored)


GOOD = format_key("0123456789ab", "x" * 43)


@pytest.mark.parametrize("token", [
    "", "sk-0123456789ab-" + "x" * 43, GOOD.replace("sk-sluice-", "sk-slu1ce-"),
    GOOD.replace("0123456789ab", "0123456789AB"),  # ids are lowercase hex
    GOOD.replace("0123456789ab", "0123456789a"), GOOD + "x", GOOD[:-1], GOOD + "\n", " " + GOOD,
    GOOD.replace("xxxx", "x=x+"), "sk-sluice-0123456789ab" + "x" * 44,
])
def test_malformed_keys_are_not_keys(token: str) -> None:
    assert parse_key(token) is None


@pytest.mark.parametrize("header", [None, "", "   ", GOOD, f"Basic {GOOD}", "Bearer", "Bearer ", f"Bearer {GOOD}x",
                                    f"Token {GOOD}"])
def test_a_missing_or_malformed_header_is_401(header: str | None) -> None:
    with pytest.raises(Unauthorized) as caught:
        parse_bearer(header)
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
