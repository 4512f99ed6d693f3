"""The admin and usage routers over HTTP, mounted on a small FastAPI app with the frontend's error
handlers and a runtime object carrying a real Accounts service (real Redis, real SQLite)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI

from app.accounts.schemas import KeyCreate, KeyCreated
from app.accounts.service import Accounts
from app.accounts.store import KeyStore
from app.api import chat as chat_api
from app.api import completions as completions_api
from app.api import keys as keys_api
from app.api import usage as usage_api
from core.db import open_database
from core.db.usage import insert_usage
from core.http_errors import install_error_handlers
from tests.accounts.helpers import usage_record


def make_app(accounts: Accounts) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(keys_api.router)
    app.include_router(usage_api.router)
    app.include_router(chat_api.router)
    app.include_router(completions_api.router)
    app.state.runtime = SimpleNamespace(accounts=accounts, settings=accounts.settings)
    return app


@pytest.fixture
async def http(accounts: Accounts) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=make_app(accounts))
    async with httpx.AsyncClient(transport=transport, base_url="http://sluice") as client:
        yield client


def store(accounts: Accounts) -> KeyStore:
    return KeyStore(open_database(accounts.settings.database_url))


def auth(key: KeyCreated | str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key if isinstance(key, str) else key.key}"}


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    return body["error"]


async def test_admin_routes_need_an_admin_key(http: httpx.AsyncClient, accounts: Accounts) -> None:
    user = store(accounts).create(KeyCreate(name="user"))
    response = await http.get("/v1/admin/keys")
    assert response.status_code == 401 and error_of(response)["code"] == "invalid_api_key"
    response = await http.post("/v1/admin/keys", json={"name": "x", "rpm": -1}, headers=auth("sk-sluice-forged"))
    assert response.status_code == 401  # authentication comes before reading the body
    response = await http.get("/v1/admin/keys", headers=auth(user))
    assert response.status_code == 403 and error_of(response)["code"] == "admin_key_required"
    assert store(accounts).list_keys() == [store(accounts).info(user.id)]


MISSING_KEY = "You didn't provide an API key. Pass it in the Authorization header: 'Authorization: Bearer sk-sluice-...'."
INFERENCE = [("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
             ("/v1/completions", {"model": "m", "prompt": "hi"})]


@pytest.mark.parametrize(("path", "body"), INFERENCE)
async def test_inference_routes_authenticate_before_anything_else(http: httpx.AsyncClient, accounts: Accounts,
                                                                  path: str, body: dict) -> None:
    response = await http.post(path, json=body)
    assert response.status_code == 401 and error_of(response) == {
        "message": MISSING_KEY, "type": "authentication_error", "param": None, "code": "invalid_api_key"}
    response = await http.post(path, json={"model": ""}, headers=auth("sk-sluice-forged"))
    assert response.status_code == 401 and error_of(response)["message"] == "Incorrect API key provided."
    # (authentication comes before reading the body, as on the admin routes)
    user = store(accounts).create(KeyCreate(name="user"))
    store(accounts).revoke(user.id)
    response = await http.post(path, json=body, headers=auth(user))
    assert response.status_code == 401 and error_of(response)["message"] == "This API key has been revoked."
    allowed = store(accounts).create(KeyCreate(name="allowed"))
    response = await http.post(path, json={**body, "n": 17}, headers=auth(allowed))
    assert response.status_code == 400 and error_of(response)["param"] == "n"  # past auth: the handler checks


async def test_an_admin_manages_keys_over_http(http: httpx.AsyncClient, accounts: Accounts) -> None:
    admin = store(accounts).create(KeyCreate(name="root", admin=True))
    response = await http.post("/v1/admin/keys", headers=auth(admin),
                               json={"name": "svc", "models": ["smollm2"], "rpm": 10, "tpm": 1000})
    assert response.status_code == 201
    created = response.json()
    assert created["key"].startswith(f"sk-sluice-{created['id']}-")
    assert (created["models"], created["rpm"], created["tpm"], created["admin"]) == (["smollm2"], 10, 1000, False)
    assert (await accounts.authenticate(f"Bearer {created['key']}")).key_id == created["id"]

    listed = (await http.get("/v1/admin/keys", headers=auth(admin))).json()
    assert listed["object"] == "list" and {k["id"] for k in listed["data"]} == {admin.id, created["id"]}
    assert all("key" not in k and "secret_sha256" not in k for k in listed["data"])

    response = await http.delete(f"/v1/admin/keys/{created['id']}", headers=auth(admin))
    assert response.status_code == 200 and response.json()["revoked_at"] is not None
    response = await http.get("/v1/usage", headers=auth(created["key"]))
    assert response.status_code == 401  # revoked through this frontend: refused at once
    listed = (await http.get("/v1/admin/keys", headers=auth(admin))).json()
    assert [k["id"] for k in listed["data"]] == [admin.id]
    listed = (await http.get("/v1/admin/keys?include_revoked=true", headers=auth(admin))).json()
    assert len(listed["data"]) == 2
    assert (await http.get(f"/v1/admin/keys/{created['id']}", headers=auth(admin))).json()["revoked_at"]


@pytest.mark.parametrize(("body", "param"), [
    ({"name": "x", "rpm": -1}, "rpm"), ({"name": "x", "tpm": 0}, "tpm"), ({"name": "x", "models": []}, "models"),
    ({"name": "x", "models": ["bad name"]}, "models"), ({"name": ""}, "name"), ({}, "name"),
    ({"name": "x", "unknown": 1}, "unknown"), ({"name": "x", "rpm": 2**31}, "rpm"), ({"name": "x", "tpm": 2**70}, "tpm"),
])
async def test_bad_key_specs_are_400_and_create_nothing(http: httpx.AsyncClient, accounts: Accounts, body: dict,
                                                        param: str) -> None:
    admin = store(accounts).create(KeyCreate(name="root", admin=True))
    response = await http.post("/v1/admin/keys", headers=auth(admin), json=body)
    assert response.status_code == 400 and error_of(response)["param"].startswith(param)
    assert [k.id for k in store(accounts).list_keys(include_revoked=True)] == [admin.id]


async def test_revoking_an_unknown_key_is_404(http: httpx.AsyncClient, accounts: Accounts) -> None:
    admin = store(accounts).create(KeyCreate(name="root", admin=True))
    response = await http.delete("/v1/admin/keys/0123456789ab", headers=auth(admin))
    assert response.status_code == 404 and error_of(response)["code"] == "key_not_found"


async def test_usage_is_per_calling_key_and_admins_may_name_one(http: httpx.AsyncClient, accounts: Accounts) -> None:
    admin = store(accounts).create(KeyCreate(name="root", admin=True))
    alice, bob = store(accounts).create(KeyCreate(name="alice")), store(accounts).create(KeyCreate(name="bob"))
    records = [usage_record(i, key_id=alice.id, model="m1" if i % 2 else "m2") for i in range(6)]
    insert_usage(open_database(accounts.settings.database_url), records + [usage_record(9, key_id=bob.id, run="b")])

    report = (await http.get("/v1/usage?since=2h", headers=auth(alice))).json()
    assert report["key_id"] == alice.id and [m["model"] for m in report["data"]] == ["m1", "m2"]
    m1 = report["data"][0]
    assert list(m1) == ["key_id", "model", "requests", "errors", "prompt_tokens", "cached_tokens",
                        "completion_tokens", "mean_ttft_s", "mean_total_s"]  # the row's shape on the wire
    assert m1["requests"] == 3 and m1["prompt_tokens"] == sum(r.prompt_tokens for r in records if r.model == "m1")
    response = await http.get(f"/v1/usage?key_id={alice.id}", headers=auth(bob))
    assert response.status_code == 403
    report = (await http.get(f"/v1/usage?key_id={alice.id}", headers=auth(admin))).json()
    assert report["key_id"] == alice.id and sum(m["requests"] for m in report["data"]) == 6
    assert (await http.get("/v1/usage", headers=auth(admin))).json()["data"] == []
    for since in ("tomorrow", "99999999999d", "999999d"):  # the last two: before the year 1
        response = await http.get(f"/v1/usage?since={since}", headers=auth(alice))
        assert response.status_code == 400 and error_of(response)["param"] == "since"
    assert (await http.get("/v1/usage")).status_code == 401


async def test_with_auth_off_key_management_over_http_is_refused(accounts: Accounts) -> None:
    accounts.settings = accounts.settings.model_copy(update={"auth": False})
    transport = httpx.ASGITransport(app=make_app(accounts))
    async with httpx.AsyncClient(transport=transport, base_url="http://sluice") as http:
        response = await http.post("/v1/admin/keys", json={"name": "sneaky", "admin": True})
        assert response.status_code == 403 and error_of(response)["code"] == "auth_disabled"
        report = (await http.get("/v1/usage")).json()
        assert report["key_id"] is None and report["data"] == []
    assert store(accounts).list_keys() == []
