"""Chat messages as the chat template gets them, tools included.

A template that renders tools itself (it reads ``tools``: Hermes, Qwen, Llama 3.1+ and most recent
templates) gets them as vLLM hands them over: ``tools`` beside the messages, an assistant
message's ``tool_calls`` with their arguments as objects, a ``tool`` message's ``tool_call_id``.
A template that does not (the default model's plain ChatML) would drop them silently, so they are
written into the messages instead, in the format the model's tool-call parser reads
(app.output.chat): the tool list and how to call one in the system message, earlier calls in the
assistant's text, and tool results in ``<tool_response>`` blocks of a user message.
"""

from __future__ import annotations

import json
from typing import Any

from app.protocol.chat import ChatMessage, message_text

_HOW_TO_CALL = {
    "hermes": ("To call a function, answer with a <tool_call></tool_call> block per call, each holding a JSON "
               "object with the function's name and its arguments:\n<tool_call>\n"
               '{"name": "<function name>", "arguments": {<arguments>}}\n</tool_call>'),
    "llama3_json": ("To call a function, answer with nothing but a JSON object holding the function's name and "
                    'its arguments: {"name": "<function name>", "parameters": {<arguments>}}. '
                    "Separate several calls with a semicolon."),
    "pythonic": ("To call functions, answer with nothing but a Python list of calls with keyword arguments: "
                 "[function_name(argument=value), other_function(argument=value)]."),
}


def _arguments(text: str) -> Any:
    """A call's arguments as templates expect them: the object when the text is JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The request's messages for a template that renders tools: text content, and the tool fields."""
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m["role"], "content": message_text(m)}
        calls = m.get("tool_calls")
        if calls:
            d["tool_calls"] = [{"id": c["id"], "type": "function",
                                "function": {"name": c["function"]["name"],
                                             "arguments": _arguments(c["function"]["arguments"])}}
                               for c in calls]
        for key in ("tool_call_id", "name"):
            if m.get(key):
                d[key] = m[key]
        out.append(d)
    return out


def _call_text(name: str, arguments: Any, fmt: str) -> str:
    if fmt == "llama3_json":
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
    if fmt == "pythonic":
        args = arguments if isinstance(arguments, dict) else {}
        return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)}\n</tool_call>'


def _calls_text(calls: list[dict[str, Any]], fmt: str) -> str:
    texts = [_call_text(c["function"]["name"], c["function"]["arguments"], fmt) for c in calls]
    if fmt == "llama3_json":
        return "; ".join(texts)
    if fmt == "pythonic":
        return f"[{', '.join(texts)}]"
    return "\n".join(texts)


def tools_instructions(tools: list[dict[str, Any]], fmt: str) -> str:
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("You can call functions to help with the user's request. They are described in JSON Schema "
            f"between <tools> and </tools>:\n<tools>\n{listing}\n</tools>\n\n{_HOW_TO_CALL[fmt]}")


def inline_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, fmt: str) -> list[dict[str, Any]]:
    """``messages`` (from :func:`template_messages`) with the tools and the tool fields written
    into their text, for a template that ignores them; ``fmt`` is the tool-call parser's name."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("tool_calls"):
            text = "\n".join(t for t in (m["content"], _calls_text(m["tool_calls"], fmt)) if t)
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        instructions = tools_instructions(tools, fmt)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": f"{out[0]['content']}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out
