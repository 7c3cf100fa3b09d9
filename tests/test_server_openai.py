"""The server through the official `openai` client, against a live uvicorn on 127.0.0.1, on the
real tiny demo model. Expected outputs come from the engine directly (a cold `Engine.generate` on
the template's rendering, parsed with `parse_assistant_output`): an independent path that shares
no code with the server's scheduler, session cache, or response assembly."""
from __future__ import annotations

import httpx
import openai
import pytest

from tightfit.tokenizer.parse import parse_assistant_output
from _demo import demo_engine  # noqa: E402

KEY = "test-key-123"
N_CTX = 768
MSGS = [{"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def engine():
    yield from demo_engine(N_CTX)


@pytest.fixture(scope="module")
def server(engine):
    from tightfit.server.app import ServerThread, create_app
    with ServerThread(create_app(engine, api_key=KEY, model_id="tiny")) as srv:
        yield srv


@pytest.fixture()
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as c:
        yield c


def _expected(engine, messages, max_tokens, tools=None, **kw):
    prompt = engine.render_chat(messages, tools=tools, **kw)
    evs = list(engine.generate(prompt, max_tokens=max_tokens))
    text = "".join(e.text for e in evs)
    ids = engine.encode_prompt(prompt)
    return prompt, ids, evs[-1], parse_assistant_output(
        text, thinking_started=prompt.rstrip().endswith("<think>"), tools=tools)


def test_chat_non_stream_matches_engine(engine, client):
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=7, temperature=0)
    _, ids, last, exp = _expected(engine, MSGS, 7)
    msg = r.choices[0].message
    assert exp.reasoning_content            # the prompt opened <think>: the text is reasoning
    assert r.object == "chat.completion" and r.model == "tiny"
    assert msg.role == "assistant"
    assert (msg.content or "") == exp.content
    assert getattr(msg, "reasoning_content", None) == exp.reasoning_content
    assert r.choices[0].finish_reason == ("length" if last.finish_reason == "length" else "stop")
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(last.tokens)
    t = r.model_extra["timings"]
    assert t["predicted_n"] == len(last.tokens)
    assert t["prompt_n"] + t["cache_n"] == len(ids)


def test_chat_stream_with_usage_matches_engine(engine, client):
    kw = {"chat_template_kwargs": {"enable_thinking": False}}
    stream = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body=kw)
    chunks = list(stream)
    _, ids, last, exp = _expected(engine, MSGS, 6, enable_thinking=False)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    assert exp.content                      # thinking off: the text is content
    assert content == exp.content and reasoning == (exp.reasoning_content or "")
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and "timings" in finals[0].model_extra
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(ids)
    assert chunks[-1].usage.completion_tokens == len(last.tokens)
    assert len({c.id for c in chunks}) == 1


def test_completions_stream_and_not_match_engine(engine, client):
    prompt = "In the beginning"
    evs = list(engine.generate(prompt, max_tokens=8))
    want = "".join(e.text for e in evs)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
    assert r.choices[0].text == want and r.object == "text_completion"
    assert r.usage.completion_tokens == len(evs[-1].tokens)
    s = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == want
    # token-id prompts are accepted too
    ids = engine.encode_prompt(prompt)
    r2 = client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    assert r2.choices[0].text == want


def test_stop_string_cuts_the_completion(engine, client):
    prompt = "Lorem ipsum dolor"
    full = "".join(e.text for e in engine.generate(prompt, max_tokens=12))
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), "need a visible stop string"
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
    assert r.choices[0].text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_and_matches_engine(engine, client):
    from tightfit.runtime.sampler import SamplingParams
    extra = {"top_k": 20, "min_p": 0.01, "repeat_penalty": 1.1}
    outs = [client.completions.create(model="tiny", prompt="Seeds:", max_tokens=8, temperature=1.0,
                                      seed=77, extra_body=extra).choices[0].text for _ in range(2)]
    sp = SamplingParams(temperature=1.0, top_k=20, min_p=0.01, repeat_penalty=1.1, seed=77)
    want = "".join(e.text for e in engine.generate("Seeds:", max_tokens=8, sampling=sp))
    assert outs == [want, want]


def test_tools_are_rendered_and_a_tool_round_trip_is_served(engine, client, server):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    h = {"Authorization": f"Bearer {KEY}"}
    tmpl = httpx.post(server.url + "/apply-template", json={"messages": msgs, "tools": [WEATHER]},
                      headers=h, timeout=60).json()["prompt"]
    assert "get_weather" in tmpl and "Current weather for a city" in tmpl
    assert tmpl == engine.render_chat(msgs, tools=[WEATHER])
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER], max_tokens=3,
                                       temperature=0)
    assert r.usage.prompt_tokens == len(engine.encode_prompt(tmpl))
    # the client sends the call back with its result: the template renders both
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24C"}]
    r2 = client.chat.completions.create(model="tiny", messages=msgs2, tools=[WEATHER], max_tokens=3,
                                        temperature=0)
    _, ids2, last2, exp2 = _expected(engine, msgs2, 3, tools=[WEATHER])
    assert r2.usage.prompt_tokens == len(ids2)
    assert getattr(r2.choices[0].message, "reasoning_content", None) == exp2.reasoning_content
    tmpl2 = engine.render_chat(msgs2, tools=[WEATHER])
    assert "<tool_response>" in tmpl2 and "sunny, 24C" in tmpl2 and "get_weather" in tmpl2


def test_models_and_client_errors(client, server):
    ms = client.models.list()
    assert [m.id for m in ms.data] == ["tiny"]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=1)
    assert e.value.status_code == 404 and "gpt-4o" in e.value.message
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=N_CTX)
    assert "context" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1, temperature=-1)
    # the server is still up and serving
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
