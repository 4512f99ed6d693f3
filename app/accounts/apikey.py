"""The API key format and how a presented key is checked. Pure functions, no I/O.

A key reads ``sk-sluice-{id}-{secret}``: ``id`` is 12 lowercase hex digits (public: it names the key
in listings, usage and logs), ``secret`` is 43 URL-safe base64 characters (256 random bits). Only
``sha256(secret)`` is stored; a presented secret is compared with :func:`hmac.compare_digest`, so the
comparison takes the same time wherever the first differing character is. The secret is random
and long, so a fast unsalted hash does not make guessing from a leaked table practical.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from core.errors import Unauthorized

KEY_PREFIX = "sk-sluice-"
KEY_ID_PATTERN = r"[0-9a-f]{12}"
_KEY_RE = re.compile(rf"{re.escape(KEY_PREFIX)}({KEY_ID_PATTERN})-([A-Za-z0-9_-]{{43}})")
_KEY_ID_RE = re.compile(KEY_ID_PATTERN)


@dataclass(frozen=True, slots=True)
class PresentedKey:
    """A syntactically valid key as a caller presented it (not yet checked against the database)."""

    key_id: str
    secret: str


def new_key() -> tuple[str, str]:
    """A fresh ``(key_id, secret)``."""
    return secrets.token_hex(6), secrets.token_urlsafe(32)


def format_key(key_id: str, secret: str) -> str:
    return f"{KEY_PREFIX}{key_id}-{secret}"


def parse_key(token: str) -> PresentedKey | None:
    """The key's parts, or None when ``token`` is not shaped like a Sluice key."""
    match = _KEY_RE.fullmatch(token)
    return PresentedKey(match.group(1), match.group(2)) if match else None


def is_key_id(value: str) -> bool:
    return _KEY_ID_RE.fullmatch(value) is not None


def hash_secret(secret: str) -> str:
    """Hex sha256 of the secret: what the database stores."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_sha256: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_sha256)


def parse_bearer(authorization: str | None) -> PresentedKey:
    """The key in an ``Authorization: Bearer <key>`` header; Unauthorized when missing or malformed.

    The message never says more than "missing" or "incorrect", so it tells a guesser nothing.
    """
    if not authorization or not authorization.strip():
        raise Unauthorized("You didn't provide an API key. Pass it in the Authorization header: "
                           "'Authorization: Bearer sk-sluice-...'.")
    scheme, _, token = authorization.strip().partition(" ")
    presented = parse_key(token.strip()) if scheme.lower() == "bearer" else None
    if presented is None:
        raise Unauthorized("Incorrect API key provided.")
    return presented
