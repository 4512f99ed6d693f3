"""The mocker's scripted mode, on the engine itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from core.messages import SamplingParams
from core.settings import MockerSettings
from workers.engines.base import EngineRequest
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.script import MockerScript


async def _run(engine: MockerEngine, prompt: list[int], sampling: SamplingParams) -> tuple[list[int], str | None]:
    out: list[int] = []
    reason = None
    async for o in engine.generate(EngineRequest(request_id=f"r{len(prompt)}-{sampling.max_tokens}", token_ids=prompt, sampling=sampling)):
        out.extend(o.token_ids)
        reason = o.finish_reason or reason
    return out, reason


@pytest.fixture
def script(tmp_path: Path, tokenizer_dir: Path) -> MockerScript:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"match": "weather", "output": '<tool_call>{"name": "w", "arguments": {}}</tool_call>'},
                                {"match": "<|im_start|>user\nhi", "output": "Hello there."}]))
    return MockerScript.load(path, tokenizer_dir)


async def test_a_matching_prompt_gets_the_scripted_text_then_stops(script: MockerScript, tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    engine = MockerEngine("m", MockerSettings(no_sleep=True), script=script)
    await engine.start()
    try:
        prompt = tok.encode("What is the weather like?").ids
        out, reason = await _run(engine, prompt, SamplingParams(max_tokens=100, temperature=0.7))
        assert tok.decode(out) == '<tool_call>{"name": "w", "arguments": {}}</tool_call>'
        assert reason == "stop"
        # Chat markers are matched as text; max_tokens still ends a scripted output.
        prompt = tok.encode("<|im_start|>user\nhi<|im_end|>").ids
        out, reason = await _run(engine, prompt, SamplingParams(max_tokens=2, temperature=0))
        assert tok.decode(out) == tok.decode(tok.encode("Hello there.").ids[:2]) and reason == "length"
        # No match: the usual hash stream, to max_tokens.
        out, reason = await _run(engine, tok.encode("Something else").ids, SamplingParams(max_tokens=5, temperature=0))
        assert len(out) == 5 and reason == "length"
    finally:
        await engine.shutdown()


async def test_an_entry_that_ends_in_error_ends_its_request_with_the_engines_error(tmp_path: Path,
                                                                                 tokenizer_dir: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"match": "fail", "output": "Half an answer", "finish": "error"}]))
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    engine = MockerEngine("m", MockerSettings(no_sleep=True), script=MockerScript.load(path, tokenizer_dir))
    await engine.start()
    try:
        # ignore_eos does not carry it past the script's end: the engine failed the request there.
        out, reason = await _run(engine, tok.encode("please fail").ids,
                                 SamplingParams(max_tokens=100, temperature=0, ignore_eos=True))
        assert tok.decode(out) == "Half an answer" and reason == "error"
    finally:
        await engine.shutdown()
