"""`tightfit serve --spec ngram,suffix` as a user runs it (a CLI subprocess on 127.0.0.1), through
the official `openai` client. Oracles: the same requests against a plain server (no --spec) on the
same demo model, greedy (identical text and token counts); the counters on /metrics are checked
against the per-response `timings` (draft_n, draft_n_accepted, draft_rounds, spec_rounds)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
N_CTX = 768
PROMPTS = ["one two three one two three one two three one two",
           "<|im_start|>user\nRepeat after me: abc abc abc abc<|im_end|>\n<|im_start|>assistant\n",
           "The quick brown fox jumps over the lazy dog."]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_path():
    from tightfit.model.demo import demo_model_path
    return str(demo_model_path())


@pytest.fixture(scope="module")
def plain(model_path):
    from tightfit.runtime.loader import load_engine
    from tightfit.server.app import ServerThread, create_app
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng = load_engine(model_path, n_ctx=N_CTX)
    with ServerThread(create_app(eng, model_id="demo")) as srv:
        yield srv.url
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def spec(model_path):
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "tightfit.cli", "serve", "-m", model_path,
                             "--port", str(port), "-c", str(N_CTX), "--alias", "demo",
                             "--spec", "ngram,suffix", "--draft-max", "6", "--log-level", "warning"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 90:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        else:
            pytest.fail("the --spec server never became ready")
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def _metrics(url) -> dict:
    out: dict = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            key = s.name + ("" if not s.labels else "{" + ",".join(
                f"{k}={v}" for k, v in sorted(s.labels.items())) + "}")
            out[key] = s.value
    return out


def _per_pos(m: dict) -> dict[int, float]:
    pre = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="
    return {int(k[len(pre):-1]): v for k, v in m.items() if k.startswith(pre)}


def test_greedy_identical_with_and_without_spec_and_counters_consistent(plain, spec):
    assert httpx.get(spec + "/props", timeout=10).json()["speculative"]["drafters"] == ["ngram", "suffix"]
    assert httpx.get(plain + "/props", timeout=10).json()["speculative"] is None
    m0 = _metrics(spec)
    for k in ("llamacpp:spec_decode_num_draft_tokens_total",
              "llamacpp:spec_decode_num_accepted_tokens_total",
              "llamacpp:spec_decode_num_drafts_total"):
        assert k in m0
    sums = {"draft_n": 0, "draft_n_accepted": 0, "draft_rounds": 0, "decode": 0}
    per_pos: dict[int, int] = {}
    with _client(plain) as cp, _client(spec) as cs:
        timings = []
        for p in PROMPTS:
            a = cp.completions.create(model="demo", prompt=p, max_tokens=120, temperature=0)
            b = cs.completions.create(model="demo", prompt=p, max_tokens=120, temperature=0)
            assert b.choices[0].text == a.choices[0].text
            assert b.usage.completion_tokens == a.usage.completion_tokens
            assert b.choices[0].finish_reason == a.choices[0].finish_reason
            ta, tb = a.model_extra["timings"], b.model_extra["timings"]
            assert "draft_n" not in ta
            timings.append(tb)
        msgs = [{"role": "user", "content": "Say hi hi hi hi hi hi hi hi"}]
        for stream in (False, True):
            kw = dict(model="demo", messages=msgs, max_tokens=80, temperature=0,
                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            if stream:
                chunks = list(cs.chat.completions.create(stream=True, **kw))
                text_b = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                tb = chunks[-1].model_extra["timings"]
            else:
                b = cs.chat.completions.create(**kw)
                text_b, tb = b.choices[0].message.content, b.model_extra["timings"]
            a = cp.chat.completions.create(**kw)
            assert text_b == a.choices[0].message.content
            assert tb["predicted_n"] == a.usage.completion_tokens
            timings.append(tb)
    for t in timings:
        assert 0 <= t["draft_n_accepted"] <= t["draft_n"]
        sums["draft_n"] += t["draft_n"]
        sums["draft_n_accepted"] += t["draft_n_accepted"]
        sums["draft_rounds"] += t["draft_rounds"]
        sums["decode"] += (1 if t["prompt_n"] else 0) + t["spec_rounds"]
        for i, n in enumerate(t["accepted_per_pos"]):
            per_pos[i] = per_pos.get(i, 0) + n
    assert sums["draft_n_accepted"] > 20                   # the repetitive prompts draft well
    m1 = _metrics(spec)
    d = lambda k: m1[k] - m0.get(k, 0.0)                   # noqa: E731
    assert d("llamacpp:spec_decode_num_draft_tokens_total") == sums["draft_n"]
    assert d("llamacpp:spec_decode_num_accepted_tokens_total") == sums["draft_n_accepted"]
    assert d("llamacpp:spec_decode_num_drafts_total") == sums["draft_rounds"]
    assert d("llamacpp:n_decode_total") == sums["decode"]
    pp0, pp1 = _per_pos(m0), _per_pos(m1)
    got = {i: v - pp0.get(i, 0.0) for i, v in pp1.items()}
    assert {i: v for i, v in got.items() if v} == {i: v for i, v in per_pos.items() if v}
    assert sum(got.values()) == sums["draft_n_accepted"]
    assert got.get(0, 0) <= sums["draft_rounds"]
    assert all(got.get(i, 0) >= got.get(i + 1, 0) for i in range(len(got)))  # monotone in position


def test_suffix_cache_is_shared_across_requests(plain, spec):
    """A request the suffix cache has seen (an earlier request's output) drafts most of its reply."""
    p = "Zebra 17 quartz, violet: lamp?"
    with _client(plain) as cp, _client(spec) as cs:
        a = cp.completions.create(model="demo", prompt=p, max_tokens=100, temperature=0)
        first = cs.completions.create(model="demo", prompt=p, max_tokens=100, temperature=0)
        second = cs.completions.create(model="demo", prompt=p, max_tokens=100, temperature=0)
    assert first.choices[0].text == second.choices[0].text == a.choices[0].text
    t1, t2 = first.model_extra["timings"], second.model_extra["timings"]
    assert t2["cache_n"] > 0                                  # and the prompt cache too
    assert t2["draft_n_accepted"] > t1["draft_n_accepted"]
    assert t2["drafters"]["suffix"]["draft_n_accepted"] > t2["predicted_n"] // 2
    assert t2["spec_rounds"] < t1["spec_rounds"]


def test_bad_spec_flags_are_one_line_errors(model_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for args in (["--spec", "ngram,bogus"], ["--spec", "ngram", "--draft-max", "0"]):
        r = subprocess.run([sys.executable, "-m", "tightfit.cli", "serve", "-m", model_path,
                            "--port", "0", *args], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0
        assert "tightfit serve: error:" in r.stderr and "Traceback" not in r.stderr, r.stderr
