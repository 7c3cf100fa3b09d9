"""Programmatic dependent launch (tightfit.kernels.pdl, TIGHTFIT_PDL=1) of the decode step's
Triton kernels.

* Interpreted (TRITON_INTERPRET=1, CI): PDL is never on there, even with TIGHTFIT_PDL=1, and the
  kernels still match their references (float64 / torch oracles); every decode-step launcher
  passes PDL=<on> and launch_pdl=<on> together (a launch with the attribute but without the
  kernel's griddepcontrol.wait would race), checked by recording the launches.
* On an sm_90+ GPU: the executor's captured decode step on a small generated model gives
  bitwise-identical logits over 16 greedy tokens with TIGHTFIT_PDL=1 and =0, and both follow the
  torch reference executor (use_triton=False) to a loose tolerance.
* Offline (no GPU): `scripts/compile_check.py --pdl` compiles the PDL=True variants for sm_90
  and requires griddepcontrol.wait in their PTX (not run here: minutes on this machine).
"""
from __future__ import annotations

import pytest
import torch

import _interp

_interp.interpret_without_gpu()          # tests/_interp.py has the rule

from tightfit.kernels import attn_decode as A  # noqa: E402
from tightfit.kernels import gdn as G  # noqa: E402
from tightfit.kernels import norm as N  # noqa: E402
from tightfit.kernels import pdl  # noqa: E402

# how the kernels were built (possibly by an earlier test module), not the environment now
INTERP = _interp.interpreted(A, G, N)
interp_only = pytest.mark.skipif(not INTERP, reason="interpreter test (no GPU)")


# ---- (a) interpreter: off, and still correct ---------------------------------------------------
@interp_only
def test_never_enabled_under_interpreter(monkeypatch):
    monkeypatch.setenv("TIGHTFIT_PDL", "1")
    assert pdl._env_on()
    assert not pdl.enabled() and not pdl.enabled(torch.device("cpu"))
    assert pdl.triton_launch_kwargs() == {}


@interp_only
def test_kernels_match_references_with_env_on(monkeypatch):
    monkeypatch.setenv("TIGHTFIT_PDL", "1")
    g = torch.Generator().manual_seed(11)
    # add + RMSNorm with the fused int8 copy (layout 1) vs the unfused torch/float64 pair
    x, d, w = (torch.randn(1, 512, generator=g) for _ in range(3))
    x2 = x.clone()
    o1, o2 = torch.empty_like(x), torch.empty_like(x)
    qa = [(torch.empty(1, 512, dtype=torch.int8), torch.empty(1, 16),
           torch.empty(1, 32, dtype=torch.int32)) for _ in range(2)]
    N.add_rmsnorm(x, d, w.reshape(-1), 1e-6, o1, quant_out=qa[0], quant_layout=1)
    N.add_rmsnorm_ref(x2, d, w.reshape(-1), 1e-6, o2, quant_out=qa[1], quant_layout=1)
    assert torch.allclose(x, x2, rtol=0, atol=1e-6)
    assert torch.allclose(o1, o2, rtol=1e-5, atol=1e-5)
    # the fused int8 copy: the float64-normed reference may round a tie the other way
    assert (qa[0][0].float() - qa[1][0].float()).abs().max() <= 1
    assert torch.allclose(qa[0][1], qa[1][1], rtol=1e-5, atol=0)
    # one Gated DeltaNet step (state banks, status word) vs its torch reference
    Hk, Hv, S = 2, 4, 16
    y = torch.randn(2 * Hk * S + Hv * S, generator=g)
    al, be, dtb, sa = (torch.randn(Hv, generator=g) for _ in range(4))
    ssm = torch.randn(2, 2, Hv, S, S, generator=g)
    st = torch.tensor([1, 0, 5, 0], dtype=torch.int32)
    s1, s2 = ssm.clone(), ssm.clone()
    oa, ob = torch.empty(Hv, S), torch.empty(Hv, S)
    G.gdn_step(y, al, be, dtb, -sa.abs(), s1, oa, st, 1, Hk, 1e-6, BV=8)
    G.gdn_step_ref(y, al, be, dtb, -sa.abs(), s2, ob, st, 1, Hk, 1e-6)
    assert torch.allclose(oa, ob, rtol=1e-4, atol=1e-5)
    assert torch.allclose(s1, s2, rtol=1e-4, atol=1e-5)
    # split-K attention over T = 37 cached rows vs the float64 oracle
    H, Hkv, D, T = 4, 2, 32, 37
    q = torch.randn(H, D, generator=g)
    kc = torch.randn(48, Hkv, D, generator=g).half()
    vc = torch.randn(48, Hkv, D, generator=g).half()
    qg = torch.randn(H, 2 * D, generator=g)
    st = torch.tensor([0, 0, T - 1, 0], dtype=torch.int32)
    out = torch.empty(H, D)
    ws = A.make_workspace(H, D, 48, chunk=16)
    A.attn_decode(q, kc, vc, qg, out, st, ws=ws, n_chunks=3, chunk=16)
    want = A.attention_f64(q, kc[:T], vc[:T], qg[:, D:])
    assert torch.allclose(out.double(), want, rtol=1e-3, atol=1e-4)


