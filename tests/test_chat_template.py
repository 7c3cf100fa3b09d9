"""Chat template rendering against two outside oracles:

1. expected prompt strings written out by hand from reading shared/fixtures/Qwen3.5-4B.jinja
   (and spec/qwen35.md §5.2), and
2. transformers' own renderer (`render_jinja_template`, and `apply_chat_template` on a tokenizer
   built offline), which must produce the identical string for the same conversation.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path

import pytest

from tightfit.errors import UserError
from tightfit.tokenizer.chat import ChatTemplate, TemplateError, render_chat

TEMPLATE_PATH = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "Qwen3.5-4B.jinja"


@pytest.fixture(scope="module")
def qwen_template() -> str:
    if not TEMPLATE_PATH.exists():
        pytest.skip(f"shared fixture {TEMPLATE_PATH} is absent (the ../shared folder is not here)")
    return TEMPLATE_PATH.read_text(encoding="utf-8")


# ---- text copied by hand from the template's literals ------------------------------------------

TOOLS_HEADER = "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>"
TOOLS_INSTRUCTIONS = (
    "\n</tools>"
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block "
    "must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the "
    "function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo <city> & more",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
# json.dumps spacing, non-ASCII kept, no HTML escaping of < > & (transformers' tojson).
WEATHER_TOOL_JSON = ('{"type": "function", "function": {"name": "get_weather", "description": '
                     '"Météo <city> & more", "parameters": {"type": "object", "properties": '
                     '{"city": {"type": "string"}}, "required": ["city"]}}}')

GEN = "<|im_start|>assistant\n<think>\n"
GEN_NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _user(text):
    return {"role": "user", "content": text}


def _call(name, arguments, call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Each case: (id, messages, tools, kwargs, expected-by-hand)
CASES = [
    ("system_user",
     [{"role": "system", "content": "You are terse."}, _user("Hello")], None, {},
     "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n" + GEN),
    ("thinking_disabled",
     [_user("Hello")], None, {"enable_thinking": False},
     "<|im_start|>user\nHello<|im_end|>\n" + GEN_NO_THINK),
    ("thinking_enabled_explicitly",
     [_user("Hello")], None, {"enable_thinking": True},
     "<|im_start|>user\nHello<|im_end|>\n" + GEN),
    ("no_generation_prompt",
     [_user("Hello")], None, {"add_generation_prompt": False},
     "<|im_start|>user\nHello<|im_end|>\n"),
    ("user_content_is_trimmed",
     [_user("  Hello\n\n")], None, {},
     "<|im_start|>user\nHello<|im_end|>\n" + GEN),
    # Historical reasoning (before the last user query) is dropped, whether it came as a field...
    ("history_reasoning_field_dropped",
     [_user("Q1"), {"role": "assistant", "content": "A1", "reasoning_content": "R1"}, _user("Q2")],
     None, {},
     "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
     "<|im_start|>user\nQ2<|im_end|>\n" + GEN),
    # ... or inline in the content.
    ("history_inline_think_dropped",
     [_user("Q1"), {"role": "assistant", "content": "<think>\nR1\n</think>\n\nA1"}, _user("Q2")],
     None, {},
     "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
     "<|im_start|>user\nQ2<|im_end|>\n" + GEN),
    # After the last user query the reasoning is kept, trimmed, inside <think>.
    ("latest_reasoning_field_kept",
     [_user("Q1"), {"role": "assistant", "content": "\nA1\n", "reasoning_content": "  R1 \n"}],
     None, {"add_generation_prompt": False},
     "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n"),
    ("latest_inline_think_kept",
     [_user("Q1"), {"role": "assistant", "content": "<think>\nstep 1\nstep 2\n</think>\n\nA1"}],
     None, {"add_generation_prompt": False},
     "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\nstep 1\nstep 2\n</think>\n\n"
     "A1<|im_end|>\n"),
    ("latest_without_reasoning_gets_empty_think",
     [_user("Q1"), {"role": "assistant", "content": "A1"}],
     None, {"add_generation_prompt": False},
     "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA1<|im_end|>\n"),
    ("tools_with_system",
     [{"role": "system", "content": "Be brief."}, _user("Weather in Paris?")], [WEATHER_TOOL], {},
     TOOLS_HEADER + "\n" + WEATHER_TOOL_JSON + TOOLS_INSTRUCTIONS + "\n\nBe brief.<|im_end|>\n"
     "<|im_start|>user\nWeather in Paris?<|im_end|>\n" + GEN),
    ("tools_without_system",
     [_user("Weather in Paris?")], [WEATHER_TOOL, WEATHER_TOOL], {},
     TOOLS_HEADER + "\n" + WEATHER_TOOL_JSON + "\n" + WEATHER_TOOL_JSON + TOOLS_INSTRUCTIONS
     + "<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n" + GEN),
    # Tool calls (dict arguments; list/dict values through tojson, ints through |string), two tool
    # results grouped into one user turn, then a final answer turn.
    ("tool_calls_and_grouped_results",
     [_user("Weather in Paris and Rome?"),
      {"role": "assistant", "content": "Checking.", "reasoning_content": "Two cities.",
       "tool_calls": [_call("get_weather", {"city": "Paris"}),
                      _call("get_weather", {"city": "Rome", "days": 2, "hours": [6, 18],
                                            "units": {"temp": "°C"}}, "call_2")]},
      {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
      {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
      {"role": "assistant", "content": "Paris: sunny. Rome: rain."}],
     None, {"add_generation_prompt": False},
     "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
     "<|im_start|>assistant\n<think>\nTwo cities.\n</think>\n\nChecking."
     "\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "</function>\n</tool_call>"
     "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
     "<parameter=days>\n2\n</parameter>\n<parameter=hours>\n[6, 18]\n</parameter>\n"
     "<parameter=units>\n{\"temp\": \"°C\"}\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
     "<|im_start|>user\n<tool_response>\nSunny\n</tool_response>"
     "\n<tool_response>\nRain\n</tool_response><|im_end|>\n"
     "<|im_start|>assistant\n<think>\n\n</think>\n\nParis: sunny. Rome: rain.<|im_end|>\n"),
    # content: None beside tool_calls (what OpenAI clients send): no "\n\n" before the call.
    ("tool_call_with_null_content",
     [_user("Weather?"),
      {"role": "assistant", "content": None, "tool_calls": [_call("get_weather", {"city": "Oslo"})]},
      {"role": "tool", "content": "Snow"}],
     None, {},
     "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
     "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nSnow\n</tool_response><|im_end|>\n"
     + GEN),
    # A user turn that only wraps a tool response is not a "query": reasoning of the assistant
    # turn before it is still shown.
    ("tool_response_user_turn_is_not_a_query",
     [_user("Q"), {"role": "assistant", "content": "A", "reasoning_content": "R"},
      _user("<tool_response>\nX\n</tool_response>")],
     None, {},
     "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n"
     "<|im_start|>user\n<tool_response>\nX\n</tool_response><|im_end|>\n" + GEN),
    ("content_as_text_parts",
     [{"role": "system", "content": [{"type": "text", "text": "Sys "}, {"type": "text", "text": "tem"}]},
      {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"},
                                   {"type": "text", "text": " ok?"}]}],
     None, {},
     "<|im_start|>system\nSys tem<|im_end|>\n<|im_start|>user\nLook: "
     "<|vision_start|><|image_pad|><|vision_end|> ok?<|im_end|>\n" + GEN),
]


def _render(template, messages, tools, kwargs):
    kwargs = dict(kwargs)
    agp = kwargs.pop("add_generation_prompt", True)
    return render_chat(template, messages, tools=tools, add_generation_prompt=agp, **kwargs)


@pytest.mark.parametrize("messages,tools,kwargs,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_hand_written_expectation(qwen_template, messages, tools, kwargs, expected):
    assert _render(qwen_template, messages, tools, kwargs) == expected


@pytest.mark.parametrize("messages,tools,kwargs,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_transformers_renderer(qwen_template, messages, tools, kwargs, expected):
    cu = pytest.importorskip("transformers.utils.chat_template_utils")
    kwargs = dict(kwargs)
    agp = kwargs.pop("add_generation_prompt", True)
    # transformers drops None-valued keys before rendering (in apply_chat_template), do the same.
    hf_messages = [{k: v for k, v in m.items() if v is not None} for m in copy.deepcopy(messages)]
    rendered, _ = cu.render_jinja_template(conversations=[hf_messages], tools=tools,
                                           chat_template=qwen_template, add_generation_prompt=agp,
                                           **kwargs)
    assert _render(qwen_template, messages, tools, dict(kwargs, add_generation_prompt=agp)) == rendered[0]
    assert rendered[0] == expected  # the hand-written strings agree with transformers too


def test_apply_chat_template_of_offline_tokenizer(qwen_template):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0, "<|im_end|>": 1}, unk_token="<unk>")),
        eos_token="<|im_end|>", chat_template=qwen_template)
    for _, messages, tools, kwargs, _ in CASES:
        kwargs = dict(kwargs)
        agp = kwargs.pop("add_generation_prompt", True)
        want = tok.apply_chat_template(copy.deepcopy(messages), tools=tools, tokenize=False,
                                       add_generation_prompt=agp, **kwargs)
        got = ChatTemplate(qwen_template, eos_token="<|im_end|>").render(
            messages, tools=tools, add_generation_prompt=agp, **kwargs)
        assert got == want


def test_string_arguments_render_like_dict_arguments(qwen_template):
    """OpenAI clients send arguments as a JSON string; the prompt must equal the dict form's."""
    args = {"city": "Zürich", "days": 3, "hours": [1, 2]}
    base = [_user("Weather?")]
    as_dict = base + [{"role": "assistant", "content": "", "tool_calls": [_call("get_weather", args)]}]
    as_str = base + [{"role": "assistant", "content": "",
                      "tool_calls": [_call("get_weather", json.dumps(args))]}]
    want = ("<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=hours>\n[1, 2]\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>\n")
    assert render_chat(qwen_template, as_dict, add_generation_prompt=False) == want
    assert render_chat(qwen_template, as_str, add_generation_prompt=False) == want
    # the caller's messages are not modified
    assert isinstance(as_str[1]["tool_calls"][0]["function"]["arguments"], str)


