"""The GPU executor's logic (buffers, banks, status word, modes, prefill) run on the CPU: torch
reference ops, and once with the Triton kernels under TRITON_INTERPRET=1. Logits are compared
with the CPU ReferenceModel (tightfit/model/reference.py), the outside oracle of this module."""
from __future__ import annotations

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.api import open_model  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402
from tightfit.runtime.state import NonFiniteError  # noqa: E402

# interpreter-only tests follow how the kernels were built (possibly by an earlier test
# module), not the environment now
INTERP = _interp.interpreted("tightfit.kernels.gemv", "tightfit.kernels.norm",
                             "tightfit.kernels.attn_decode", "tightfit.kernels.gdn",
                             "tightfit.kernels.embed")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("exe") / "tiny-f32.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=7)
    mf = open_model(p)
    yield mf
    mf.close()


def _exe(mf, **kw):
    from tightfit.model.executor import GPUModel
    return GPUModel.from_model_file(mf, device="cpu", n_ctx=64, **kw)


def _close(a, b, tol=2e-4):
    a, b = np.asarray(a.detach().cpu(), np.float64), np.asarray(b.detach().cpu(), np.float64)
    err = np.abs(a - b).max()
    assert err <= tol * (np.abs(b).max() + 1e-9), f"max err {err}, scale {np.abs(b).max()}"


def test_logits_match_reference(tiny):
    ref = ReferenceModel.from_model_file(tiny)
    exe = _exe(tiny, use_triton=False)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, tiny.config.n_vocab, 9).tolist()
    rs, gs = ref.new_state(64), exe.new_state(64)
    _close(exe.forward(prompt, gs, logits="all"), ref.forward(prompt, rs, logits="all"))
    assert gs.pos == rs.pos == 9
    # state-only prefill then decode
    more = rng.integers(0, tiny.config.n_vocab, 5).tolist()
    assert exe.forward(more[:3], gs, logits="none").shape == (0, tiny.config.n_vocab)
    ref.forward(more[:3], rs, logits="none")
    _close(exe.forward(more[3:], gs, logits="last"), ref.forward(more[3:], rs, logits="last"))


def test_greedy_and_split_attention(tiny):
    """Greedy decode past SINGLE_PASS_MAX is impractical on CPU: shrink it so both attention
    modes run, with a small split-K chunk."""
    from tightfit.kernels import attn_decode as A
    ref = ReferenceModel.from_model_file(tiny)
    exe = _exe(tiny, use_triton=False, chunk=4)
    old = A.SINGLE_PASS_MAX
    A.SINGLE_PASS_MAX = 6
    try:
        rs, gs = ref.new_state(64), exe.new_state(64)
        tok_r = tok_g = 3
        for _ in range(14):
            lr = ref.forward([tok_r], rs, logits="last")
            lg = exe.forward([tok_g], gs, logits="last")
            _close(lg, lr)
            tok_r, tok_g = int(lr.argmax()), int(lg.argmax())
            assert tok_r == tok_g
    finally:
        A.SINGLE_PASS_MAX = old


def test_nonfinite_keeps_state(tiny):
    ref = ReferenceModel.from_model_file(tiny)
    exe = _exe(tiny, use_triton=False)
    rs, gs = ref.new_state(64), exe.new_state(64)
    exe.forward([1, 2, 3], gs, logits="none")
    ref.forward([1, 2, 3], rs, logits="none")
    snap = gs.snapshot()
    w = exe.vec["output_norm.weight"]
    keep = w[0].item()
    w[0] = float("nan")
    with pytest.raises(NonFiniteError):
        exe.forward([4], gs, logits="last")
    assert gs.pos == 3 and int(gs.status[2]) == 3
    after = gs.snapshot()
    for a, b in zip(snap.ssm + snap.conv, after.ssm + after.conv):
        assert torch.equal(a, b)
    w[0] = keep
    _close(exe.forward([4], gs, logits="last"), ref.forward([4], rs, logits="last"))


def test_triton_interpreter_step(tiny):
    """The same executor with the Triton kernels (interpreted) for a few tokens."""
    if not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    ref = ReferenceModel.from_model_file(tiny)
    exe = _exe(tiny, use_triton=True)
    assert exe.lin["blk.0.ffn_up.weight"].kind == "float"
    rs, gs = ref.new_state(64), exe.new_state(64)
    _close(exe.forward([5, 6, 7], gs, logits="all"), ref.forward([5, 6, 7], rs, logits="all"), 1e-4)