def _launchers():
    """(name, call) of every decode-step launcher in the PDL modules, at tiny CPU shapes."""
    from tightfit.kernels import embed as EM
    from tightfit.kernels import kv_write_q as W
    from tightfit.kernels.gemv2 import gemv2_prepared
    from tightfit.kernels.gemv2_act import prep_act2
    from tightfit.kernels.gemv2_layout import MACRO
    from tightfit.kernels.quantize_act import quantize_act
    st = torch.zeros(4, dtype=torch.int32)
    x, w = torch.zeros(1, 256), torch.zeros(256)
    H, Hkv, D = 4, 2, 32
    qg, k = torch.zeros(H, 2 * D), torch.zeros(Hkv * D)
    cos, sin = torch.ones(16, 4), torch.zeros(16, 4)
    kc = torch.zeros(16, Hkv, D, dtype=torch.float16)
    q = torch.zeros(H, D)
    wsw = W.make_write_workspace("q8_0", Hkv, D)
    kq = torch.zeros(16, Hkv, 64, dtype=torch.uint8)
    act = prep_act2(torch.zeros(1, 2048), 32, 0, with_b=False)
    q8 = torch.zeros(64 * 8 * MACRO[8], dtype=torch.uint8)
    return [
        ("add_rmsnorm", lambda: N.add_rmsnorm(x, x, w, 1e-6, x.clone())),
        ("swiglu", lambda: N.swiglu(x, x, x.clone())),
        ("gated_rmsnorm", lambda: N.gated_rmsnorm(x.view(8, 32), x.view(8, 32),
                                                  torch.zeros(32), 1e-6, x.clone().view(8, 32))),
        ("commit", lambda: N.commit(x, x, st)),
        ("conv_step", lambda: G.conv_step(torch.zeros(64), torch.zeros(2, 1, 3, 64),
                                          torch.zeros(64, 4), torch.zeros(64), st, 0)),
        ("gdn_step", lambda: G.gdn_step(torch.zeros(128), torch.zeros(4), torch.zeros(4),
                                        torch.zeros(4), torch.zeros(4),
                                        torch.zeros(2, 1, 4, 16, 16), torch.zeros(4, 16), st, 0,
                                        2, 1e-6)),
        ("qk_prep", lambda: A.qk_prep(qg, k, k, torch.zeros(D), torch.zeros(D), cos, sin, kc,
                                      kc.clone(), q, st, 1e-6)),
        ("attn_decode", lambda: A.attn_decode(q, kc, kc, qg, q.clone(), st,
                                              ws=A.make_workspace(H, D, 16, chunk=8),
                                              n_chunks=2, chunk=8)),
        ("qk_prep_q", lambda: W.qk_prep_q(qg, k, k, torch.zeros(D), torch.zeros(D), cos, sin,
                                          kq, kq.clone(), q, st, 1e-6, wsw)),
        ("embed_f", lambda: EM.embed_rows(torch.zeros(1, dtype=torch.int64),
                                          torch.zeros(4 * 256 * 4, dtype=torch.uint8), 0, 256)),
        ("embed_q", lambda: EM.embed_rows(torch.zeros(1, dtype=torch.int64),
                                          torch.zeros(4 * 272, dtype=torch.uint8), 8, 256)),
        ("quantize_act", lambda: quantize_act(x, 1)),
        ("prep_act2", lambda: prep_act2(x, 32, 2, with_b=False)),
        ("gemv2_small+reduce", lambda: gemv2_prepared(act, q8, 8, 64, out=torch.zeros(1, 64),
                                                      config={"PATH": "dp4a"})),
    ]


_KERNELS = [(N, "_add_rmsnorm_kernel"), (N, "_swiglu_kernel"), (N, "_gated_rmsnorm_kernel"),
            (N, "_commit_kernel"), (G, "_conv_step_kernel"), (G, "_gdn_step_kernel"),
            (A, "_qk_prep_kernel"), (A, "_attn_kernel"), (A, "_reduce_kernel")]


