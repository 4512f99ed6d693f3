"""The usage batch message (core.accounting): what the frontend ships and the bookkeeper reads."""

from __future__ import annotations

import json

import pytest

from core.accounting import usage_batch_from_builtins, usage_batch_to_builtins
from tests.accounts.helpers import usage_record


def test_a_batch_survives_json() -> None:
    batch = [usage_record(i, key_id=None if i % 2 else "0123456789ab") for i in range(5)]
    assert usage_batch_from_builtins(json.loads(json.dumps(usage_batch_to_builtins(batch)))) == batch


@pytest.mark.parametrize("mangle", [
    lambda r: {**r, "v": 2},
    lambda r: {k: v for k, v in r.items() if k != "request_id"},
    lambda r: {**r, "prompt_tokens": "many"},
])
def test_unknown_versions_and_malformed_records_are_refused(mangle) -> None:  # noqa: ANN001
    [record] = usage_batch_to_builtins([usage_record(0)])
    with pytest.raises(ValueError):
        usage_batch_from_builtins([mangle(record)])