def test_bad_string_arguments_are_a_user_error(qwen_template):
    msgs = [_user("Q"), {"role": "assistant", "content": "", "tool_calls": [_call("f", "{not json")]}]
    with pytest.raises(TemplateError, match="not valid JSON"):
        render_chat(qwen_template, msgs)


@pytest.mark.parametrize("messages,message", [
    ([{"role": "system", "content": "S"}], "No user query found in messages."),
    ([{"role": "tool", "content": "x"}], "No user query found in messages."),
    ([], "No messages provided."),
    ([_user("a"), {"role": "system", "content": "S"}], "System message must be at the beginning."),
    ([_user("a"), {"role": "robot", "content": "x"}], "Unexpected message role."),
    ([{"role": "system", "content": [{"type": "image"}]}, _user("a")],
     "System message cannot contain images."),
])
def test_template_raise_exception_becomes_template_error(qwen_template, messages, message):
    with pytest.raises(TemplateError) as info:
        render_chat(qwen_template, messages)
    assert isinstance(info.value, UserError)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    # transformers raises on the same input with the same message.
    cu = pytest.importorskip("transformers.utils.chat_template_utils")
    import jinja2
    with pytest.raises(jinja2.exceptions.TemplateError, match=message.rstrip(".")):
        cu.render_jinja_template(conversations=[messages], chat_template=qwen_template,
                                 add_generation_prompt=True)


