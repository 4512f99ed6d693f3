"""Accounts through HTTP on the stack as a user runs it with auth on: ``sluice serve`` + a mocker
``sluice worker`` + ``sluice bookkeeper`` subprocesses, keys made with the ``sluice keys`` command,
usage rows read back from the database the bookkeeper writes (a SQLite file of the test's own)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
import sqlalchemy as sa

from bench.devstack import REPO, Stack, wait_until

MODEL = "smollm2"


class AccountsStack:
    """A stack with auth on and the CLI pointed at the same database."""

    def __init__(self, stack: Stack, db_url: str) -> None:
        self.stack = stack
        self.db_url = db_url

    def create_key(self, *args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "sluice", "keys", "create", *args], cwd=REPO,
                             env=self.stack.env(SLUICE_DATABASE_URL=self.db_url), capture_output=True, text=True,
                             timeout=60, check=True)
        return out.stdout.strip().splitlines()[-1]

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.stack.base_url}/v1", api_key=key, max_retries=0, timeout=60)

    def usage_rows(self, request_ids: list[str]) -> dict[str, dict]:
        engine = sa.create_engine(self.db_url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(sa.text("SELECT * FROM usage_records")).mappings().all()
        finally:
            engine.dispose()
        return {row["request_id"]: dict(row) for row in rows if row["request_id"] in request_ids}


@pytest.fixture(scope="module")
def accounts_stack(redis_server, tokenizer_dir, tmp_path_factory) -> Iterator[AccountsStack]:  # noqa: ANN001
    db_url = f"sqlite:///{tmp_path_factory.mktemp('accounts') / 'sluice.db'}"
    stack = Stack(redis_url=redis_server.url, namespace=f"acct{uuid.uuid4().hex[:8]}", model_path=tokenizer_dir,
                  env_extra={"SLUICE_WORKER__MOCKER__NO_SLEEP": "1", "SLUICE_DATABASE_URL": db_url,
                             "SLUICE_ACCOUNTS__USAGE_FLUSH_INTERVAL_S": "0.2"})
    try:
        stack.start_worker("w1")
        stack._spawn("bookkeeper", ["bookkeeper", "--log-level", "WARNING"], stack.env())
        stack.start_frontend(SLUICE_AUTH="1")
        stack.wait_ready(MODEL, workers=1)
        yield AccountsStack(stack, db_url)
    finally:
        stack.stop()


def test_open_endpoints_need_no_key(accounts_stack: AccountsStack) -> None:
    base = accounts_stack.stack.base_url
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(base + path, timeout=10).status_code == 200, path


@pytest.mark.parametrize("authorization", [None, "Bearer not-a-key", "Basic abc",
                                           "Bearer sk-sluice-000000000000-" + "x" * 43])
def test_a_missing_or_wrong_key_is_401(accounts_stack: AccountsStack, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    r = httpx.post(f"{accounts_stack.stack.base_url}/v1/completions", headers=headers, timeout=30,
                   json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 401
    assert set(r.json()["error"]) >= {"message", "type", "param", "code"}


def test_the_openai_client_sees_a_wrong_key_as_an_authentication_error(accounts_stack: AccountsStack) -> None:
    with pytest.raises(openai.AuthenticationError):
        accounts_stack.client("sk-wrong").completions.create(model=MODEL, prompt="hi", max_tokens=2)


def test_a_model_the_key_may_not_use_is_403(accounts_stack: AccountsStack) -> None:
    key = accounts_stack.create_key("--name", "other-model", "--models", "some-other-model")
    with pytest.raises(openai.PermissionDeniedError) as info:
        accounts_stack.client(key).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert info.value.status_code == 403


def test_a_burst_over_the_request_rate_gets_429s_and_nothing_else(accounts_stack: AccountsStack) -> None:
    key = accounts_stack.create_key("--name", "slow", "--rpm", "3")
    statuses, retry_after = [], []
    with httpx.Client(base_url=accounts_stack.stack.base_url, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as http:
        for _ in range(8):
            r = http.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 2})
            statuses.append(r.status_code)
            if r.status_code == 429:
                retry_after.append(int(r.headers["retry-after"]))
                assert r.json()["error"]["type"]
    # A minute window may roll over inside the burst: then a few more are admitted, never anything but 200/429.
    assert set(statuses) <= {200, 429}
    assert 3 <= statuses.count(200) <= 6 and statuses.count(429) >= 2
    assert all(1 <= s <= 60 for s in retry_after)


def test_an_admin_manages_keys_over_http(accounts_stack: AccountsStack) -> None:
    admin = accounts_stack.create_key("--name", "root", "--admin")
    with httpx.Client(base_url=accounts_stack.stack.base_url, timeout=30) as http:
        created = http.post("/v1/admin/keys", json={"name": "made-over-http"}, headers={"Authorization": f"Bearer {admin}"})
        assert created.status_code in (200, 201), created.text
        new = created.json()
        user = {"Authorization": f"Bearer {new['key']}"}
        assert http.post("/v1/admin/keys", json={"name": "nope"}, headers=user).status_code == 403
        # Adapters are an operator's business too: a user key may not load one, an admin's may ask.
        lora = {"lora_name": "x", "lora_path": "/nonexistent"}
        denied = http.post("/v1/load_lora_adapter", json=lora, headers=user)
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "admin_key_required"
        allowed = http.post("/v1/load_lora_adapter", json=lora, headers={"Authorization": f"Bearer {admin}"})
        assert allowed.status_code == 400 and allowed.json()["error"]["code"] == "lora_not_found", allowed.text
        ok = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, headers=user)
        assert ok.status_code == 200
        revoked = http.delete(f"/v1/admin/keys/{new['id']}", headers={"Authorization": f"Bearer {admin}"})
        assert revoked.status_code == 200 and revoked.json()["revoked_at"]
        again = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, headers=user)
        assert again.status_code == 401


def test_usage_rows_match_the_responses_usage(accounts_stack: AccountsStack) -> None:
    key = accounts_stack.create_key("--name", "metered")
    client = accounts_stack.client(key)
    expected: dict[str, tuple[int, int, int, str]] = {}
    for i in range(3):
        r = client.completions.create(model=MODEL, prompt=f"count {i} " * (i + 3), max_tokens=5 + i, seed=i)
        expected[r.id.removeprefix("cmpl-")] = (r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens
                                                if r.usage.prompt_tokens_details else 0,
                                                r.usage.completion_tokens, r.choices[0].finish_reason)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "stream me"}],
                                            max_tokens=6, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    usage = chunks[-1].usage
    finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    expected[chunks[-1].id.removeprefix("chatcmpl-")] = (
        usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0,
        usage.completion_tokens, finish)

    ids = list(expected)
    wait_until(lambda: len(accounts_stack.usage_rows(ids)) == len(ids), 30, "the usage rows", interval=0.2)
    rows = accounts_stack.usage_rows(ids)
    for request_id, (prompt, cached, completion, finish_reason) in expected.items():
        row = rows[request_id]
        assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"], row["finish_reason"]) == (
            prompt, cached, completion, finish_reason)
        assert row["model"] == MODEL and row["worker_ids"] and row["error_type"] is None
        assert row["total_s"] >= row["ttft_s"] > 0

    report = httpx.get(f"{accounts_stack.stack.base_url}/v1/usage", headers={"Authorization": f"Bearer {key}"},
                       timeout=30).json()
    (line,) = report["data"]
    assert line["requests"] == len(expected)
    assert line["prompt_tokens"] == sum(v[0] for v in expected.values())
    assert line["completion_tokens"] == sum(v[2] for v in expected.values())
