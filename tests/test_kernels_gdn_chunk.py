"""Chunked Gated DeltaNet (tightfit/kernels/gdn_chunk.py) against the token-by-token recurrence
and the executor's one-token step reference (tightfit/kernels/gdn.py), on fresh random inputs:
lengths 1, 31, 32, 33, 100 with chunk sizes that put boundaries at awkward positions, per-position
state rebuilding, and the causal conv continuing from stored rows (blocks shorter than K-1)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tightfit.kernels import gdn as G
from tightfit.kernels import gdn_chunk as GC


def _inputs(n, H, Dk, Dv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(n, H, Dk, generator=g, dtype=dtype), dim=-1) * Dk ** -0.5
    k = F.normalize(torch.randn(n, H, Dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(n, H, Dv, generator=g, dtype=dtype)
    lg = -3.0 * torch.rand(n, H, generator=g, dtype=dtype)   # log-decays, some strong
    beta = torch.rand(n, H, generator=g, dtype=dtype)
    S0 = torch.randn(H, Dk, Dv, generator=g, dtype=dtype)
    return q, k, v, lg, beta, S0


@pytest.mark.parametrize("n,chunk", [(1, 64), (31, 8), (32, 8), (33, 8), (33, 32), (100, 16),
                                     (7, 64)])
def test_chunked_matches_recurrence_f64(n, chunk):
    q, k, v, g, b, S0 = _inputs(n, 3, 16, 8, torch.float64, n * 31 + chunk)
    o1, s1, st = GC.gdn_recurrent_ref(q, k, v, g, b, S0, keep=True)
    o2, s2, kept = GC.chunk_gdn_torch(q, k, v, g, b, S0, chunk=chunk, keep=True)
    assert torch.allclose(o1, o2, atol=1e-12, rtol=0)
    assert torch.allclose(s1, s2, atol=1e-12, rtol=0)
    for j in range(n):
        assert torch.allclose(kept.state_at(j), st[j], atol=1e-12, rtol=0)
    o3, s3, none = GC.chunk_gdn_torch(q, k, v, g, b, S0, chunk=chunk, keep=False)
    assert none is None and torch.equal(o3, o2) and torch.equal(s3, s2)


def test_chunked_f32_long():
    q, k, v, g, b, S0 = _inputs(200, 4, 32, 32, torch.float32, 5)
    o1, s1, _ = GC.gdn_recurrent_ref(q.double(), k.double(), v.double(), g.double(), b.double(),
                                     S0.double())
    o2, s2, _ = GC.chunk_gdn_torch(q, k, v, g, b, S0, chunk=64)
    assert (o2.double() - o1).abs().max() < 1e-4 * o1.abs().max()
    assert (s2.double() - s1).abs().max() < 1e-4 * s1.abs().max()


def test_one_token_equals_step_reference():
    """n = 1 through conv + inputs + chunked rule == the executor's step references."""
    Hk, Hv, S, K = 2, 6, 16, 4
    C = 2 * Hk * S + Hv * S
    gen = torch.Generator().manual_seed(11)
    u = torch.randn(1, C, generator=gen)
    conv = torch.randn(2, 1, K - 1, C, generator=gen)
    ssm = torch.randn(2, 1, Hv, S, S, generator=gen)
    w = torch.randn(C, K, generator=gen)
    alpha, braw = torch.randn(1, Hv, generator=gen), torch.randn(1, Hv, generator=gen)
    dtb, ssa = torch.randn(Hv, generator=gen), -torch.rand(Hv, generator=gen)
    status = torch.zeros(4, dtype=torch.int32)
    y_ref = torch.empty(C)
    G.conv_step_ref(u.view(-1), conv, w, y_ref, status, 0)
    o_ref = torch.empty(Hv, S)
    G.gdn_step_ref(y_ref, alpha, braw, dtb, ssa, ssm, o_ref, status, 0, Hk, 1e-6)
    y, hist = GC.causal_conv(u, conv[0, 0], w)
    assert torch.allclose(y[0], y_ref, atol=1e-6)
    assert torch.equal(hist[-(K - 1):], conv[1, 0])
    q, k, v, g, b = GC.gdn_inputs(y, alpha, braw, dtb, ssa, Hk, Hv, S, 1e-6)
    o, s_end, _ = GC.chunk_gdn(q, k, v, g, b, ssm[0, 0])
    assert torch.allclose(o[0], o_ref, atol=1e-5)
    assert torch.allclose(s_end, ssm[1, 0], atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 3, 9])
