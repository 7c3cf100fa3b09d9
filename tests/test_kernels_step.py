"""Decode-step kernels (norm.py, gdn.py, attn_decode.py) against their slow references, on tiny
random shapes under TRITON_INTERPRET=1 (CPU). The attention kernel is also checked against the
float64 oracle `attention_f64`."""
from __future__ import annotations

import pytest
import torch

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

from tightfit.kernels import attn_decode as A  # noqa: E402
from tightfit.kernels import gdn as G  # noqa: E402
from tightfit.kernels import norm as N  # noqa: E402

# the device follows how the kernels were built (possibly by an earlier test module), not the
# environment now: interpreted kernels take CPU tensors, compiled ones CUDA tensors
INTERP = _interp.interpreted(A, G, N)
pytestmark = pytest.mark.skipif(not INTERP and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")
DEV = "cpu" if INTERP else "cuda"


def _close(a, b, tol=1e-5):
    a, b = a.double().cpu(), b.double().cpu()
    err = (a - b).abs().max().item()
    scale = b.abs().max().item() + 1e-30
    assert err <= tol * scale, f"max err {err} vs scale {scale}"


@pytest.mark.parametrize("rows,n,delta", [(1, 64, True), (3, 300, True), (2, 2500, False)])
def test_add_rmsnorm(rows, n, delta):
    g = torch.Generator().manual_seed(rows * n)
    x = torch.randn(rows, n, generator=g).to(DEV)
    d = torch.randn(rows, n, generator=g).to(DEV) if delta else None
    w = torch.randn(n, generator=g).to(DEV)
    x2 = x.clone()
    o1, o2 = torch.empty_like(x), torch.empty_like(x)
    N.add_rmsnorm(x, d, w, 1e-6, o1)
    N.add_rmsnorm_ref(x2, d, w, 1e-6, o2)
    _close(x, x2)
    _close(o1, o2)


def test_swiglu_and_gated_rmsnorm():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 1500, generator=g).to(DEV), torch.randn(2, 1500, generator=g).to(DEV)
    o1, o2 = torch.empty_like(a), torch.empty_like(a)
    _close(N.swiglu(a, b, o1), N.swiglu_ref(a, b, o2))
    o, z = torch.randn(6, 16, generator=g).to(DEV), torch.randn(6, 16, generator=g).to(DEV)
    w = torch.randn(16, generator=g).to(DEV)
    r1, r2 = torch.empty_like(o), torch.empty_like(o)
    _close(N.gated_rmsnorm(o, z, w, 1e-6, r1), N.gated_rmsnorm_ref(o, z, w, 1e-6, r2))


@pytest.mark.parametrize("bad", [None, "nan", "inf", "a-last", "a-first-block-of-p3"])
def test_commit(bad):
    """The multi-program scan (here 40 programs over a, b of 5 + 35 blocks) finds one bad value
    wherever it is; the last program decides, and the counter word is back to 0 afterwards."""
    a = torch.randn(5 * N.COMMIT_BLOCK - 3).to(DEV)
    b = torch.randn(35 * N.COMMIT_BLOCK - 5).to(DEV)
    if bad in ("nan", "inf"):
        b[-13] = float(bad)
    elif bad == "a-last":
        a[-1] = float("nan")
    elif bad == "a-first-block-of-p3":
        a[3 * N.COMMIT_BLOCK] = float("-inf")
    s1 = torch.tensor([0, 0, 7, 0], dtype=torch.int32, device=DEV)
    s2 = s1.clone()
    N.commit(a, b, s1, 1)
    N.commit_ref(a, b, s2, 1)
    assert s1.tolist() == s2.tolist()
    assert s1.tolist() == ([1, 0, 8, 0] if bad is None else [0, 1, 7, 0])
    N.commit(a[:100], b[:7], s1, 2)        # one program; a second commit after the first
    N.commit_ref(a[:100], b[:7], s2, 2)
    assert s1.tolist() == s2.tolist()


