"""Alembic migrations of the accounts database (see core.db.migrate); a package so installs ship them."""