@pytest.mark.parametrize("qtype", ["Q4_K", "IQ4_XS", "Q6_K"])
def test_triton_interpreter_quant_routes(tmp_path, monkeypatch, qtype):
    """Quantized matrices through the decode step's GEMV routes (tightfit.kernels.gemv_route:
    the small-N dp4a path for Q4_K / IQ4_XS / Q6_K), interpreted, against the CPU
    ReferenceModel on the same file (its float64-exact dequantization is the outside oracle; the
    int8 activations of the GEMV give ~1 % relative error, as on the device)."""
    if not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    from tightfit.kernels.gemv_route import SMALL_TYPES, is_small
    p = tmp_path / f"small-{qtype}.gguf"
    make_model(p, preset="small", qtype=qtype, layers=4, seed=11)
    mf = open_model(p)
    try:
        ref = ReferenceModel.from_model_file(mf)
        exe = _exe(mf, use_triton=True)
        L = exe.lin["blk.0.ffn_up.weight"]
        assert L.kind == "quant" and is_small(L.layout) == (L.qtype in SMALL_TYPES)
        import tightfit.kernels.gemv_route as route
        calls = []
        real = route.gemv_act
        monkeypatch.setattr(route, "gemv_act", lambda act, *a, **k: calls.append(
            type(act).__name__) or real(act, *a, **k))
        rs, gs = ref.new_state(64), exe.new_state(64)
        toks = [5, 300]
        a = np.concatenate([np.asarray(exe.forward([t], gs, logits="all").detach().cpu(),
                                       np.float64) for t in toks])
        b = np.asarray(ref.forward(toks, rs, logits="all"), np.float64)
        assert calls and ("Act2" in calls) == (L.qtype in SMALL_TYPES)
        rel = np.abs(a - b).max() / np.abs(b).max()
        assert np.isfinite(a).all() and rel < 0.05, rel
        assert (a.argmax(-1) == b.argmax(-1)).mean() >= 1 / 2
    finally:
        mf.close()


def test_engine_greedy_fast_path_equals_the_host_sampler(tiny, monkeypatch):
    """Engine.generate's greedy fast path (GPUModel.greedy(tok, state, 1): the step's argmax read
    as one id) against the host sampler on the same executor (forward's row of logits, numpy
    argmax; the path the llama.cpp greedy goldens check): the same ids and text; the fast path is
    taken only without penalties; NaN logits still raise NonFiniteError and leave the state where
    it was."""
    from tightfit.model.executor import GPUModel
    from tightfit.runtime.engine import Engine
    from tightfit.runtime.sampler import SamplingParams
    from tightfit.tokenizer import from_gguf
    exe = _exe(tiny, use_triton=False)
    eng = Engine(tiny, exe, from_gguf(tiny.gguf.metadata), n_ctx=64)
    prompt = [5, 9, 2, 7]
    calls = []
    real = GPUModel.greedy
    monkeypatch.setattr(GPUModel, "greedy", lambda self, t, st, n: calls.append(t) or real(self, t, st, n))
    fast = list(eng.generate(prompt, max_tokens=20, sampling=SamplingParams(temperature=0)))
    assert len(calls) == len(fast[-1].tokens) - 1          # every token after the prefill's
    calls.clear()
    pen = list(eng.generate(prompt, max_tokens=6, sampling=SamplingParams(temperature=0,
                                                                           repeat_penalty=1.3)))
    assert calls == [] and pen[-1].tokens
    monkeypatch.delattr(GPUModel, "greedy")
    slow = list(eng.generate(prompt, max_tokens=20, sampling=SamplingParams(temperature=0)))
    assert fast[-1].tokens == slow[-1].tokens and len(slow[-1].tokens) == 20
    assert "".join(e.text for e in fast) == "".join(e.text for e in slow)
    # non-finite logits: the same error as forward, the state not advanced past the last good token
    monkeypatch.setattr(GPUModel, "greedy", real, raising=False)
    st = exe.new_state(64)
    exe.forward(prompt, st, logits="none")
    w = exe.vec["output_norm.weight"]
    keep = w[0].item()
    w[0] = float("nan")
    try:
        with pytest.raises(NonFiniteError):
            exe.greedy(3, st, 1)
        assert int(st.status[2]) == len(prompt)
    finally:
        w[0] = keep
