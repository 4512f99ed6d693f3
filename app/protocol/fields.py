"""Field types of the request schemas, with the ranges every later stage can take.

Numbers and flags are strict, as in OpenAI's schema: ``"max_tokens": true``, ``"stream": "yes"``,
``"n": 2.0`` or ``"temperature": "1"`` are refused, not coerced (an int is still a valid float).
Integers are bounded where Python's are not: a seed is a signed 64-bit integer (vLLM's range, a
torch long), token ids and counts fit 31 bits; past these the wire encoders (orjson, msgpack) and
the engines fail. Text must be valid Unicode: JSON's ``\\ud800`` escape decodes to a lone surrogate,
which neither UTF-8 nor the tokenizer can take.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, Strict

INT32_MAX = 2**31 - 1
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


def valid_unicode(text: str) -> str:
    """``text`` unchanged; ValueError, naming the first one, if it holds a lone surrogate."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}: "
                             "text must be valid Unicode") from None
    return text


Flag = Annotated[bool, Strict()]
Text = Annotated[str, Strict(), AfterValidator(valid_unicode)]
NonEmptyText = Annotated[str, Strict(), Field(min_length=1), AfterValidator(valid_unicode)]
TokenId = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
#: A number of tokens to generate: at least one.
TokenCount = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
Seed = Annotated[int, Strict(), Field(ge=SEED_MIN, le=SEED_MAX)]
#: A finite float (an int is accepted); bounds are added where the field is declared.
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