def _more_kernels():
    from tightfit.kernels import embed, gemv2, gemv2_act, gemv2_small, kv_write_q, quantize_act
    return [(kv_write_q, "_qkv_write_kernel"), (embed, "_embed_q_kernel"),
            (embed, "_embed_f_kernel"), (quantize_act, "_quant_kernel"),
            (gemv2_act, "_prep_kernel"), (gemv2_small, "gemv2s_kernel"),
            (gemv2, "_reduce_kernel")]


@interp_only
@pytest.mark.parametrize("on", [False, True])
def test_launchers_pass_pdl_and_attribute_together(monkeypatch, on):
    """With pdl.enabled() forced (the interpreter never enables it), every launch carries the
    kernel's PDL constexpr and the launch attribute, both equal to it."""
    seen = []
    kernels = _KERNELS + _more_kernels()
    for mod, name in kernels:
        k = getattr(mod, name)
        assert "PDL" in k.arg_names, f"{name} has no PDL constexpr"
        monkeypatch.setattr(k, "run", lambda *a, _n=name, grid=None, warmup=False, **kw:
                            seen.append((_n, kw.get("PDL"), kw.get("launch_pdl"))))
    monkeypatch.setattr(pdl, "enabled", lambda device=None: on)
    for label, call in _launchers():
        n0 = len(seen)
        call()
        assert len(seen) > n0, f"{label}: no kernel launched"
    names = {n for n, _, _ in seen}
    assert names == {name for _, name in kernels}, names ^ {name for _, name in kernels}
    bad = [r for r in seen if r[1] is not on or r[2] is not on]
    assert not bad, bad


# ---- (c) device: the captured decode step, PDL on vs off ---------------------------------------
def _sm90() -> bool:
    return (torch.cuda.is_available() and not INTERP
            and torch.cuda.get_device_capability()[0] >= 9)


@pytest.fixture(scope="module")
def small_q4k(tmp_path_factory):
    from tightfit.api import open_model
    from tightfit.model.generate import make_model
    p = tmp_path_factory.mktemp("pdl") / "small-q4k.gguf"
    make_model(p, preset="small", layers=4, qtype="Q4_K", seed=21)
    mf = open_model(p)
    yield mf
    mf.close()


def _run(mf, n, toks=None, **kw):
    """Logits [n, vocab] of n decode steps (greedy from token 3, or teacher-forced `toks`)."""
    from tightfit.model.executor import GPUModel
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=64, batched=False, chunk=4, **kw)
    st = exe.new_state(64)
    out, t = [], 3
    with torch.no_grad():
        for i in range(n):
            exe.step_token(t if toks is None else toks[i], st, head=True)
            out.append(exe.logits.reshape(-1).clone())
            t = int(out[-1].argmax())
    torch.cuda.synchronize()
    st.sync()
    return torch.stack(out).cpu(), exe


@pytest.mark.skipif(not _sm90(), reason="needs an sm_90+ GPU (PDL)")
@pytest.mark.parametrize("gemv,fuse,kv", [("triton", "1", None), ("triton", "0", "q8_0"),
                                          ("auto", "0", None)])
def test_graph_step_bitwise_same_with_pdl(small_q4k, monkeypatch, gemv, fuse, kv):
    monkeypatch.setenv("TIGHTFIT_GEMV", gemv)
    monkeypatch.setenv("TIGHTFIT_FUSE_QUANT", fuse)
    # split-K attention after 8 cached rows (chunk 4), so both attention graphs are captured
    monkeypatch.setattr(A, "SINGLE_PASS_MAX", 8)
    kw = dict(kv_type=kv, device_embed=True)
    monkeypatch.setenv("TIGHTFIT_PDL", "0")
    off, exe = _run(small_q4k, 16, **kw)
    assert exe.use_graphs and not pdl.enabled(exe.device)
    monkeypatch.setenv("TIGHTFIT_PDL", "1")
    on, exe = _run(small_q4k, 16, **kw)
    assert pdl.enabled(exe.device)
    assert torch.isfinite(on).all()
    assert torch.equal(on, off), (on - off).abs().max().item()
    # both against the torch executor (dequantized weights, no int8 activations, no graphs),
    # teacher-forced on the same ids: catches a chain that is wrong the same way twice
    toks = [3] + on.argmax(-1).tolist()[:-1]
    monkeypatch.setenv("TIGHTFIT_PDL", "0")
    ref, _ = _run(small_q4k, 16, toks=toks, use_triton=False, use_graphs=False, kv_type=kv)
    err = (on - ref).abs().amax(-1)
    scale = ref.abs().amax(-1)
    assert (err <= 0.1 * scale).all(), (err / scale).max().item()