def test_causal_conv(n):
    gen = torch.Generator().manual_seed(n)
    C, K = 10, 4
    u, prev, w = torch.randn(n, C, generator=gen), torch.randn(K - 1, C, generator=gen), \
        torch.randn(C, K, generator=gen)
    y, hist = GC.causal_conv(u, prev, w)
    y2, hist2 = GC.causal_conv_ref(u, prev, w)
    assert torch.allclose(y, y2, atol=1e-6) and torch.equal(hist, hist2)
    # token by token through the step reference gives the same outputs and final rows
    conv = torch.stack([prev, torch.zeros_like(prev)])[:, None]
    status = torch.zeros(4, dtype=torch.int32)
    for t in range(n):
        yt = torch.empty(C)
        G.conv_step_ref(u[t], conv, w, yt, status, 0)
        assert torch.allclose(yt, y[t], atol=1e-6)
        # conv state after token t is rows t+1..t+K-1 of the window
        assert torch.equal(conv[1, 0], hist[t + 1:t + K])
        conv[0, 0] = conv[1, 0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla-core runs on the GPU only")
def test_fla_matches_recurrence():                                     # pragma: no cover
    if not GC._fla_available():
        pytest.skip("fla-core not installed")
    q, k, v, g, b, S0 = (t.cuda() for t in _inputs(300, 4, 64, 64, torch.float32, 9))
    o0, s0, _ = GC.gdn_recurrent_ref(*(t.double() for t in (q, k, v, g, b, S0)))
    o2, s2, _ = GC.chunk_gdn_fla(q, k, v, g, b, S0)
    assert (o2.double() - o0).abs().max() < 2e-2 * o0.abs().max()
    assert (s2.double() - s0).abs().max() < 2e-2 * s0.abs().max()
    o1, s1, _ = GC.chunk_gdn_torch(q, k, v, g, b, S0)
    assert (o1 - o2).abs().max() < 2e-2 * o1.abs().max()


def _fake_fla_060(calls):
    """A stand-in with fla-core 0.6.0's documented contract (read from its wheel, not its code):
    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; initial_state [N, HV, K, V]; V head hv
    reads q/k head hv // (HV // H); `scale` multiplies q; passing head_first at all raises.
    Computes with the float64 token loop, written here on the [B, T, H, ...] layout."""
    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False,
                               use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                               state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                               chunk_indices=None, cp_context=None, **kwargs):
        calls.append(sorted(kwargs))
        if "head_first" in kwargs:
            raise DeprecationWarning("head_first has been removed. Inputs must be in "
                                     "`[B, T, H, ...]` format.")
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        assert k.shape == q.shape and v.shape[:2] == (B, T) and HV % H == 0
        assert g.shape == beta.shape == (B, T, HV)
        assert initial_state.shape == (B, HV, K, V) and not state_v_first
        scale = K ** -0.5 if scale is None else scale
        S = initial_state.double().clone()
        o = torch.empty(B, T, HV, V, dtype=torch.float64)
        for t in range(T):
            for hv in range(HV):
                h = hv // (HV // H)
                qt, kt = q[:, t, h].double() * scale, k[:, t, h].double()
                S[:, hv] *= torch.exp(g[:, t, hv].double())[:, None, None]
                u = beta[:, t, hv, None].double() * (v[:, t, hv].double()
                                                     - torch.einsum("bk,bkv->bv", kt, S[:, hv]))
                S[:, hv] += kt[:, :, None] * u[:, None, :]
                o[:, t, hv] = torch.einsum("bk,bkv->bv", qt, S[:, hv])
        return o.to(q.dtype), (S.float() if output_final_state else None)
    return chunk_gated_delta_rule


def test_fla_call_contract(monkeypatch):
    """chunk_gdn_fla against fla-core 0.6.0's API (head_first removed, [B, T, H, ...] inputs),
    through a stand-in module: the result must equal the recurrence (CPU, float32)."""
    import sys
    import types
    calls = []
    mod = types.ModuleType("fla.ops.gated_delta_rule")
    mod.chunk_gated_delta_rule = _fake_fla_060(calls)
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", mod)
    q, k, v, g, b, S0 = _inputs(11, 4, 8, 6, torch.float32, 3)
    o0, s0, _ = GC.gdn_recurrent_ref(*(t.double() for t in (q, k, v, g, b, S0)))
    o, s, kept = GC.chunk_gdn_fla(q, k, v, g, b, S0)
    assert calls == [[]] and kept is None
    assert o.shape == (11, 4, 6) and s.shape == (4, 8, 6)
    assert (o.double() - o0).abs().max() < 1e-5 * o0.abs().max()
    assert (s.double() - s0).abs().max() < 1e-5 * s0.abs().max()
    # an older release whose signature still names head_first gets head_first=False
    assert GC._fla_kwargs(lambda q, k, v, g, beta, head_first=True: None) == {"head_first": False}
    assert GC._fla_kwargs(mod.chunk_gated_delta_rule) == {
        "use_qk_l2norm_in_kernel": False, "use_beta_sigmoid_in_kernel": False,
        "state_v_first": False}


