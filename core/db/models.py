"""The tables: ``api_keys`` (who may call, with what limits) and ``usage_records`` (one row per
finished request). Migrations in ``migrations/versions`` create exactly these; a test checks that
the two agree.

Invariants: an API key's secret is never stored, only ``secret_sha256`` (the key is random and
long, so a plain hash is enough); keys are revoked, never deleted, so every usage row's ``key_id``
keeps its meaning. ``usage_records`` has no foreign key and no length limits on purpose: the
bookkeeper must be able to write any well-typed row it is given (a key from another deployment, a
model with a long name), because one unwritable row would fail its whole batch.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, CheckConstraint, DateTime, Float, Index, Integer, MetaData, String
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

KEY_ID_LENGTH = 12
NAME_MAX = 100
MODEL_NAME_MAX = 128


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend. PostgreSQL keeps ``timestamptz``; SQLite
    stores naive UTC text, and values read back get their UTC zone again."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: Sluice stores UTC-aware datetimes only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        moment: datetime = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return moment


#: Every constraint and index gets a predictable name, so migrations can refer to them on any backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = (
        CheckConstraint("rpm IS NULL OR rpm > 0", name="rpm_positive"),
        CheckConstraint("tpm IS NULL OR tpm > 0", name="tpm_positive"),
    )

    id: Mapped[str] = mapped_column(String(KEY_ID_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_MAX), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    #: The models the key may use; NULL means every model.
    models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


class UsageRow(Base):
    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_records_key_id_created_at", "key_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    #: Unique, so that a batch delivered twice (the bookkeeper acks late) inserts nothing the second time.
    request_id: Mapped[str] = mapped_column(String, unique=True)
    key_id: Mapped[str | None] = mapped_column(String, nullable=True)
    model: Mapped[str] = mapped_column(String)
    pool: Mapped[str] = mapped_column(String)
    worker_ids: Mapped[list[str]] = mapped_column(JSON)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    queue_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    total_s: Mapped[float] = mapped_column(Float)
    finish_reason: Mapped[str | None] = mapped_column(String, nullable=True)
    error_type: Mapped[str | None] = mapped_column(String, nullable=True)
    #: When the request arrived (the frontend's clock).
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
