"""A request's output constraint, from whichever field names it: OpenAI's ``response_format``
(``json_object``, ``json_schema``), vLLM's ``structured_outputs`` or its older ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``, or a chat's ``tool_choice`` ``required`` or
named (app.output.tool_choice). At most one may be given. Engines that
constrain output say so (core.messages.STRUCTURED_OUTPUTS); a request for one that the model's
workers cannot honour is a 400 naming their engine, never a silently free-form answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from app.output.tool_choice import tool_constraint
from app.protocol.chat import ChatCompletionRequest
from app.protocol.common import SamplingFields
from app.protocol.structured import ResponseFormat
from core.errors import InvalidRequest
from core.messages import STRUCTURED_OUTPUTS, StructuredOutput
from router.registry import LiveWorker


def _schema_text(schema: dict[str, Any] | str, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = orjson.loads(schema)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"the JSON schema is not JSON: {exc}", param=param) from None
    if not isinstance(schema, dict):
        raise InvalidRequest("a JSON schema must be a JSON object", param=param)
    return orjson.dumps(schema).decode()


def structured_from(body: SamplingFields) -> StructuredOutput | None:
    found: list[tuple[str, StructuredOutput]] = []
    if isinstance(body, ChatCompletionRequest):
        tools = tool_constraint(body)
        if tools is not None:
            found.append(("tool_choice", tools))
    response_format: ResponseFormat | None = getattr(body, "response_format", None)
    if response_format is not None and response_format.type == "json_object":
        found.append(("response_format", StructuredOutput(json_object=True)))
    elif response_format is not None and response_format.type == "json_schema":
        spec = response_format.json_schema
        if spec is None or spec.schema_ is None:
            raise InvalidRequest("response_format json_schema needs json_schema.schema", param="response_format")
        found.append(("response_format", StructuredOutput(json=_schema_text(spec.schema_, "response_format"))))
    so = body.structured_outputs
    if so is not None:
        given = [StructuredOutput(json=_schema_text(so.json_, "structured_outputs"))] if so.json_ is not None else []
        given += [StructuredOutput(regex=so.regex)] if so.regex else []
        given += [StructuredOutput(choice=tuple(so.choice))] if so.choice else []
        given += [StructuredOutput(grammar=so.grammar)] if so.grammar else []
        given += [StructuredOutput(json_object=True)] if so.json_object else []
        if len(given) != 1:
            raise InvalidRequest("structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
                                 param="structured_outputs")
        found.append(("structured_outputs", given[0]))
    if body.guided_json is not None:
        found.append(("guided_json", StructuredOutput(json=_schema_text(body.guided_json, "guided_json"))))
    if body.guided_regex:
        found.append(("guided_regex", StructuredOutput(regex=body.guided_regex)))
    if body.guided_choice:
        found.append(("guided_choice", StructuredOutput(choice=tuple(body.guided_choice))))
    if body.guided_grammar:
        found.append(("guided_grammar", StructuredOutput(grammar=body.guided_grammar)))
    if len(found) > 1:
        raise InvalidRequest(f"only one output constraint per request: got {', '.join(n for n, _ in found)}",
                             param=found[1][0])
    return found[0][1] if found else None


def check_engines(structured: StructuredOutput | None, workers: Sequence[LiveWorker], param: str) -> None:
    """A 400 when the model's workers cannot honour the constraint."""
    if structured is None:
        return
    lacking = sorted({w.record.engine for w in workers if not w.record.supports(STRUCTURED_OUTPUTS)})
    if lacking:
        raise InvalidRequest(f"engine {', '.join(lacking)} cannot constrain its output (structured outputs); "
                             "this model's workers would answer free-form", param=param,
                             code="unsupported_by_engine")


def constraint_param(body: SamplingFields) -> str:
    """The field that named the request's constraint, for errors."""
    if isinstance(body, ChatCompletionRequest) and tool_constraint(body) is not None:
        return "tool_choice"
    for name in ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                 "guided_grammar"):
        value = getattr(body, name, None)
        if value is not None and not (name == "response_format" and value.type == "text"):
            return name
    return "response_format"
