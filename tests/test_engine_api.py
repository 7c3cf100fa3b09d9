"""The Python API (`tightfit.load`) on a tiny F32 file, against llama.cpp's recorded logits and
greedy ids (tests/goldens), plus streaming/stop behaviour of `generate` and `chat`."""
import json
from pathlib import Path

import numpy as np
import pytest

import tightfit
from tightfit.errors import UserError
from tightfit.model.generate import make_model, sha256_file
from tightfit.runtime.sampler import SamplingParams

# The golden files' bytes include the shared vocabulary fixture and chat template: without the
# shared folder the regenerated files cannot match what llama.cpp saw.
_SHARED = __import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared"
pytestmark = pytest.mark.skipif(not (_SHARED / "fixtures" / "Qwen3.5-4B.jinja").exists(),
                                reason=f"shared fixtures (vocabulary, chat template) not found at {_SHARED}")


ROOT = Path(__file__).resolve().parents[1]
MANIFEST = json.loads((ROOT / "tests" / "goldens" / "manifest.json").read_text())
CASE = next(c for c in MANIFEST["cases"] if c["id"] == "tiny-F32")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "tiny-F32.gguf"
    make_model(path, **CASE["args"])
    assert sha256_file(path) == CASE["sha256"]
    return tightfit.load(path, device="cpu", n_ctx=256, kv_type="f32")


def test_logits_match_llama_cpp(engine):
    gold = np.load(ROOT / "tests" / "goldens" / "tiny-F32.npz")
    tokens = [int(t) for t in MANIFEST["tokens"]]
    ours = engine.logits(tokens)
    ref = gold["logits"]
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert np.abs(ours - ref).max() <= 1e-3 * ref.std()


def test_generate_greedy_matches_llama_cpp_and_streams_text(engine):
    g = CASE["greedy"]
    events = list(engine.generate(g["prompt"], max_tokens=len(g["ids"]), sampling=SamplingParams(temperature=0)))
    last = events[-1]
    eos = set(engine.tokenizer.eos_ids)
    expect = g["ids"]
    if any(t in eos for t in expect):          # generation stops at an end-of-generation token
        expect = expect[: next(i for i, t in enumerate(expect) if t in eos) + 1]
    assert last.tokens == expect
    text = "".join(e.text for e in events)
    body = [t for t in expect if t not in eos]
    assert text == engine.tokenizer.decode(body)
    assert last.timings.predicted_n == len(expect) and last.finish_reason in ("length", "stop")


def test_stop_string_cuts_the_text(engine):
    g = CASE["greedy"]
    full = "".join(e.text for e in engine.generate(g["prompt"], max_tokens=20, sampling=SamplingParams(temperature=0)))
    stop = full[5:8]
    assert stop
    evs = list(engine.generate(g["prompt"], max_tokens=20, sampling=SamplingParams(temperature=0), stop=[stop]))
    assert "".join(e.text for e in evs) == full[: full.find(stop)]
    assert evs[-1].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(engine):
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123)
    a = list(engine.generate([5, 6, 7], max_tokens=16, sampling=p))[-1].tokens
    b = list(engine.generate([5, 6, 7], max_tokens=16, sampling=p))[-1].tokens
    assert a == b


def test_chat_renders_the_template(engine):
    text = engine.render_chat([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    evs = list(engine.chat([{"role": "user", "content": "hi"}], max_tokens=3))
    assert evs[-1].timings.prompt_n == len(engine.tokenizer.encode(text, parse_special=True))


@pytest.mark.parametrize("bad", [[], [10**7], "", [-1]])
def test_bad_prompts_are_user_errors(engine, bad):
    with pytest.raises(UserError):
        list(engine.generate(bad, max_tokens=2))


def test_prompt_longer_than_context(engine):
    with pytest.raises(UserError, match="context"):
        list(engine.generate(list(range(300)), max_tokens=2))
