"""``sluice keys``, ``sluice usage`` and ``sluice db``: API keys, usage summaries and the schema, from the
host, straight against the database (SLUICE_DATABASE_URL; default SQLite under ~/.cache/sluice).

    sluice keys create --name ci --models smollm2 --rpm 60 --tpm 100000   # prints the key, once
    sluice keys list [--all]
    sluice keys revoke <key id | name>
    sluice usage [--key <key id | name>] [--since 1d]
    sluice db upgrade

Exit status: 0 done, 1 it could not be done (unknown key, database unusable), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from app.accounts.periods import parse_since
from app.accounts.schemas import KeyCreate, KeyInfo
from app.accounts.store import KeyStore
from core.db import DB_UNAVAILABLE, database_url, open_database
from core.db.usage import UsageTotals, summarize_usage
from core.settings import get_settings

_DB_HELP = "database: SLUICE_DATABASE_URL, by default a SQLite file under ~/.cache/sluice"


class CommandError(Exception):
    """A command that cannot be done; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def add_accounts_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    keys = subparsers.add_parser("keys", help="manage API keys", description=f"Manage API keys ({_DB_HELP}).")
    keys_sub = keys.add_subparsers(title="commands", metavar="COMMAND", required=True)
    p = keys_sub.add_parser("create", help="create a key and print it (only its hash is stored: copy it now)")
    p.add_argument("--name", required=True, help="who or what the key is for")
    p.add_argument("--models", type=_comma_list, default=None, metavar="M1,M2",
                   help="models the key may use (default: all); names are checked for shape only, since the "
                        "served models are known at run time")
    p.add_argument("--rpm", type=int, default=None, help="requests per minute (default: no limit)")
    p.add_argument("--tpm", type=int, default=None, help="prompt + completion tokens per minute (default: no limit)")
    p.add_argument("--admin", action="store_true", help="may manage keys and read any key's usage over HTTP")
    p.set_defaults(func=_command(_keys_create))
    p = keys_sub.add_parser("list", help="list keys")
    p.add_argument("--all", action="store_true", help="include revoked keys")
    p.set_defaults(func=_command(_keys_list))
    p = keys_sub.add_parser("revoke", help="revoke a key (frontends stop accepting it within "
                                           "SLUICE_ACCOUNTS__KEY_CACHE_TTL_S seconds)")
    p.add_argument("key", help="key id, or a name that only one active key has")
    p.set_defaults(func=_command(_keys_revoke))

    p = subparsers.add_parser("usage", help="summarise usage per key and model",
                              description=f"Summarise usage per key and model ({_DB_HELP}).")
    p.add_argument("--key", default=None, help="key id or name (default: every key)")
    p.add_argument("--since", default="1d", help="a span back from now (30m, 2h, 1d, 1w) or an ISO date (default 1d)")
    p.set_defaults(func=_command(_usage))

    db = subparsers.add_parser("db", help="migrate the accounts database",
                              description=f"The accounts database schema ({_DB_HELP}).")
    db_sub = db.add_subparsers(title="commands", metavar="COMMAND", required=True)
    p = db_sub.add_parser("upgrade", help="migrate the database to this version's schema (alembic upgrade)")
    p.add_argument("revision", nargs="?", default="head", help="alembic revision to migrate to")
    p.set_defaults(func=_command(_db_upgrade))


def _comma_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",")]


