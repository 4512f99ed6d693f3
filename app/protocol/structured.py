"""Structured-output request fields: OpenAI's ``response_format`` and vLLM's ``structured_outputs``
and ``guided_*`` extensions (turned into one core.messages.StructuredOutput by app.output.structured)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.protocol.fields import Flag, NonEmptyText, Text


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: Flag | None = None


class ResponseFormat(BaseModel):
    """``{"type": "text"}``, ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {...}}``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(BaseModel):
    """vLLM's ``structured_outputs``: exactly one constraint."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: NonEmptyText | None = None
    choice: Annotated[list[NonEmptyText], Field(min_length=1)] | None = None
    grammar: NonEmptyText | None = None
    json_object: Flag | None = None
