"""``sluice keys`` and ``sluice usage`` against real databases, including bad input (which must leave
nothing behind) and an unreachable database."""

from __future__ import annotations

import argparse
import hashlib

import pytest
import sqlalchemy as sa

from bench.devstack import free_port
from core.db.usage import insert_usage
from core.settings import get_settings
from sluice.accounts_cli import add_accounts_commands
from tests.accounts.helpers import count_rows, usage_record


@pytest.fixture
def sluice(migrated_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # noqa: ANN201
    """Run ``sluice <argv>`` in process against the test database; returns (status, stdout, stderr)."""
    monkeypatch.setenv("SLUICE_DATABASE_URL", migrated_url)
    get_settings.cache_clear()
    parser = argparse.ArgumentParser(prog="sluice")
    add_accounts_commands(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        args = parser.parse_args(list(argv))
        status = args.func(args)
        out, err = capsys.readouterr()
        return status, out, " ".join(err.split())

    yield run
    get_settings.cache_clear()


def rows(url: str) -> list[dict]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return [dict(r._mapping) for r in connection.execute(sa.text("SELECT * FROM api_keys ORDER BY name"))]
    finally:
        engine.dispose()


def test_create_prints_the_key_once_and_stores_only_its_hash(sluice, migrated_url: str) -> None:  # noqa: ANN001
    status, out, err = sluice("keys", "create", "--name", "ci", "--models", "smollm2, org/model-1.5b", "--rpm", "60",
                              "--tpm", "1000")
    assert status == 0
    key = out.strip()
    assert key.startswith("sk-sluice-") and "\n" not in key
    key_id, secret = key.removeprefix("sk-sluice-").split("-", 1)
    assert f"Created key {key_id} (ci)" in err and secret not in err
    [row] = rows(migrated_url)
    assert row["id"] == key_id and row["secret_sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in repr(row)
    assert (row["rpm"], row["tpm"], bool(row["is_admin"])) == (60, 1000, False)
    status, out, _ = sluice("keys", "list")
    assert status == 0 and key_id in out and "smollm2" in out and secret not in out


def test_list_and_revoke(sluice) -> None:  # noqa: ANN001
    ids = {name: sluice("keys", "create", "--name", name, *extra)[1].strip()[10:22]
           for name, extra in (("alice", ["--admin"]), ("bob", []), ("carol", []))}
    assert sluice("keys", "revoke", ids["bob"])[0] == 0
    assert sluice("keys", "revoke", "carol")[0] == 0  # by name, when only one active key has it
    status, out, _ = sluice("keys", "list")
    assert ids["alice"] in out and ids["bob"] not in out and ids["carol"] not in out
    status, out, _ = sluice("keys", "list", "--all")
    assert all(key_id in out for key_id in ids.values())
    status, _, err = sluice("keys", "revoke", ids["bob"])
    assert status == 0 and "already revoked" in err


def test_revoke_refuses_unknown_and_ambiguous_keys(sluice, migrated_url: str) -> None:  # noqa: ANN001
    first = sluice("keys", "create", "--name", "twin")[1].strip()[10:22]
    second = sluice("keys", "create", "--name", "twin")[1].strip()[10:22]
    status, _, err = sluice("keys", "revoke", "twin")
    assert status == 1 and first in err and second in err and "by id" in err
    status, _, err = sluice("keys", "revoke", "0123456789ab")
    assert status == 1 and "no API key" in err
    status, _, err = sluice("keys", "revoke", "sk-sluice-bogus")
    assert status == 1 and "no API key" in err
    assert all(r["revoked_at"] is None for r in rows(migrated_url))


@pytest.mark.parametrize(("argv", "message"), [
    (["--rpm", "-5"], "--rpm: must be a positive integer, not -5"),
    (["--rpm", "0"], "--rpm: must be a positive integer, not 0"),
    (["--tpm", "-1"], "--tpm: must be a positive integer, not -1"),
    (["--models", "good,bad model"], "'bad model' is not a valid model name"),
    (["--models", "a,,b"], "'' is not a valid model name"),
    (["--models", ""], "'' is not a valid model name"),
    (["--models=-leading-dash"], "'-leading-dash' is not a valid model name"),
    (["--models", "x" * 129], "is not a valid model name"),
    (["--name", "   "], "--name: '' is not a valid key name"),
    (["--name", "tab\there"], "is not a valid key name"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(sluice, migrated_url: str, argv: list[str],  # noqa: ANN001
                                                       message: str) -> None:
    base = ["keys", "create", "--name", "k"]
    if "--name" in argv:
        base = ["keys", "create"]
    status, out, err = sluice(*base, *argv)
    assert status == 2 and out == "" and message in err, err
    assert rows(migrated_url) == []


def test_model_names_are_checked_for_shape_only(sluice, migrated_url: str) -> None:  # noqa: ANN001
    """Served models are known only at run time: a well-formed name that nothing serves is accepted."""
    status, _, _ = sluice("keys", "create", "--name", "future", "--models", "not-deployed-yet,org/Model:v2,a,a")
    assert status == 0
    assert rows(migrated_url)[0]["models"] in (["not-deployed-yet", "org/Model:v2", "a"],
                                                '["not-deployed-yet", "org/Model:v2", "a"]')


def test_usage_summary(sluice, migrated_url: str) -> None:  # noqa: ANN001
    key_id = sluice("keys", "create", "--name", "team")[1].strip()[10:22]
    other = sluice("keys", "create", "--name", "other")[1].strip()[10:22]
    from core.db.engine import create_db_engine

    engine = create_db_engine(migrated_url)
    records = [usage_record(i, key_id=key_id) for i in range(5)] + [usage_record(i, key_id=other, run="o")
                                                                    for i in range(3)]
    assert insert_usage(engine, records) == 8
    engine.dispose()
    status, out, _ = sluice("usage", "--key", "team", "--since", "1d")
    prompt = sum(r.prompt_tokens for r in records[:5])
    completion = sum(r.completion_tokens for r in records[:5])
    assert status == 0 and key_id in out and other not in out
    [line] = [line for line in out.splitlines() if key_id in line]
    cells = [cell.strip() for cell in line.split("│")]
    assert cells[4:9] == [str(n) for n in (5, 1, prompt, sum(r.cached_tokens for r in records[:5]), completion)]
    status, out, _ = sluice("usage")
    assert status == 0 and key_id in out and other in out and "total" in out
    status, _, err = sluice("usage", "--since", "soon")
    assert status == 2 and "--since" in err
    status, _, err = sluice("usage", "--key", "nobody")
    assert status == 1 and "no API key" in err


def test_unreachable_database_is_one_clear_line(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLUICE_DATABASE_URL", f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/nowhere")
    get_settings.cache_clear()
    try:
        parser = argparse.ArgumentParser(prog="sluice")
        add_accounts_commands(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(["keys", "create", "--name", "x"])
        assert args.func(args) == 1
    finally:
        get_settings.cache_clear()
    out, err = capsys.readouterr()
    assert out == "" and "the database cannot be used" in err and "Traceback" not in err


def test_usage_rows_are_counted_once(migrated_url: str) -> None:
    from core.db.engine import create_db_engine

    engine = create_db_engine(migrated_url)
    batch = [usage_record(i) for i in range(10)]
    assert insert_usage(engine, batch) == 10
    assert insert_usage(engine, batch[5:] + [usage_record(10)]) == 1
    engine.dispose()
    assert count_rows(migrated_url) == 11