def _wheel_signature():
    """chunk_gated_delta_rule's signature as written in the fla-core 0.6.0 wheel of .whl (read
    with ast: fla imports need a GPU), as a stub function; None when the wheel is absent."""
    import ast
    import zipfile
    from pathlib import Path
    whl = Path(__file__).resolve().parents[1] / ".whl" / "fla_core-0.6.0-py3-none-any.whl"
    if not whl.exists():
        return None
    src = zipfile.ZipFile(whl).read("fla/ops/gated_delta_rule/chunk.py").decode()
    fn = next(n for n in ast.parse(src).body
              if isinstance(n, ast.FunctionDef) and n.name == "chunk_gated_delta_rule")
    stub = ast.FunctionDef(name="f", args=fn.args, body=[ast.Pass()], decorator_list=[],
                           returns=None)
    if "type_params" in ast.FunctionDef._fields:     # Python >= 3.12
        stub.type_params = []
    for a in fn.args.args + fn.args.kwonlyargs:
        a.annotation = None
    mod = ast.fix_missing_locations(ast.Module(body=[stub], type_ignores=[]))
    ns: dict = {}
    exec(compile(mod, "fla-wheel-signature", "exec"), ns)
    return ns["f"]


def test_fla_wheel_signature():
    """The real 0.6.0 signature (from the wheel): the positional order q, k, v, g, beta, the
    keywords chunk_gdn_fla passes exist, no head_first, and the math-changing flags are off."""
    import inspect
    f = _wheel_signature()
    if f is None:
        pytest.skip("fla-core wheel not in .whl")
    params = list(inspect.signature(f).parameters)
    assert params[:5] == ["q", "k", "v", "g", "beta"]
    for kw in ("scale", "initial_state", "output_final_state"):
        assert kw in params
    kw = GC._fla_kwargs(f)
    assert "head_first" not in kw
    assert kw == {"use_qk_l2norm_in_kernel": False, "use_beta_sigmoid_in_kernel": False,
                  "state_v_first": False}


def test_gdn_backend_selection(monkeypatch):
    """fla by default on CUDA when it imports; torch on the CPU, with TIGHTFIT_GDN=torch, when
    fla is missing, or after a failed fla call (which falls back to the torch result)."""
    monkeypatch.setitem(GC._FLA_STATE, "import", True)
    monkeypatch.setitem(GC._FLA_STATE, "failed", None)
    monkeypatch.delenv("TIGHTFIT_GDN", raising=False)
    assert GC.gdn_backend("cuda") == "fla" and GC.gdn_backend("cpu") == "torch"
    monkeypatch.setenv("TIGHTFIT_GDN", "torch")
    assert GC.gdn_backend("cuda") == "torch"
    monkeypatch.setenv("TIGHTFIT_GDN", "fla")
    assert GC.gdn_backend("cuda") == "fla"
    monkeypatch.setitem(GC._FLA_STATE, "import", False)
    assert GC.gdn_backend("cuda") == "torch"
    # a failing fla call: warning, torch result, torch from then on
    monkeypatch.setitem(GC._FLA_STATE, "import", True)
    monkeypatch.setattr(GC, "gdn_backend", lambda device="cuda": "fla"
                        if GC._FLA_STATE["failed"] is None else "torch")

    def boom(*a, **k):
        raise TypeError("unexpected keyword argument")
    monkeypatch.setattr(GC, "chunk_gdn_fla", boom)
    q, k, v, g, b, S0 = _inputs(9, 2, 8, 4, torch.float32, 4)
    with pytest.warns(RuntimeWarning):
        o, s, _ = GC.chunk_gdn(q, k, v, g, b, S0)
    o2, s2, _ = GC.chunk_gdn_torch(q, k, v, g, b, S0)
    assert torch.equal(o, o2) and torch.equal(s, s2)
    assert GC._FLA_STATE["failed"] and GC.gdn_backend() == "torch"


def test_workspace_estimate_positive():
    assert GC.workspace_bytes(2048, 48, 128, 128) > 0
    assert GC.gdn_backend("cpu") == "torch"
