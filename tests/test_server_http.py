"""The server over plain HTTP (httpx): SSE framing, OpenAI-shaped errors, tokenize/detokenize,
Prometheus metrics (parsed by prometheus_client's own text parser), readiness, the bounded queue,
and client disconnects. A live uvicorn on 127.0.0.1 serves the real tiny demo model."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from _demo import demo_engine  # noqa: E402

N_CTX = 512
MSGS = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def engine():
    yield from demo_engine(N_CTX)


def _serve(engine=None, **kw):
    from tightfit.server.app import ServerThread, create_app
    return ServerThread(create_app(engine, **kw))


@pytest.fixture(scope="module")
def server(engine):
    with _serve(engine) as srv:
        yield srv


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _metrics(http) -> dict[str, float]:
    text = http.get("/metrics").text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def _is_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"] and "Traceback" not in r.text
    return err


def test_sse_framing(engine, http):
    body = {"messages": MSGS, "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw()).decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = []
    for ev in events[:-2]:
        assert ev.startswith("data: ") and "\n" not in ev, repr(ev)
        payloads.append(json.loads(ev[len("data: "):]))
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)
    assert payloads[0]["choices"][0]["delta"]["role"] == "assistant"
    finals = [p for p in payloads if p["choices"] and p["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    t = finals[0]["timings"]
    assert set(t) >= {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms",
                      "prompt_per_second", "predicted_per_second"}
    assert t["predicted_n"] == 5
    usage = payloads[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    ids = engine.encode_prompt(engine.render_chat(MSGS))
    assert usage["usage"]["prompt_tokens"] == len(ids) == t["prompt_n"] + t["cache_n"]
    # text completions stream the same way
    with http.stream("POST", "/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "stream": True,
                                                      "temperature": 0}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "timings" in chunks[-1]


@pytest.mark.parametrize("path, body, status, needle", [
    ("/v1/chat/completions", b"{not json", 400, "JSON"),
    ("/v1/chat/completions", b"", 400, "empty"),
    ("/v1/chat/completions", b"[1, 2]", 400, "object"),
    ("/v1/chat/completions", {"max_tokens": 3}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": "7"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": -2}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSGS, "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": MSGS, "top_p": 3}, 400, "top_p"),
    ("/v1/chat/completions", {"messages": MSGS, "stream": "yes"}, 400, "stream"),
    ("/v1/chat/completions", {"messages": MSGS, "n": 3}, 400, "n=1"),
    ("/v1/chat/completions", {"messages": MSGS, "model": "nope"}, 404, "nope"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": N_CTX}, 400, "context"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, "image_url"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("/v1/completions", {"prompt": "word " * N_CTX}, 400, "context"),
    ("/v1/completions", {"prompt": [1, 2, 10 ** 9]}, 400, "vocabulary"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "batched"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "a", "seed": -5}, 400, "seed"),
    ("/v1/completions", b"[" * 100000 + b"]" * 100000, 400, "nested"),
    ("/tokenize", {"content": 5}, 400, "content"),
    ("/detokenize", {"tokens": [-1]}, 400, "vocabulary"),
    ("/v1/nothing-here", {}, 404, "not found"),
])
def test_bad_requests_get_openai_errors(http, path, body, status, needle):
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, json=body)
    err = _is_error(r, status)
    assert needle.lower() in err["message"].lower(), err
    assert err["code"] == status


def test_wrong_method_and_server_survives(http):
    _is_error(http.get("/v1/chat/completions"), 405)
    assert http.get("/health").json() == {"status": "ok"}
    r = http.post("/v1/completions", json={"prompt": "ok", "max_tokens": 1})
    assert r.status_code == 200


def test_tokenize_detokenize_apply_template(engine, http):
    text = "Hello world, <|im_start|> ünïcode"
    r = http.post("/tokenize", json={"content": text}).json()
    assert r["tokens"] == engine.tokenizer.encode(text, parse_special=True)
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == r["tokens"]
    joined = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode()
                      for p in pieces)
    assert joined.decode() == text
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json()["content"] == text
    p = http.post("/apply-template", json={"messages": MSGS}).json()["prompt"]
    assert p == engine.render_chat(MSGS) and p.startswith("<|im_start|>user\nTell me a story.")


def test_metrics_count_tokens(http):
    m0 = _metrics(http)
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total",
                 "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred",
                 "llamacpp:n_decode_total", "llamacpp:n_tokens_max"):
        assert name in m0, name
    r = http.post("/v1/completions", json={"prompt": "Counting tokens is fun", "max_tokens": 4,
                                           "temperature": 0}).json()
    t = r["timings"]
    m1 = _metrics(http)
    assert m1["llamacpp:prompt_tokens_total"] - m0["llamacpp:prompt_tokens_total"] == t["prompt_n"]
    assert m1["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"] == 4
    assert m1["llamacpp:predicted_tokens_seconds"] > 0
    assert m1["llamacpp:requests_processing"] == 0 and m1["llamacpp:requests_deferred"] == 0
    assert m1["tightfit:requests_total"] == m0["tightfit:requests_total"] + 1


# The tests below need a generation that is still running when the client acts (disconnects,
# queues a second request). The demo model can write hundreds of tokens a second on a fast CPU,
# so they pace it: each token takes at least PACE_S, whatever the machine.
PACE_S = 0.02


@pytest.fixture()
def paced(engine, monkeypatch):
    """The engine, generating at most one token per PACE_S (the pause is after each token)."""
    inner = engine.generate

    def generate(*args, **kwargs):
        gen = inner(*args, **kwargs)
        try:
            for ev in gen:
                yield ev
                if ev.token is not None:
                    time.sleep(PACE_S)
        finally:
            gen.close()

    monkeypatch.setattr(engine, "generate", generate)
    return engine


def _wait(cond, timeout=60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Never ending"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Never ending"}]})])
def test_disconnect_mid_stream_stops_generation(paced, http, server, path, body):
    m0 = _metrics(http)
    body = {**body, "max_tokens": 400, "stream": True, "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=60) as c2:
        with c2.stream("POST", path, json=body) as r:
            it = r.iter_lines()
            got = [next(it) for _ in range(4)]           # two events (each + blank line)
            assert got[0].startswith("data: ")
    # the connection is closed: the generation must stop well before 400 tokens
    assert _wait(lambda: _metrics(http)["tightfit:requests_cancelled_total"]
                 == m0["tightfit:requests_cancelled_total"] + 1), "generation was not cancelled"
    m1 = _metrics(http)
    assert m1["llamacpp:requests_processing"] == 0
    assert m1["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"] < 400
    r = http.post("/v1/completions", json={"prompt": "Next", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_disconnect_of_a_non_streamed_request(paced, http, server):
    m0 = _metrics(http)
    with pytest.raises(httpx.ReadTimeout):      # 480 paced tokens take >= 9.6 s
        httpx.post(server.url + "/v1/completions", timeout=1.0,
                   json={"prompt": "Long", "max_tokens": 480, "temperature": 0,
                         "repeat_penalty": 1.0})
    assert _wait(lambda: _metrics(http)["tightfit:requests_cancelled_total"]
                 == m0["tightfit:requests_cancelled_total"] + 1), "generation was not cancelled"
    assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


def test_health_while_loading_then_ready(engine):
    gate = threading.Event()

    def loader():
        gate.wait(30)
        return engine

    with _serve(loader=loader) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        err = _is_error(c.get("/health"), 503)
        assert err["message"] == "Loading model" and err["type"] == "unavailable_error"
        _is_error(c.post("/v1/chat/completions", json={"messages": MSGS}), 503)
        gate.set()
        assert _wait(lambda: c.get("/health").status_code == 200, 30)
        assert c.get("/health").json() == {"status": "ok"}
        assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 200


def test_load_failure_is_reported(engine):
    from tightfit.errors import GGUFError

    def loader():
        raise GGUFError("x.gguf: not a GGUF file")

    with _serve(loader=loader) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        assert _wait(lambda: c.get("/health").status_code == 500, 10)
        assert "not a GGUF file" in _is_error(c.get("/health"), 500)["message"]


def test_api_key(engine):
    with _serve(engine, api_key="s3cret") as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert c.get("/health").status_code == 200                       # public, as llama-server
        assert c.get("/v1/models").status_code == 200
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"}):
            err = _is_error(c.post("/v1/completions", json={"prompt": "a"}, headers=headers), 401)
            assert err["type"] == "authentication_error"
        _is_error(c.get("/metrics"), 401)
        ok = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1},
                    headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/metrics", headers={"X-Api-Key": "s3cret"}).status_code == 200


def test_full_queue_answers_503_with_retry_after(paced):
    with _serve(paced, queue_size=1) as srv:
        body = {"prompt": "Busy busy", "max_tokens": 150, "temperature": 0}
        results: list[httpx.Response] = []
        lock = threading.Lock()

        def call():
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
            with lock:
                results.append(r)

        first = threading.Thread(target=call)
        first.start()
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert _wait(lambda: _metrics(c)["llamacpp:requests_processing"] == 1, 30)
            second = threading.Thread(target=call)
            second.start()
            assert _wait(lambda: _metrics(c)["llamacpp:requests_deferred"] == 1, 30)
            r3 = c.post("/v1/completions", json=body)
            err = _is_error(r3, 503)
            assert int(r3.headers["Retry-After"]) > 0 and "busy" in err["message"]
            assert _metrics(c)["tightfit:requests_rejected_total"] == 1
        first.join(120)
        second.join(120)
        assert [r.status_code for r in results] == [200, 200]
        assert results[0].json()["choices"][0]["text"] == results[1].json()["choices"][0]["text"]


def test_disconnect_while_queued_drops_the_request(paced, http, server):
    m0 = _metrics(http)
    done = []
    long = threading.Thread(target=lambda: done.append(httpx.post(
        server.url + "/v1/completions", json={"prompt": "Busy", "max_tokens": 120}, timeout=120)))
    long.start()
    assert _wait(lambda: _metrics(http)["llamacpp:requests_processing"] == 1, 30)
    body = {"messages": MSGS, "max_tokens": 5, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as c2:
        with c2.stream("POST", "/v1/chat/completions", json=body) as r:
            assert next(r.iter_lines()).startswith("data: ")      # the role chunk, sent at once
            assert _metrics(http)["llamacpp:requests_deferred"] == 1
    long.join(120)
    assert done[0].status_code == 200
    assert _wait(lambda: _metrics(http)["llamacpp:requests_deferred"] == 0, 30)
    m1 = _metrics(http)
    assert m1["tightfit:requests_total"] == m0["tightfit:requests_total"] + 1   # only the long one ran
    assert m1["llamacpp:requests_processing"] == 0