# ---- the environment itself, on small templates -----------------------------------------------

@pytest.mark.parametrize("source,context,expected", [
    # tojson: json.dumps defaults, unicode kept, no HTML escaping; indent/sort_keys/separators pass through
    ('{{ x | tojson }}', {"x": {"b": "é<&>'", "a": [1, None]}}, '{"b": "é<&>\'", "a": [1, null]}'),
    ('{{ x | tojson(indent=2) }}', {"x": {"a": 1}}, '{\n  "a": 1\n}'),
    ('{{ x | tojson(sort_keys=true, separators=(",", ":")) }}', {"x": {"b": 1, "a": 2}}, '{"a":2,"b":1}'),
    # trim_blocks + lstrip_blocks
    ('A\n  {% if true %}\nB\n  {% endif %}\nC', {}, 'A\nB\nC'),
    # loopcontrols
    ('{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}', {}, '01'),
    # transformers' {% generation %} block renders its body
    ('{% generation %}gen{% endgeneration %}!', {}, 'gen!'),
    ('{% set d = dict(a=1) %}{{ d.a }}', {}, '1'),
    ('{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}', {}, '2'),
])
def test_environment_features(source, context, expected):
    got = render_chat(source, [_user("x")], **context)
    assert got == expected
    cu = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = cu.render_jinja_template(conversations=[[_user("x")]], chat_template=source, **context)
    assert rendered[0] == expected


