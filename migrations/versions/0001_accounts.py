"""API keys and usage records.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(12), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("models", sa.JSON(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("rpm IS NULL OR rpm > 0", name=op.f("ck_api_keys_rpm_positive")),
        sa.CheckConstraint("tpm IS NULL OR tpm > 0", name=op.f("ck_api_keys_tpm_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
    )
    op.create_index(op.f("ix_api_keys_name"), "api_keys", ["name"])
    op.create_table(
        "usage_records",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("key_id", sa.String(), nullable=True),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("pool", sa.String(), nullable=False),
        sa.Column("worker_ids", sa.JSON(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("queue_time_s", sa.Float(), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("total_s", sa.Float(), nullable=False),
        sa.Column("finish_reason", sa.String(), nullable=True),
        sa.Column("error_type", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
        sa.UniqueConstraint("request_id", name=op.f("uq_usage_records_request_id")),
    )
    op.create_index(op.f("ix_usage_records_created_at"), "usage_records", ["created_at"])
    op.create_index(op.f("ix_usage_records_key_id_created_at"), "usage_records", ["key_id", "created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_usage_records_key_id_created_at"), table_name="usage_records")
    op.drop_index(op.f("ix_usage_records_created_at"), table_name="usage_records")
    op.drop_table("usage_records")
    op.drop_index(op.f("ix_api_keys_name"), table_name="api_keys")
    op.drop_table("api_keys")
