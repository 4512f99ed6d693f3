"""Logs an operator can follow, on the stack as a user runs it with ``SLUICE_LOG_FORMAT=json`` and
auth on: one JSON object per log line from the frontend, the worker and the bookkeeper; one line per
request on the frontend (id, model, worker, status, tokens, TTFT, total); the same request id on the
worker's lines; and neither the API key nor the database password in any line."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import orjson
import pytest
import sqlalchemy as sa

from app.accounts.apikey import parse_key
from bench.devstack import REPO, Stack, wait_until
from core.db.migrate import upgrade
from tests.accounts.helpers import ScratchPostgres, postgres_unreachable_reason

MODEL = "smollm2"
PASSWORD = f"pw-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def database_url(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    """A PostgreSQL database whose URL carries a password (the server trusts local connections, so
    any password works), or a SQLite file where no server answers."""
    if postgres_unreachable_reason():
        yield f"sqlite:///{tmp_path_factory.mktemp('logs') / 'sluice.db'}"
        return
    db = ScratchPostgres().create()
    url = sa.make_url(db.url).set(password=PASSWORD).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        db.drop()


@pytest.fixture(scope="module")
def logged_stack(redis_server, tokenizer_dir, database_url: str) -> Iterator[Stack]:  # noqa: ANN001
    if database_url.startswith("sqlite"):
        upgrade(database_url)
    s = Stack(redis_url=redis_server.url, namespace=f"logs{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
              env_extra={"SLUICE_WORKER__MOCKER__NO_SLEEP": "1", "SLUICE_DATABASE_URL": database_url,
                         "SLUICE_LOG_FORMAT": "json", "SLUICE_ACCOUNTS__USAGE_FLUSH_INTERVAL_S": "0.2"})
    try:
        s._spawn("w1", ["worker", "--name", "w1", "--log-level", "info"], s.env())
        s._spawn("bookkeeper", ["bookkeeper", "--log-level", "info"], s.env())
        s._spawn("frontend", ["serve", "--port", str(s.port), "--log-level", "info"], s.env(SLUICE_AUTH="1"))
        s.wait_ready(MODEL, workers=1)
        yield s
    finally:
        s.stop()


def _log_lines(s: Stack, name: str) -> list[str]:
    return [line for line in s.procs[name].log.read_text(errors="replace").splitlines() if line.strip()]


def _records(s: Stack, name: str) -> list[dict]:
    return [orjson.loads(line) for line in _log_lines(s, name) if line.startswith("{")]


def test_json_lines_follow_a_request_and_hold_no_secret(logged_stack: Stack, database_url: str) -> None:
    s = logged_stack
    key = subprocess.run([sys.executable, "-m", "sluice", "keys", "create", "--name", "logs"], cwd=REPO,
                         env=s.env(), capture_output=True, text=True, timeout=60, check=True).stdout.split()[-1]
    auth = {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8,
            "user": "end-user-42"}
    ok = httpx.post(f"{s.base_url}/v1/chat/completions", json=body, headers=auth, timeout=30)
    assert ok.status_code == 200, ok.text
    request_id = ok.json()["id"].removeprefix("chatcmpl-")
    wrong = httpx.post(f"{s.base_url}/v1/chat/completions", json=body, timeout=30,
                       headers={"Authorization": f"Bearer {key[:-4]}XXXX"})
    assert wrong.status_code == 401

    def request_line() -> dict | None:
        return next((r for r in _records(s, "frontend")
                     if r["logger"] == "sluice.requests" and r["request_id"] == request_id), None)

    wait_until(lambda: request_line() is not None, 10, "the frontend's line for the request")
    line = request_line()
    assert line["model"] == MODEL and line["workers"] == ["w1"] and line["status"] in ("stop", "length"), line
    assert line["completion_tokens"] > 0 and line["prompt_tokens"] > 0 and 0 < line["ttft_s"] <= line["total_s"]
    assert line["transferred_tokens"] == 0  # one aggregated worker: the prompt computed where it was served
    assert line["key_id"] and line["key_id"] in key and line["user"] == "end-user-42"
    wait_until(lambda: any(r["request_id"] == request_id for r in _records(s, "w1")), 10,
               "the worker's lines for the request")
    worker_lines = [r for r in _records(s, "w1") if r["request_id"] == request_id]
    assert {r["level"] for r in worker_lines} <= {"info", "debug"} and len(worker_lines) >= 2

    presented = parse_key(key)
    assert presented is not None, key
    secret = presented.secret  # may itself hold "-": URL-safe base64
    for name in ("frontend", "w1", "bookkeeper"):
        lines = _log_lines(s, name)
        assert lines, f"{name} logged nothing"
        for text in lines:
            assert secret not in text and secret[:-4] not in text, f"{name} logged the API key: {text}"
            assert PASSWORD not in text, f"{name} logged the database password: {text}"
        not_json = [text for text in lines if not text.startswith("{")]
        assert not not_json, f"{name} wrote lines that are not JSON: {not_json[:5]}"
