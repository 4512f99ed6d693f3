"""API keys in the database: create, look up, list, revoke. Synchronous (SQLAlchemy sessions);
the frontend calls it from a thread, the command line directly.

Every write is one transaction: a key is either fully created or not at all, and revoking only
ever sets ``revoked_at`` (keys are never deleted, so usage rows keep naming a known key).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.accounts.apikey import format_key, hash_secret, is_key_id, new_key
from app.accounts.errors import KeyNotFound
from app.accounts.principal import Principal
from app.accounts.schemas import KeyCreate, KeyCreated, KeyInfo
from core.db.models import ApiKey

#: Key ids are 48 random bits; a clash is so rare that a few fresh draws always end it.
_ID_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class StoredKey:
    """What authentication needs to know about a key (cached by the frontend)."""

    principal: Principal
    secret_sha256: str
    revoked: bool


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(id=row.id, name=row.name, models=row.models, rpm=row.rpm, tpm=row.tpm, admin=row.is_admin,
                   created_at=row.created_at, revoked_at=row.revoked_at)


class KeyStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def create(self, spec: KeyCreate) -> KeyCreated:
        """Store a new key and return it with its full key string (shown this once, never again)."""
        for _ in range(_ID_ATTEMPTS):
            key_id, secret = new_key()
            row = ApiKey(id=key_id, name=spec.name, secret_sha256=hash_secret(secret), models=spec.models,
                         rpm=spec.rpm, tpm=spec.tpm, is_admin=spec.admin, created_at=datetime.now(UTC))
            try:
                with self._sessions.begin() as session:
                    session.add(row)
            except IntegrityError:
                continue
            return KeyCreated(**_info(row).model_dump(), key=format_key(key_id, secret))
        raise RuntimeError(f"no free key id after {_ID_ATTEMPTS} attempts")

    def get(self, key_id: str) -> StoredKey | None:
        with Session(self.engine) as session:
            row = session.get(ApiKey, key_id)
        if row is None:
            return None
        principal = Principal(key_id=row.id, name=row.name, is_admin=row.is_admin,
                              models=frozenset(row.models) if row.models is not None else None,
                              rpm=row.rpm, tpm=row.tpm)
        return StoredKey(principal, row.secret_sha256, revoked=row.revoked_at is not None)

    def info(self, key_id: str) -> KeyInfo:
        with Session(self.engine) as session:
            row = session.get(ApiKey, key_id)
        if row is None:
            raise KeyNotFound(f"no API key with id {key_id!r}", param="key_id")
        return _info(row)

    def list_keys(self, *, include_revoked: bool = False) -> list[KeyInfo]:
        query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
        if not include_revoked:
            query = query.where(ApiKey.revoked_at.is_(None))
        with Session(self.engine) as session:
            return [_info(row) for row in session.scalars(query)]

    def find(self, ref: str) -> list[KeyInfo]:
        """The keys ``ref`` names: the key with that id, else every key with that name."""
        with Session(self.engine) as session:
            row = session.get(ApiKey, ref) if is_key_id(ref) else None
            if row is not None:
                return [_info(row)]
            query = select(ApiKey).where(ApiKey.name == ref).order_by(ApiKey.created_at, ApiKey.id)
            return [_info(r) for r in session.scalars(query)]

    def revoke(self, key_id: str) -> KeyInfo:
        """Revoke the key (idempotent: revoking a revoked key keeps its first ``revoked_at``)."""
        with self._sessions.begin() as session:
            row = session.get(ApiKey, key_id, with_for_update=True)
            if row is None:
                raise KeyNotFound(f"no API key with id {key_id!r}", param="key_id")
            if row.revoked_at is None:
                row.revoked_at = datetime.now(UTC)
            return _info(row)