def test_special_tokens_and_kwargs():
    src = "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{{ eos_token }}"
    t = ChatTemplate(src, bos_token="<s>", eos_token="</s>")
    assert t.render([_user("hi")]) == "<s>[user:hi]</s>"
    # chat_template_kwargs may override the tokens (as in transformers)
    assert t.render([_user("hi")], bos_token="^") == "^[user:hi]</s>"
    # add_generation_prompt is visible to the template
    g = ChatTemplate("{{ 'G' if add_generation_prompt else 'N' }}")
    assert g.render([_user("x")]) == "G"
    assert g.render([_user("x")], add_generation_prompt=False) == "N"


def test_strftime_now():
    before = datetime.now().strftime("%Y-%m-%d")
    got = render_chat("{{ strftime_now('%Y-%m-%d') }}", [_user("x")])
    after = datetime.now().strftime("%Y-%m-%d")
    assert got in (before, after)


def test_reasoning_aliases():
    src = "{% for m in messages %}{{ m.reasoning_content }}|{% endfor %}"
    msgs = [{"role": "assistant", "thinking": "T"}, {"role": "assistant", "reasoning": "R"},
            {"role": "assistant", "reasoning_content": "C"}]
    assert render_chat(src, msgs) == "T|R|C|"


@pytest.mark.parametrize("source,fragment", [
    ("{% if %}", "syntax error at line 1"),
    ("line one\n{% for x in %}", "syntax error at line 2"),
    ("{{ raise_exception('custom failure') }}", "custom failure"),
    ("{{ missing.attr }}", "'missing' is undefined"),
    ("{{ messages[0].content + 1 }}", "TypeError"),
    ("{{ ().__class__.__mro__ }}", "unsafe"),
    ("{% set ns = namespace(_x=1) %}", "underscore"),
    ("{% for m in messages %}{% set m.role = 'x' %}{% endfor %}", "non-namespace"),
    ("{{ messages.append(1) }}", "unsafe"),  # the immutable sandbox refuses to mutate input
])
def test_failures_are_template_errors(source, fragment):
    with pytest.raises(TemplateError) as info:
        render_chat(source, [_user("x")])
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_input_shapes():
    with pytest.raises(TemplateError):
        render_chat("x", "not a list")
    with pytest.raises(TemplateError):
        render_chat("x", ["not a dict"])
    with pytest.raises(TemplateError):
        render_chat("x", [_user("a")], tools={"type": "function"})
    with pytest.raises(TemplateError):
        render_chat("x", [{"role": "user", "content": object()}])