def test_commit_many_programs_finite():
    """More blocks than COMMIT_PROGRAMS: programs loop; all finite commits."""
    n = (N.COMMIT_PROGRAMS + 7) * N.COMMIT_BLOCK
    a, b = torch.zeros(n).to(DEV), torch.ones(3).to(DEV)
    a[-2] = float("inf")
    s = torch.tensor([1, 0, 0, 0], dtype=torch.int32, device=DEV)
    N.commit(a, b, s, 1)
    assert s.tolist() == [1, 1, 0, 0]
    a[-2] = 0.0
    s = torch.tensor([1, 0, 0, 0], dtype=torch.int32, device=DEV)
    N.commit(a, b, s, 3)
    assert s.tolist() == [0, 0, 3, 0]


@pytest.mark.parametrize("active", [0, 1])
def test_gdn_step(active):
    g = torch.Generator().manual_seed(3 + active)
    Hk, Hv, S, K, nrec, slot = 2, 6, 16, 4, 3, 1
    C = 2 * Hk * S + Hv * S
    conv = torch.randn(2, nrec, K - 1, C, generator=g).to(DEV)
    ssm = (0.3 * torch.randn(2, nrec, Hv, S, S, generator=g)).to(DEV)
    u = torch.randn(C, generator=g).to(DEV)
    w = torch.randn(C, K, generator=g).to(DEV)
    status = torch.tensor([active, 0, 5, 0], dtype=torch.int32, device=DEV)
    conv2, ssm2 = conv.clone(), ssm.clone()
    y1, y2 = torch.empty(C, device=DEV), torch.empty(C, device=DEV)
    G.conv_step(u, conv, w, y1, status, slot)
    G.conv_step_ref(u, conv2, w, y2, status, slot)
    _close(y1, y2)
    _close(conv, conv2)
    alpha, beta = torch.randn(Hv, generator=g).to(DEV), torch.randn(Hv, generator=g).to(DEV)
    dtb = torch.randn(Hv, generator=g).to(DEV)
    ssm_a = -torch.rand(Hv, generator=g).to(DEV) * 2
    alpha[0] = 30.0   # softplus' linear branch
    o1, o2 = torch.empty(Hv, S, device=DEV), torch.empty(Hv, S, device=DEV)
    G.gdn_step(y1, alpha, beta, dtb, ssm_a, ssm, o1, status, slot, Hk, 1e-6, BV=8)
    G.gdn_step_ref(y1, alpha, beta, dtb, ssm_a, ssm2, o2, status, slot, Hk, 1e-6)
    _close(o1, o2, 1e-5)
    _close(ssm, ssm2, 1e-5)
    assert torch.equal(ssm[active], ssm2[active])    # the active bank is only read


def test_qk_prep():
    g = torch.Generator().manual_seed(5)
    H, Hkv, D, n_rot, cap, pos = 4, 2, 32, 8, 40, 37
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    cos, sin = A.rope_tables(cap, n_rot, 1e4, mask, device=DEV)
    qg = torch.randn(H, 2 * D, generator=g).to(DEV)
    k, v = torch.randn(Hkv * D, generator=g).to(DEV), torch.randn(Hkv * D, generator=g).to(DEV)
    qn, kn = torch.randn(D, generator=g).to(DEV), torch.randn(D, generator=g).to(DEV)
    kc1 = torch.zeros(cap, Hkv, D, dtype=torch.float16, device=DEV)
    vc1, kc2, vc2 = kc1.clone(), kc1.clone(), kc1.clone()
    q1, q2 = torch.empty(H, D, device=DEV), torch.empty(H, D, device=DEV)
    st = torch.tensor([0, 0, pos, 0], dtype=torch.int32, device=DEV)
    A.qk_prep(qg, k, v, qn, kn, cos, sin, kc1, vc1, q1, st, 1e-6)
    A.qk_prep_ref(qg, k, v, qn, kn, cos, sin, kc2, vc2, q2, st, 1e-6)
    _close(q1, q2)
    _close(kc1.float(), kc2.float(), 1e-3)
    assert torch.equal(vc1, vc2)
    # the reference model's RoPE (outside this module) agrees at that position
    from tightfit.model.reference import imrope_pair_uses_position  # noqa: F401


