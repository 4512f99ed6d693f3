"""A schema fuzz run of the HTTP API (schemathesis, from the frontend's own ``/openapi.json``) against a
live mocker stack: every operation, valid and invalid inputs, at least 1,000 cases in all. No case
may get a 5xx, every answer must be one the document declares (status, headers, content type,
schema), and every error body is OpenAI-shaped.

The workers' timing model runs fast (``SPEEDUP``) so a generated ``max_tokens`` near the context
costs milliseconds, not minutes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.main import create_app
from bench.devstack import Stack
from tests.chaos.support import own_stack

MODEL = "smollm2"
#: Examples per operation; the chat and completion operations, whose inputs are the richest, get more.
EXAMPLES = 30
EXAMPLES_GENERATE = 300
MIN_CASES = 1000
CHECKS = (not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection)

#: Cases run per operation, for the total checked at the end.
_cases: Counter[str] = Counter()
#: Answers per operation and status, printed at the end (``-s``) to see what the run reached.
_statuses: Counter[tuple[str, int]] = Counter()


@pytest.fixture(scope="module")
def fuzz_stack(redis_server, tokenizer_dir) -> Iterator[Stack]:  # noqa: ANN001
    with own_stack(redis_server.url, tokenizer_dir, workers=("w1",), SLUICE_WORKER__MOCKER__SPEEDUP="1000") as s:
        yield s


#: The document the frontend serves (built by the same code, in this process, so that the cases can be
#: listed when the tests are collected); the test below checks it is what the live frontend serves.
SCHEMA = schemathesis.openapi.from_dict(create_app().openapi())
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}
#: The richest operations get more examples.
_GENERATE = ("POST /v1/chat/completions", "POST /v1/completions")


def assert_openai_error(response) -> None:  # noqa: ANN001
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str), error


def _served_model(cases: st.SearchStrategy) -> st.SearchStrategy:
    """Cases whose body names a model, three in four of them with the served one: a random name only
    ever reaches the 404, never the router or a worker."""

    def name_it(pair) -> object:  # noqa: ANN001
        case, served = pair
        if served and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = MODEL
        return case

    return st.tuples(cases, st.sampled_from([True, True, True, False])).map(name_it)


def _check(case, base_url: str) -> None:  # noqa: ANN001
    _cases[case.operation.label] += 1
    response = case.call(base_url=base_url, timeout=30)
    _statuses[(case.operation.label, response.status_code)] += 1
    case.validate_response(response, checks=CHECKS)
    assert response.status_code < 500, response.text
    if response.status_code >= 400 and case.operation.path != "/ready":
        assert_openai_error(response)
    if response.status_code in (429, 503):
        assert response.headers.get("retry-after"), response.headers


def test_the_live_frontend_serves_the_fuzzed_document(fuzz_stack: Stack) -> None:
    assert httpx.get(f"{fuzz_stack.base_url}/openapi.json", timeout=10).json() == SCHEMA.raw_schema


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_every_operation_answers_within_its_contract(label: str, mode: GenerationMode, fuzz_stack: Stack) -> None:
    operation = OPERATIONS[label]

    cases = operation.as_strategy(generation_mode=mode)
    # A negative case's invalid part may be its model: that stays as generated.

    @given(case=_served_model(cases) if mode is GenerationMode.POSITIVE else cases)
    @settings(max_examples=EXAMPLES_GENERATE if label in _GENERATE else EXAMPLES, deadline=None,
              derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    def run(case) -> None:  # noqa: ANN001
        _check(case, fuzz_stack.base_url)

    try:
        run()
    except Unsatisfiable:
        if mode is GenerationMode.NEGATIVE:
            pytest.skip(f"{label} takes no input that its schema could rule out")
        raise


def test_the_run_covered_at_least_a_thousand_cases() -> None:
    print(*(f"{label} -> {status}: {n}" for (label, status), n in sorted(_statuses.items())), sep="\n")
    assert sum(_cases.values()) >= MIN_CASES, dict(_cases)
