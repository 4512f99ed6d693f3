"""Which tool-call and reasoning parser a model's output goes through (app.output.parsing).

Chosen per model: the deployment names one (``SLUICE_FRONTEND__TOOL_PARSERS``,
``SLUICE_FRONTEND__REASONING_PARSERS``, model name to parser name, ``none`` for no reasoning
parser), else it is read from the model's chat template: a template that writes ``<tool_call>``
speaks Hermes' format, one that writes ``<|python_tag|>`` Llama 3's JSON calls, and a template
without tools (its calls are written by app.prompts.tools) Hermes'. A template that writes
``<think>`` gets the reasoning parser: ``deepseek_r1`` when its generation prompt already opens
the thought (the output starts inside it), else ``think``.
"""

from __future__ import annotations

from app.model_card import ModelCard
from core.settings import FrontendSettings

#: A user turn, to see what a template's generation prompt ends with.
_PROBE = [{"role": "user", "content": "?"}]


def tool_parser_name(card: ModelCard, frontend: FrontendSettings) -> str:
    named = frontend.tool_parsers.get(card.name)
    if named:
        return named
    source = card.template_source
    if "<|python_tag|>" in source and "<tool_call>" not in source:
        return "llama3_json"
    return "hermes"


def reasoning_parser_name(card: ModelCard, frontend: FrontendSettings) -> str | None:
    named = frontend.reasoning_parsers.get(card.name)
    if named:
        return None if named == "none" else named
    if "<think>" not in card.template_source:
        return None
    try:
        opened = card.render_chat(_PROBE).rstrip().endswith("<think>")
    except Exception:  # noqa: BLE001 - a template that cannot render the probe: the plain parser
        opened = False
    return "deepseek_r1" if opened else "think"