@pytest.mark.parametrize("T,n_chunks,chunk", [(1, 1, 512), (45, 1, 512), (70, 3, 32), (64, 4, 16)])
def test_attn_decode(T, n_chunks, chunk):
    g = torch.Generator().manual_seed(T + n_chunks)
    H, Hkv, D, cap = 6, 2, 32, 96
    q = torch.randn(H, D, generator=g).to(DEV) * 2
    kc = torch.randn(cap, Hkv, D, generator=g).to(torch.float16).to(DEV)
    vc = torch.randn(cap, Hkv, D, generator=g).to(torch.float16).to(DEV)
    qg = torch.randn(H, 2 * D, generator=g).to(DEV)
    st = torch.tensor([0, 0, T - 1, 0], dtype=torch.int32, device=DEV)
    out = torch.empty(H, D, device=DEV)
    ws = A.make_workspace(H, D, cap, chunk, device=DEV)
    A.attn_decode(q, kc, vc, qg, out, st, ws, n_chunks=n_chunks, chunk=chunk, BT=16)
    want = A.attention_f64(q.cpu(), kc[:T].cpu(), vc[:T].cpu(), qg[:, D:].cpu())
    _close(out, want, 2e-6)
    out2 = torch.empty_like(out)
    A.attn_decode_ref(q, kc, vc, qg, out2, st)
    _close(out2, want, 2e-6)


@pytest.mark.parametrize("nl", [2, 3, 8])
@pytest.mark.parametrize("T", [1, 20, 70, 96])
def test_attn_decode_even_split(monkeypatch, T, nl):
    """Split-K with nl programs per KV head sharing T evenly (rows per program computed on the
    device from T, SPLIT_CFG nl > 0) against the float64 oracle, at positions where the rows
    per program are below, at and above the chunk, and with more programs than T needs."""
    monkeypatch.setenv(A.CFG_ENV, f"nl={nl}")
    g = torch.Generator().manual_seed(T * 7 + nl)
    H, Hkv, D, cap, chunk = 6, 2, 32, 96, 16
    q = torch.randn(H, D, generator=g).to(DEV) * 2
    kc = torch.randn(cap, Hkv, D, generator=g).to(torch.float16).to(DEV)
    vc = torch.randn(cap, Hkv, D, generator=g).to(torch.float16).to(DEV)
    qg = torch.randn(H, 2 * D, generator=g).to(DEV)
    st = torch.tensor([0, 0, T - 1, 0], dtype=torch.int32, device=DEV)
    out = torch.full((H, D), float("nan"), device=DEV)
    ws = A.make_workspace(H, D, cap, chunk, device=DEV)
    for t in ws:                 # a partial the reduce reads but no program wrote shows up
        t.fill_(float("nan"))
    A.attn_decode(q, kc, vc, qg, out, st, ws, n_chunks=A.n_chunks_for(cap, chunk), chunk=chunk,
                  BT=16)
    want = A.attention_f64(q.cpu(), kc[:T].cpu(), vc[:T].cpu(), qg[:, D:].cpu())
    _close(out, want, 2e-6)


def test_split_cfg_env(monkeypatch):
    monkeypatch.setenv(A.CFG_ENV, "bt=64; nw=8 ;ns=3;nl=32")
    assert A.split_cfg() == {"bt": 64, "nw": 8, "ns": 3, "nl": 32}
    monkeypatch.setenv(A.CFG_ENV, "ns=0")                 # 0 = Triton's default stages
    assert A.split_cfg()["ns"] is None
    monkeypatch.setenv(A.CFG_ENV, "warps=8")
    with pytest.raises(ValueError, match="unknown key"):
        A.split_cfg()
