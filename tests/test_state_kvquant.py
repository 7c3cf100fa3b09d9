"""The quantized KV cache on the CPU path (issue 11): `State(kv_type=...)` stores q8_0 / tq* bytes
natively (quantize on write at prefill and decode), the ReferenceModel reads them through
`kvquant.reference.attention_quant` (rotated-domain twin of the decode kernel), and
`--kv-type` / `tightfit.load(kv_type=)` select it.

Oracles: the FP16 cache path (`tightfit.load(..., kv_type="f16").logits`, itself checked against
llama.cpp in test_engine_api / test_reference_goldens); the float64 attention over the
dequantized cache in the original basis (`attention_quant_f64`); an uninterrupted run for the
snapshot / restore / session round trips."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tightfit
from tightfit.errors import UserError
from tightfit.kvquant.formats import get_format, kv_bytes_per_token, split_kv_type
from tightfit.kvquant.reference import (alloc_cache, attention_quant, attention_quant_f64,
                                        dequantize, write_rows)
from tightfit.model.generate import make_model
from tightfit.runtime.sampler import GREEDY
from tightfit.runtime.state import StateError

N_TOK = 128
# bars of issue 11, rms(logits - logits_f16) / std(logits_f16)
BAR = {"q8_0": 0.001, "tq3": 0.02}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)       # tiny matrices: one thread is faster on a busy 2-core box
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvstate")
    out = {}
    for preset in ("tiny", "small"):      # head_dim 32 and 128
        p = d / f"{preset}-F32.gguf"
        make_model(p, preset=preset, seed=1, qtype="F32", vocab="small:1000")
        out[preset] = str(p)
    return out


@pytest.fixture(scope="module")
def demo():
    from tightfit.model.demo import demo_model_path
    return str(demo_model_path())


def _dev(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    return float(np.sqrt(((got - ref) ** 2).mean()) / ref.std())


# ---- attention over the byte cache against the float64 oracle ------------------------------------
@pytest.mark.parametrize("kv_type", ["q8_0", "tq3", "tq4+tq2", "q8_0+tq3", "tq3+q8_0"])
def test_attention_quant_matches_f64_oracle(kv_type):
    g = torch.Generator().manual_seed(5)
    T, n, H, Hkv, D = 37, 6, 4, 2, 64
    kf, vf = (get_format(x) for x in split_kv_type(kv_type))
    kc, vc = alloc_cache(T, Hkv, D, kf), alloc_cache(T, Hkv, D, vf)
    write_rows(kc, vc, 0, torch.randn(T, Hkv, D, generator=g) * 2, torch.randn(T, Hkv, D, generator=g),
               kv_type)
    q = torch.randn(n, H, D, generator=g, dtype=torch.float64)
    p0 = T - n
    got = attention_quant(q, kc, vc, p0, kv_type)
    tiled = attention_quant(q, kc, vc, p0, kv_type, tile=5)      # online softmax across tiles
    for i in range(n):            # causal: query row i sees cache rows 0..p0+i
        want = attention_quant_f64(q[i], kc, vc, p0 + i + 1, kv_type)
        assert torch.allclose(got[i], want, rtol=0, atol=1e-10)
        assert torch.allclose(tiled[i], want, rtol=0, atol=1e-10)
    g32 = attention_quant(q.float(), kc, vc, p0, kv_type)
    assert g32.dtype == torch.float32 and (g32.double() - got).abs().max() < 1e-4


def test_decode_step_matches_kernel_torch_twin():
    pytest.importorskip("triton")
    from tightfit.kernels.attn_decode_q import attn_decode_q_ref, make_workspace
    g = torch.Generator().manual_seed(6)
    T, H, Hkv, D, kv_type = 21, 4, 2, 64, "q8_0+tq3"
    kc, vc = alloc_cache(T, Hkv, D, "q8_0"), alloc_cache(T, Hkv, D, "tq3")
    write_rows(kc, vc, 0, torch.randn(T, Hkv, D, generator=g), torch.randn(T, Hkv, D, generator=g),
               kv_type)
    q = torch.randn(H, D, generator=g)
    qg = torch.cat([q, torch.zeros(H, D)], -1)             # gate 0: sigmoid = 1/2
    out = torch.empty(H, D)
    ws = make_workspace(kv_type, H, D, T)
    attn_decode_q_ref(q, kc, vc, qg, out, torch.tensor([0, 0, T - 1]), ws)
    got = attention_quant(q[None], kc, vc, T - 1, kv_type)[0] * 0.5
    assert (got - out).abs().max() < 1e-5


# ---- the State stores bytes ---------------------------------------------------------------------
def test_state_stores_bytes_and_reads_them_back(files):
    eng = tightfit.load(files["tiny"], n_ctx=64, kv_type="q8_0+tq3")
    st = eng.new_state()
    c = eng.config
    assert st.kv_type == "q8_0+tq3" and st.kv_dtype == torch.uint8
    eng.model.forward(list(range(1, 20)), st, logits="none")
    il = c.attention_ids[0]
    kb, vb = st.kv_bytes(il, st.pos)
    assert kb.dtype == torch.uint8 and kb.shape == (19, c.n_head_kv, get_format("q8_0").row_bytes(c.head_dim))
    assert vb.shape[-1] == get_format("tq3").row_bytes(c.head_dim)
    k, v = st.kv(il, st.pos)              # dequantized view for inspection
    assert torch.equal(v, dequantize(vb, "tq3", c.head_dim, dtype=st.dtype))
    per_tok = kv_bytes_per_token("q8_0+tq3", c.n_head_kv, c.head_dim, len(c.attention_ids))
    kv_bytes = sum(t.numel() for t in st._k + st._v)
    assert kv_bytes == st._cap * per_tok


def test_bad_kv_type_is_a_user_error(files):
    with pytest.raises(UserError, match="q9"):
        tightfit.load(files["tiny"], n_ctx=64, kv_type="q9")
    with pytest.raises(UserError, match="divisible by 128"):
        tightfit.load(files["tiny"], n_ctx=64, kv_type="tq3_128")      # head_dim 32


# ---- logits against the FP16 cache ----------------------------------------------------------------
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_logits_vs_f16_cache(files, preset):
    toks = torch.randint(0, 1000, (N_TOK,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = tightfit.load(files[preset], n_ctx=256, kv_type="f16").logits(toks)
    dev = {t: _dev(tightfit.load(files[preset], n_ctx=256, kv_type=t).logits(toks), ref)
           for t in ("q8_0", "tq4", "tq3", "q8_0+tq3")}
    print(f"\n{preset}: rms(logits - logits_f16) / std:", {k: round(v, 5) for k, v in dev.items()})
    assert dev["q8_0"] <= BAR["q8_0"]
    assert dev["tq3"] <= BAR["tq3"]
    assert dev["q8_0"] < dev["tq4"] < dev["tq3"]
    assert dev["q8_0+tq3"] < dev["tq3"]


def test_chunked_prefill_equals_one_forward(files):
    eng = tightfit.load(files["small"], n_ctx=128, kv_type="tq3")
    toks = list(range(3, 60))
    a = eng.model.forward(toks, eng.new_state(), logits="all")
    st = eng.new_state()
    parts = [eng.model.forward(toks[i:j], st, logits="all") for i, j in ((0, 17), (17, 40), (40, 57))]
    assert (torch.cat(parts) - a).abs().max() <= 1e-4 * a.std()


# ---- generation, snapshots, prompt cache -------------------------------------------------------
def test_greedy_q8_0_equals_f16_on_demo(demo):
    ids = {}
    for kt in ("f16", "q8_0"):
        eng = tightfit.load(demo, n_ctx=256, kv_type=kt)
        ev = list(eng.generate("The quick brown fox jumps over the lazy dog", max_tokens=32,
                               sampling=GREEDY))
        ids[kt] = ev[-1].tokens
    assert len(ids["f16"]) == 32
    assert ids["q8_0"] == ids["f16"]


@pytest.mark.parametrize("kv_type", ["tq3", "q8_0+tq3"])
def test_snapshot_restore_round_trip(files, kv_type):
    eng = tightfit.load(files["small"], n_ctx=128, kv_type=kv_type)
    m = eng.model
    prompt, cont = list(range(5, 35)), [7, 8, 9, 10]
    # uninterrupted run: the oracle
    st = eng.new_state()
    m.forward(prompt, st, logits="none")
    want = [m.forward([t], st) for t in cont]
    # self-contained snapshot (prompt-cache entry) into a fresh state
    st = eng.new_state()
    m.forward(prompt, st, logits="none")
    snap = st.snapshot(include_kv=True)
    assert snap.kv_type == kv_type and snap.kv[0][0].dtype == torch.uint8
    m.forward([99, 98, 97], st, logits="none")           # overwrite rows 30..32 with other tokens
    st2 = eng.new_state()
    st2.restore(snap)
    assert [torch.equal(a, b) for a, b in zip(st2.kv_bytes(eng.config.attention_ids[0], 30),
                                               snap.kv[0])] == [True, True]
    got = [m.forward([t], st2) for t in cont]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # speculative pattern: snapshot without KV, draft, restore into the same state
    st.restore(snap)
    s0 = st.snapshot()
    m.forward([1, 2, 3], st, logits="none")
    st.restore(s0)
    assert all(torch.equal(m.forward([t], st), w) for t, w in zip(cont, want))
    # truncate keeps the bytes below the cut
    st.truncate(st.pos)
    assert st.nbytes() > 0
    # formats must match
    f16 = tightfit.load(files["small"], n_ctx=128, kv_type="f16").new_state()
    with pytest.raises(StateError, match="stored as"):
        f16.restore(snap)


def test_session_prompt_cache_with_quantized_cache(demo):
    from tightfit.runtime.session import Session
    eng = tightfit.load(demo, n_ctx=384, kv_type="tq3")
    conv = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three colours."}]
    s = Session(eng)
    evs = list(s.chat(conv, max_tokens=6, sampling=GREEDY))
    text1 = "".join(e.text for e in evs)
    conv2 = conv + [{"role": "assistant", "content": text1}, {"role": "user", "content": "More?"}]
    last2 = list(s.chat(conv2, max_tokens=6, sampling=GREEDY))[-1]
    assert last2.timings.cache_n > 0
    ids2 = eng.tokenizer.encode(eng.render_chat(conv2), add_special=True, parse_special=True)
    cold = list(eng.generate(ids2, max_tokens=6, sampling=GREEDY))[-1].tokens
    assert last2.tokens == cold


# ---- the CLI ------------------------------------------------------------------------------------
def test_cli_kv_type(demo):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    prompt = "1 2 3 4 5 6 7 8"
    r = subprocess.run([sys.executable, "-m", "tightfit.cli", "run", "-m", demo, "--prompt-ids", prompt,
                        "-n", "8", "--temp", "0", "--kv-type", "Q8_0", "--ignore-eos", "--show-ids"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    ids = [int(t) for t in [ln for ln in r.stderr.splitlines() if ln.startswith("ids: ")][-1][5:].split()]
    eng = tightfit.load(demo, n_ctx=256, kv_type="f16")
    want = list(eng.generate([int(t) for t in prompt.split()], max_tokens=8, sampling=GREEDY))[-1].tokens
    assert ids == want
    r = subprocess.run([sys.executable, "-m", "tightfit.cli", "run", "-m", demo, "-p", "x",
                        "--kv-type", "tq9"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "--kv-type tq9" in r.stderr and "Traceback" not in r.stderr
