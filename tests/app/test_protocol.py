"""The request schemas (app.protocol): types are strict, integers bounded, text valid Unicode, and
each error names the field at fault (its pydantic location, which becomes the error's ``param``)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from app.protocol.chat import ChatCompletionRequest, message_text
from app.protocol.completions import CompletionRequest
from app.protocol.fields import valid_unicode

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def error_loc(model: type[BaseModel], body: dict[str, Any]) -> tuple:
    """The location of the (first) error ``body`` gives."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return info.value.errors()[0]["loc"]


def test_valid_unicode_names_the_lone_surrogate() -> None:
    assert valid_unicode("plain") == "plain" and valid_unicode("été 😀") == "été 😀"
    with pytest.raises(ValueError, match="U\\+D800 at character 2"):
        valid_unicode("ab\ud800")


@pytest.mark.parametrize(("field", "value"), [
    ("seed", 2**63), ("seed", -(2**63) - 1), ("seed", 2**70),
    ("max_tokens", 2**31), ("max_tokens", 0), ("max_completion_tokens", 2**70), ("min_tokens", 2**31),
    ("min_tokens", -1), ("n", 2**70), ("top_logprobs", 2**70),
])
def test_out_of_range_integers_name_their_field(field: str, value: int) -> None:
    assert error_loc(ChatCompletionRequest, {**CHAT, field: value}) == (field,)


def test_the_integer_ranges_reach_their_bounds() -> None:
    for seed in (2**63 - 1, -(2**63)):
        assert ChatCompletionRequest.model_validate({**CHAT, "seed": seed}).seed == seed
    body = ChatCompletionRequest.model_validate({**CHAT, "stop_token_ids": [0, 2**31 - 1], "max_tokens": 2**31 - 1})
    assert body.stop_token_ids == [0, 2**31 - 1] and body.max_tokens == 2**31 - 1


def test_each_out_of_range_token_id_is_named() -> None:
    assert error_loc(ChatCompletionRequest, {**CHAT, "stop_token_ids": [1, 2**70]}) == ("stop_token_ids", 1)
    assert error_loc(ChatCompletionRequest, {**CHAT, "stop_token_ids": [-1]}) == ("stop_token_ids", 0)
    assert error_loc(CompletionRequest, {**COMPLETION, "prompt": [1, 2, 2**70]}) == ("prompt", "token_ids", 2)
    assert error_loc(CompletionRequest, {**COMPLETION, "prompt": [[1], [2**31]]}) == ("prompt", "token_id_lists",
                                                                                       1, 0)


def test_logit_bias_keys_are_token_ids_and_values_within_100() -> None:
    body = CompletionRequest.model_validate({**COMPLETION, "logit_bias": {"50256": -100, "7": 2.5}})
    assert body.logit_bias == {50256: -100.0, 7: 2.5}
    assert error_loc(CompletionRequest, {**COMPLETION, "logit_bias": {"99999999999": 1}})[:2] == ("logit_bias",
                                                                                                   "99999999999")
    assert error_loc(CompletionRequest, {**COMPLETION, "logit_bias": {"x": 1}})[0] == "logit_bias"
    assert error_loc(CompletionRequest, {**COMPLETION, "logit_bias": {"1": 101}}) == ("logit_bias", "1")


@pytest.mark.parametrize(("field", "value"), [
    ("max_tokens", True), ("max_tokens", "5"), ("max_tokens", 5.0), ("n", 1.0), ("seed", "1"), ("seed", True),
    ("stream", "yes"), ("stream", 1), ("ignore_eos", "true"), ("logprobs", 0), ("temperature", "1"),
    ("temperature", True), ("top_p", float("nan")),
])
def test_numbers_and_flags_are_not_coerced(field: str, value: Any) -> None:
    assert error_loc(ChatCompletionRequest, {**CHAT, field: value}) == (field,)


def test_an_int_is_a_valid_float() -> None:
    assert ChatCompletionRequest.model_validate({**CHAT, "temperature": 1, "top_p": 1}).temperature == 1.0


def test_router_extension_numbers_are_finite() -> None:
    body = {**CHAT, "sluice": {"router": {"overlap_score_weight": float("inf")}}}
    assert error_loc(ChatCompletionRequest, body) == ("sluice", "router", "overlap_score_weight")


@pytest.mark.parametrize(("body", "loc"), [
    ({**CHAT, "messages": [{"role": "user", "content": "a\ud800"}]}, ("messages", 0, "content")),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
     ("messages", 0, "content", "parts", 0, "text")),
    ({**CHAT, "messages": [{"role": "user", "content": "hi", "name": "\ud800"}]}, ("messages", 0, "name")),
    ({**CHAT, "stop": "\ud800"}, ("stop",)), ({**CHAT, "stop": ["ok", "\ud800"]}, ("stop",)),
    ({**CHAT, "user": "\ud800"}, ("user",)), ({**CHAT, "model": "\ud800"}, ("model",)),
])
def test_lone_surrogates_in_chat_text_are_refused(body: dict[str, Any], loc: tuple) -> None:
    assert error_loc(ChatCompletionRequest, body) == loc


def test_lone_surrogates_in_completion_prompts_are_refused() -> None:
    assert error_loc(CompletionRequest, {**COMPLETION, "prompt": "\ud800"}) == ("prompt", "text")
    assert error_loc(CompletionRequest, {**COMPLETION, "prompt": ["a", "b\udc00"]}) == ("prompt", "texts", 1)


def test_a_prompt_is_validated_as_the_one_shape_it_has() -> None:
    shapes = {"text": "a", "texts": ["a", "b"], "token_ids": [1, 2], "token_id_lists": [[1], [2, 3]]}
    for shape, prompt in shapes.items():
        assert CompletionRequest.model_validate({**COMPLETION, "prompt": prompt}).prompt == prompt, shape
    assert CompletionRequest.model_validate({**COMPLETION, "prompt": [1, 2]}).prompts() == [[1, 2]]
    assert CompletionRequest.model_validate({**COMPLETION, "prompt": [[1], [2]]}).prompts() == [[1], [2]]
    assert error_loc(CompletionRequest, {**COMPLETION, "prompt": [1, "a"]}) == ("prompt", "token_ids", 1)
    assert error_loc(CompletionRequest, {**COMPLETION, "prompt": [True]}) == ("prompt", "token_ids", 0)
    for empty in ([], [[]]):
        assert error_loc(CompletionRequest, {**COMPLETION, "prompt": empty})[0] == "prompt"
    for other in (None, 5, {"a": 1}):
        assert error_loc(CompletionRequest, {**COMPLETION, "prompt": other}) == ("prompt",)


def test_message_content_is_a_string_or_text_parts() -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    body = ChatCompletionRequest.model_validate({**CHAT, "messages": [{"role": "user", "content": parts},
                                                                      {"role": "assistant"}]})
    assert [message_text(m) for m in body.messages] == ["Hello", ""]
    assert error_loc(ChatCompletionRequest, {**CHAT, "messages": [{"role": "user", "content": 5}]}) == (
        "messages", 0, "content")
