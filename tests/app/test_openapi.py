"""``/openapi.json`` (app.api.openapi): the API routes list their error statuses with OpenAI's error
body, whose schema is the one the error encoder writes; no route claims a 422."""

from __future__ import annotations

import json

import httpx
import pytest

from app.main import create_app
from core.http_errors import error_body


@pytest.fixture(scope="module")
async def document() -> dict:
    app = create_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sluice") as client:
        return (await client.get("/openapi.json")).json()


@pytest.mark.parametrize(("method", "path", "statuses"), [
    ("post", "/v1/chat/completions", {400, 401, 403, 404, 413, 429, 502, 503}),
    ("post", "/v1/completions", {400, 401, 403, 404, 413, 429, 502, 503}),
    ("post", "/v1/admin/keys", {400, 401, 403, 413}),
    ("delete", "/v1/admin/keys/{key_id}", {401, 403, 404}),
    ("get", "/v1/usage", {400, 401, 403}),
])
def test_api_routes_list_their_errors_with_the_error_body(document: dict, method: str, path: str,
                                                          statuses: set[int]) -> None:
    responses = document["paths"][path][method]["responses"]
    errors = {int(s) for s in responses if s[0] in "45"}
    assert errors == statuses
    for status in errors:
        assert responses[str(status)]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"}
    for status in errors & {429, 503}:
        assert "Retry-After" in responses[str(status)]["headers"]


def test_no_route_claims_fastapis_422(document: dict) -> None:
    assert not [path for path, ops in document["paths"].items() for op in ops.values() if "422" in op["responses"]]
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_the_documented_error_body_is_the_one_sent(document: dict) -> None:
    schemas = document["components"]["schemas"]
    sent = json.loads(error_body("m", "invalid_request_error", "p", "c"))
    assert set(sent) == set(schemas["ErrorBody"]["properties"]) == set(schemas["ErrorBody"]["required"])
    assert schemas["ErrorBody"]["properties"]["error"] == {"$ref": "#/components/schemas/ErrorDetail"}
    assert set(sent["error"]) == set(schemas["ErrorDetail"]["properties"])
