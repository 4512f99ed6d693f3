"""Celery task messages built by hand (core/wire.py): pure checks. The comparison with the message
Celery itself builds is tests/integration/test_wire_celery.py."""

from __future__ import annotations

import base64
import json

from core.wire import task_message, task_message_parts


def test_parts_around_the_queue_make_the_whole_message() -> None:
    args = [{"request_id": "r1", "token_ids": [1, 2, 3], "note": "quotes \" and \\ and \x1f survive"}]
    parts = task_message_parts("sluice.generate", args, task_id="r1", argsrepr="request r1")
    whole = parts.for_queue("sluice.ns.worker.w7")
    envelope = json.loads(whole)
    assert envelope["properties"]["delivery_info"] == {"exchange": "", "routing_key": "sluice.ns.worker.w7"}
    assert envelope["headers"]["id"] == "r1" and envelope["headers"]["task"] == "sluice.generate"
    assert json.loads(base64.b64decode(envelope["body"]))[0] == args
    # Everything but the per-message delivery tag matches the message built for that queue directly.
    direct = json.loads(task_message("sluice.generate", args, "sluice.ns.worker.w7", task_id="r1",
                                     argsrepr="request r1"))
    for e in (envelope, direct):
        e["properties"].pop("delivery_tag")
    assert envelope == direct