def _command(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: errors become one line on stderr and an exit status, never a traceback."""

    def main(args: argparse.Namespace) -> int:
        try:
            return run(args) or 0
        except CommandError as exc:
            _err.print(f"[red]error:[/red] {exc}", highlight=False)
            return exc.status
        except DB_UNAVAILABLE as exc:
            _err.print(f"[red]error:[/red] the database cannot be used: {exc}", highlight=False)
            return 1

    return main


#: Tables are never cut: piped output is wide, and in a narrow terminal cells wrap rather than lose digits.
_out = Console(width=None if sys.stdout.isatty() else 200)
_err = Console(stderr=True, soft_wrap=True)


def _store() -> KeyStore:
    return KeyStore(open_database(database_url(get_settings())))


def _keys_create(args: argparse.Namespace) -> int:
    try:
        spec = KeyCreate(name=args.name, models=args.models, rpm=args.rpm, tpm=args.tpm, admin=args.admin)
    except ValidationError as exc:
        raise CommandError(_explain(exc), status=2) from None
    created = _store().create(spec)
    _err.print(f"Created key [bold]{created.id}[/bold] ({created.name}). Copy it now: it is shown only this once.",
               highlight=False)
    print(created.key, flush=True)
    return 0


def _explain(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else "input"
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "greater_than":
            message = f"must be a positive integer, not {error['input']}"
        lines.append(f"--{field}: {message}")
    return "; ".join(lines)


def _keys_list(args: argparse.Namespace) -> int:
    keys = _store().list_keys(include_revoked=args.all)
    table = Table(title="API keys")
    table.add_column("id", no_wrap=True, min_width=12)
    for column in ("name", "models", "rpm", "tpm", "admin", "created (UTC)", "revoked (UTC)"):
        table.add_column(column, overflow="fold")
    for key in keys:
        table.add_row(key.id, key.name, ",".join(key.models) if key.models else "all", _num(key.rpm), _num(key.tpm),
                      "yes" if key.admin else "", _when(key.created_at), _when(key.revoked_at))
    _out.print(table)
    return 0


def _resolve(store: KeyStore, ref: str, *, active_only: bool) -> list[KeyInfo]:
    found = [k for k in store.find(ref) if not (active_only and k.revoked_at is not None)]
    if not found:
        raise CommandError(f"no {'active ' if active_only else ''}API key with id or name {ref!r}")
    return found


def _keys_revoke(args: argparse.Namespace) -> int:
    store = _store()
    found = _resolve(store, args.key, active_only=False)
    if len(found) > 1:
        found = [k for k in found if k.revoked_at is None] or found[:1]
    if len(found) > 1:
        raise CommandError(f"{len(found)} active keys are named {args.key!r} "
                           f"({', '.join(k.id for k in found)}): revoke one by id")
    if found[0].revoked_at is not None:
        _err.print(f"Key {found[0].id} ({found[0].name}) was already revoked at {_when(found[0].revoked_at)} UTC.",
                   highlight=False)
        return 0
    info = store.revoke(found[0].id)
    ttl = get_settings().accounts.key_cache_ttl_s
    _err.print(f"Revoked key {info.id} ({info.name}); frontends refuse it within {ttl:g}s.", highlight=False)
    return 0


def _usage(args: argparse.Namespace) -> int:
    try:
        since = parse_since(args.since, datetime.now(UTC))
    except ValueError as exc:
        raise CommandError(f"--since: {exc}", status=2) from None
    store = _store()
    names = {k.id: k.name for k in store.list_keys(include_revoked=True)}
    key_ids = [k.id for k in _resolve(store, args.key, active_only=False)] if args.key else None
    totals = summarize_usage(store.engine, since=since, key_ids=key_ids)
    _out.print(_usage_table(totals, names, since))
    return 0


def _usage_table(totals: list[UsageTotals], names: dict[str, str], since: datetime) -> Table:
    table = Table(title=f"Usage since {_when(since)} UTC (tokens; mean TTFT and total in seconds)")
    table.add_column("key", no_wrap=True, min_width=12)
    table.add_column("name", overflow="fold")
    table.add_column("model", overflow="fold")
    for column in ("requests", "errors", "prompt", "cached", "completion", "TTFT", "total"):
        table.add_column(column, justify="right", overflow="fold")
    for t in totals:
        table.add_row(t.key_id or "(no key)", names.get(t.key_id, "") if t.key_id else "", t.model, str(t.requests),
                      str(t.errors), str(t.prompt_tokens), str(t.cached_tokens), str(t.completion_tokens),
                      _secs(t.mean_ttft_s), _secs(t.mean_total_s))
    if len(totals) > 1:
        table.add_section()
        table.add_row("total", "", "", *(str(sum(getattr(t, f) for t in totals))
                                         for f in ("requests", "errors", "prompt_tokens", "cached_tokens",
                                                   "completion_tokens")), "", "")
    return table


def _db_upgrade(args: argparse.Namespace) -> int:
    from core.db.migrate import upgrade

    url = database_url(get_settings())
    upgrade(url, args.revision)
    _err.print(f"Database at {args.revision}.", highlight=False)
    return 0


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _when(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M")

