"""Parsing Qwen3.5 completions into reasoning / content / tool calls.

Oracles: (1) completions and expected structures written by hand from the output format the chat
template asks for (shared/fixtures/Qwen3.5-4B.jinja, spec/qwen35.md §5.2); (2) transformers'
renderer: rendering the parsed message back with the template must reproduce the model's text;
(3) the streaming parser, fed in arbitrary pieces, must agree with the one-shot parse and with
the hand-written expectations.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tightfit.tokenizer.parse import (ParsedOutput, StreamEvent, StreamingOutputParser,
                                      parse_assistant_output, prompt_opens_thinking)

TEMPLATE_PATH = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "Qwen3.5-4B.jinja"


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def call(name, arguments, i):
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def parse(text, **kw):
    return parse_assistant_output(text, id_factory=ids(), **kw)


def stream(text, chunks=None, **kw):
    """Feed `text` cut at the given sizes (default: one character at a time)."""
    p = StreamingOutputParser(id_factory=ids(), **kw)
    events = []
    pos = 0
    sizes = chunks or [1] * len(text)
    for n in sizes:
        events += p.feed(text[pos:pos + n])
        pos += n
    events += p.feed(text[pos:])
    events += p.finish()
    return p.result(), events


def from_events(events):
    r = "".join(e.text for e in events if e.kind == "reasoning")
    return ParsedOutput(r or None, "".join(e.text for e in events if e.kind == "content"),
                        [e.tool_call for e in events if e.kind == "tool_call"])


WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string"}, "note": {"type": ["string", "null"]},
        "days": {"type": "integer"}}}}}]

# (id, text, parse kwargs, expected ParsedOutput) - all written by hand.
CASES = [
    ("reasoning_then_content",
     "The user greets me.\n</think>\n\nHello! How can I help?", {},
     ParsedOutput("The user greets me.", "Hello! How can I help?", [])),
    ("thinking_disabled_plain_content",
     "Hello!", {"thinking_started": False},
     ParsedOutput(None, "Hello!", [])),
    ("thinking_disabled_but_model_opens_think",
     "\n<think>\nhmm\n</think>\n\nHi", {"thinking_started": False},
     ParsedOutput("hmm", "Hi", [])),
    ("model_repeats_think_open",
     "<think>\nlet me see\n</think>\n\nOK", {},
     ParsedOutput("let me see", "OK", [])),
    ("truncated_inside_reasoning",
     "Still thinking about the\n", {},
     ParsedOutput("Still thinking about the", "", [])),
    ("empty_reasoning",
     "\n\n</think>\n\nHi", {},
     ParsedOutput(None, "Hi", [])),
    ("multiline_reasoning_inner_whitespace_kept",
     "\nStep 1.\n\n  Step 2.\n</think>\n\nDone.\n\n", {},
     ParsedOutput("Step 1.\n\n  Step 2.", "Done.", [])),
    ("close_think_in_content_is_text",
     "r\n</think>\n\nUse </think> to end.", {},
     ParsedOutput("r", "Use </think> to end.", [])),
    ("tool_call_markup_in_reasoning_stays_reasoning",
     "Maybe <tool_call>\n<function=f>\n</function>\n</tool_call>?\n</think>\n\nNo.", {},
     ParsedOutput("Maybe <tool_call>\n<function=f>\n</function>\n</tool_call>?", "No.", [])),
    ("xml_tool_call_with_content",
     "Need weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
     "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
     "</tool_call>", {},
     ParsedOutput("Need weather.", "Let me check.",
                  [call("get_weather", '{"city":"Paris","days":3}', 0)])),
    ("xml_value_types",
     "</think>\n\n<tool_call>\n<function=f>\n"
     "<parameter=s>\nplain text\n</parameter>\n"
     "<parameter=q>\n\"quoted\"\n</parameter>\n"
     "<parameter=i>\n-12\n</parameter>\n"
     "<parameter=x>\n2.5e3\n</parameter>\n"
     "<parameter=b>\ntrue\n</parameter>\n"
     "<parameter=n>\nnull\n</parameter>\n"
     "<parameter=l>\n[1, \"a\"]\n</parameter>\n"
     "<parameter=o>\n{\"k\": {\"z\": false}}\n</parameter>\n"
     "<parameter=nan>\nNaN\n</parameter>\n"
     "<parameter=u>\nÄpfel → 🍎\n</parameter>\n"
     "</function>\n</tool_call>", {},
     ParsedOutput(None, "", [call("f", '{"s":"plain text","q":"quoted","i":-12,"x":2500.0,'
                                       '"b":true,"n":null,"l":[1,"a"],"o":{"k":{"z":false}},'
                                       '"nan":"NaN","u":"Äpfel → 🍎"}', 0)])),
    # Only the template's own newline on each side of a value is removed.
    ("xml_multiline_value_keeps_indentation",
     "</think>\n\n<tool_call>\n<function=edit>\n<parameter=old>\n    if x:\n        return 1\n\n"
     "</parameter>\n</function>\n</tool_call>", {},
     ParsedOutput(None, "", [call("edit", '{"old":"    if x:\\n        return 1\\n"}', 0)])),
    ("xml_inline_compact_form",
     "</think><tool_call><function=f><parameter=a>7</parameter></function></tool_call>", {},
     ParsedOutput(None, "", [call("f", '{"a":7}', 0)])),
    ("xml_no_parameters",
     "</think>\n\n<tool_call>\n<function=now>\n</function>\n</tool_call>", {},
     ParsedOutput(None, "", [call("now", "{}", 0)])),
    ("schema_declares_strings",
     "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=zip>\n75001\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
     "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>", {"tools": WEATHER_TOOLS},
     ParsedOutput(None, "", [call("get_weather", '{"city":"Paris","zip":"75001","note":"null",'
                                                 '"days":2}', 0)])),
    ("without_schema_numbers_are_numbers",
     "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=zip>\n75001\n</parameter>\n"
     "</function>\n</tool_call>", {},
     ParsedOutput(None, "", [call("get_weather", '{"zip":75001}', 0)])),
    ("two_calls",
     "</think>\n\n<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n"
     "</tool_call>\n<tool_call>\n<function=b>\n<parameter=y>\nz\n</parameter>\n</function>\n"
     "</tool_call>", {},
     ParsedOutput(None, "", [call("a", '{"x":1}', 0), call("b", '{"y":"z"}', 1)])),
    ("json_form",
     "ok\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
     "</tool_call>", {},
     ParsedOutput("ok", "", [call("get_weather", '{"city":"Rome"}', 0)])),
    ("json_form_arguments_as_string",
     "</think><tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1, 2]}\"}</tool_call>", {},
     ParsedOutput(None, "", [call("f", '{"a":[1,2]}', 0)])),
    ("content_thinking_disabled_then_call",
     "Sure.\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>", {"thinking_started": False},
     ParsedOutput(None, "Sure.", [call("f", "{}", 0)])),
    # Malformed calls come back as content, never dropped.
    ("unclosed_tool_call_is_content",
     "</think>\n\nTrying.\n\n<tool_call>\n<function=f>\n<parameter=a>\n1", {},
     ParsedOutput(None, "Trying.\n\n<tool_call>\n<function=f>\n<parameter=a>\n1", [])),
    ("garbage_inside_tool_call_is_content",
     "</think>\n\n<tool_call>call f now</tool_call>", {},
     ParsedOutput(None, "<tool_call>call f now</tool_call>", [])),
    ("missing_function_close_is_content",
     "</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>", {},
     ParsedOutput(None, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>", [])),
    ("unclosed_parameter_is_content",
     "</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", {},
     ParsedOutput(None, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", [])),
    ("bad_json_form_is_content",
     "</think><tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", {},
     ParsedOutput(None, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", [])),
    ("good_call_after_bad_one",
     "</think>\n\n<tool_call>oops</tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call>", {},
     ParsedOutput(None, "<tool_call>oops</tool_call>", [call("g", "{}", 0)])),
    ("text_after_call_is_content",
     "</think>\n\nA\n\n<tool_call>\n<function=g>\n</function>\n</tool_call>\nB", {},
     ParsedOutput(None, "A\n\n\nB", [call("g", "{}", 0)])),
    ("lone_angle_brackets",
     "a < b\n</think>\n\nx <tool y </tool_call <", {},
     ParsedOutput("a < b", "x <tool y </tool_call <", [])),
]


@pytest.mark.parametrize("text,kw,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_shot(text, kw, expected):
    assert parse(text, **kw) == expected


@pytest.mark.parametrize("text,kw,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_streaming_char_by_char(text, kw, expected):
    result, events = stream(text, **kw)
    assert result == expected
    assert from_events(events) == expected
    assert [e.index for e in events if e.kind == "tool_call"] == list(range(len(expected.tool_calls)))


@pytest.mark.parametrize("text,kw,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_streaming_whole_text_at_once(text, kw, expected):
    assert stream(text, chunks=[len(text)], **kw)[0] == expected


def test_partial_tags_are_held_back():
    p = StreamingOutputParser(id_factory=ids())
    assert p.feed("Thinking </thi") == [StreamEvent("reasoning", "Thinking")]
    assert p.feed("nk>\n\nHello <tool_") == [StreamEvent("content", "Hello")]
    assert p.feed("call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n</tool_") == []
    evs = p.feed("call>")
    assert evs == [StreamEvent("tool_call", tool_call=call("f", '{"a":"x"}', 0), index=0)]
    assert p.finish() == []


def test_prefix_that_turns_out_not_to_be_a_tag_is_released():
    p = StreamingOutputParser(thinking_started=False)
    assert p.feed("<thin") == []  # could still become "<think>"
    assert p.feed("g>") == [StreamEvent("content", "<thing>")]
    assert p.feed(" <tool") == []
    assert p.finish() == [StreamEvent("content", " <tool")]


def test_unclosed_call_released_at_finish():
    p = StreamingOutputParser()
    out = p.feed("r</think>OK<tool_call>\n<function=f>")
    assert out == [StreamEvent("reasoning", "r"), StreamEvent("content", "OK")]
    assert p.finish() == [StreamEvent("content", "<tool_call>\n<function=f>")]
    with pytest.raises(RuntimeError):
        p.feed("x")


def test_prompt_opens_thinking():
    # the two generation prompts of the Qwen3.5 template, written out by hand
    assert prompt_opens_thinking("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking(
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")


def test_default_ids_are_unique_openai_style():
    text = "</think><tool_call><function=a></function></tool_call><tool_call><function=b></function></tool_call>"
    calls = parse_assistant_output(text).tool_calls
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert len({c["id"] for c in calls}) == 2
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)


# ---- chunking invariance on random texts built from tag fragments --------------------------------

FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<function=f>", "</function>",
             "<parameter=a>", "</parameter>", "\n", "  ", "x", "12", "<", "</", "<tool_", "</thi",
             "<thi", '{"name": "g", "arguments": {"k": 1}}', "é"]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(FRAGMENTS), max_size=25),
       cuts=st.lists(st.integers(min_value=0, max_value=6), max_size=40),
       thinking_started=st.booleans())
def test_any_chunking_matches_one_shot(pieces, cuts, thinking_started):
    text = "".join(pieces)
    want = parse(text, thinking_started=thinking_started)
    p = StreamingOutputParser(thinking_started=thinking_started, id_factory=ids())
    reasoning = content = ""
    pos = 0
    for n in cuts + [len(text)]:
        for ev in p.feed(text[pos:pos + n]):
            reasoning += ev.text if ev.kind == "reasoning" else ""
            content += ev.text if ev.kind == "content" else ""
        pos += n
        # nothing emitted is ever taken back
        assert (want.reasoning_content or "").startswith(reasoning)
        assert want.content.startswith(content)
    p.finish()
    assert p.result() == want


# ---- outside oracle: transformers renders the parsed message back into the model's text ---------

ROUND_TRIP = [
    ("Need weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
     "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
     "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
     "<parameter=hours>\n[6, 18]\n</parameter>\n</function>\n</tool_call>"),
    "Plan:\n1. a\n2. b\n</think>\n\nThe answer is 42.",
    ("\n</think>\n\n<tool_call>\n<function=edit>\n<parameter=old>\n    indented\n</parameter>\n"
     "<parameter=opts>\n{\"force\": \"yes\"}\n</parameter>\n</function>\n</tool_call>"),
]


@pytest.mark.parametrize("completion", ROUND_TRIP)
def test_round_trip_through_transformers_renderer(completion):
    cu = pytest.importorskip("transformers.utils.chat_template_utils")
    if not TEMPLATE_PATH.exists():
        pytest.skip(f"shared fixture {TEMPLATE_PATH} is absent (the ../shared folder is not here)")
    template = TEMPLATE_PATH.read_text(encoding="utf-8")
    user = [{"role": "user", "content": "Q"}]
    prompt, _ = cu.render_jinja_template(conversations=[user], chat_template=template,
                                         add_generation_prompt=True)
    parsed = parse(completion)
    message = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    if parsed.tool_calls:
        message["tool_calls"] = [{"type": "function", "function": {
            "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in parsed.tool_calls]
    full, _ = cu.render_jinja_template(conversations=[user + [message]], chat_template=template,
                                       add_generation_prompt=False)
    assert full[0] == prompt[0] + completion + "<|im_end|>\n"
