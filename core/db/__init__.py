"""Sluice's database: SQLAlchemy 2 models, engines and migrations (alembic, in ``migrations/``).

SQLite under ``settings.cache_dir`` by default (embedded: whichever process opens it first brings its
schema up to date); PostgreSQL when ``SLUICE_DATABASE_URL`` says so (its schema is a deploy step:
``sluice db upgrade`` or ``alembic upgrade head``). Nothing on the token hot path waits for it: the
frontend only reads API keys (cached) and usage rows are written by the bookkeeper.
"""

from core.db.engine import DB_UNAVAILABLE, SchemaOutOfDate, database_url, open_database
from core.db.models import ApiKey, Base, UsageRow

__all__ = ["DB_UNAVAILABLE", "ApiKey", "Base", "SchemaOutOfDate", "UsageRow", "database_url", "open_database"]
