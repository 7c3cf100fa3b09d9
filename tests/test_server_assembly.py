"""Chat response assembly on canned model output (random weights never call tools): the stream of
deltas and the final message, checked against the one-shot `parse_assistant_output` and validated
by the `openai` package's own response types (ChatCompletionChunk / ChatCompletion)."""
from __future__ import annotations

import json
import random

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tightfit.server.schemas import ChatAssembler
from tightfit.tokenizer.parse import parse_assistant_output

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "zip_lookup", "parameters": {
        "type": "object", "properties": {"zip": {"type": "string"}}}}}]

CANNED = ("The user wants weather for two places.\nI'll call the tool.\n</think>\n\n"
          "Let me check that for you.\n\n"
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
          "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
          "<tool_call>\n<function=zip_lookup>\n<parameter=zip>\n01234\n</parameter>\n"
          "</function>\n</tool_call>")


def _pieces(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(text[i:i + n])
        i += n
    return out


def _chunk(delta: dict, finish=None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_tool_calls_and_reasoning(seed):
    asm = ChatAssembler(thinking_started=True, tools=TOOLS)
    deltas = []
    for piece in _pieces(CANNED, random.Random(seed)):
        deltas += asm.feed(piece)
    deltas += asm.finish()
    chunks = [ChatCompletionChunk.model_validate(_chunk(d)) for d in deltas]
    final = ChatCompletionChunk.model_validate(_chunk({}, asm.finish_reason("stop")))
    assert final.choices[0].finish_reason == "tool_calls"

    want = parse_assistant_output(CANNED, thinking_started=True, tools=TOOLS)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert reasoning == want.reasoning_content == ("The user wants weather for two places.\n"
                                                   "I'll call the tool.")
    assert content == want.content == "Let me check that for you."
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.index for tc in calls] == [0, 1]
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("zip_lookup", {"zip": "01234"})]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in want.tool_calls] == \
        [(tc.function.name, tc.function.arguments) for tc in calls]
    assert all(tc.id and tc.type == "function" for tc in calls)
    # no delta ever carries part of a tag
    assert not any("<" in (d.get("content") or "") for d in deltas)

    msg = asm.message()
    resp = ChatCompletion.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": msg, "finish_reason": asm.finish_reason("stop")}]})
    m = resp.choices[0].message
    assert m.content == "Let me check that for you."
    assert m.model_extra["reasoning_content"] == want.reasoning_content
    assert [tc.id for tc in m.tool_calls] == [tc.id for tc in calls]   # same calls, same ids


def test_plain_content_and_length_finish():
    asm = ChatAssembler(thinking_started=False, tools=None)
    deltas = asm.feed("Hello") + asm.feed(" there <tool") + asm.feed("_call> unfinished") + asm.finish()
    text = "Hello there <tool_call> unfinished"
    assert "".join(d["content"] for d in deltas) == parse_assistant_output(text, thinking_started=False).content
    assert asm.finish_reason("length") == "length" and asm.finish_reason("stop") == "stop"
    assert asm.message() == {"role": "assistant", "content": text}


def test_unfinished_reasoning_is_reasoning():
    asm = ChatAssembler(thinking_started=True, tools=None)
    deltas = asm.feed("still thinking about") + asm.feed(" it") + asm.finish()
    assert all(set(d) == {"reasoning_content"} for d in deltas)
    assert asm.message() == {"role": "assistant", "content": "",
                             "reasoning_content": "still thinking about it"}
