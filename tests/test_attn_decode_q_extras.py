"""The work around the attention kernel in tightfit/kernels/attn_decode_q.py: `_qrot_kernel`
(q_rot = R q) and `_merge_out_kernel` (split-K merge + out = (o_rot R) * sigmoid(gate)) against
float64 math on their own inputs, and the whole call with the new kernels and with the former
launches (TIGHTFIT_ATTNQ_EXTRAS=old) against float64 attention over the same quantized bytes.

Tolerances: the two kernels are fp32 sums of D (rotation) or nv (merge) terms, ~1e-6 relative;
RTOL = 2e-5 of the output scale leaves room for that and fails on any wrong row, column, chunk or
weight (errors of order 1e-2 and up). Whole-call checks use TOL = 2e-3 of max |out|
(tests/test_kvquant_kernel.py: fp16 rounding of the K / V values inside the attention kernel)."""
from __future__ import annotations

import _interp

_interp.interpret_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.kernels import attn_decode_q as AQ  # noqa: E402
from tightfit.kvquant.formats import rotation_matrix  # noqa: E402
from _kv_cases import TOL, quant_kv_case  # noqa: E402

# how the kernels were built (at attn_decode_q's import, maybe by another test module), not the
# environment now: interpreted kernels need CPU tensors, compiled ones CUDA tensors
INTERP = _interp.interpreted(AQ)
DEV = _interp.device(AQ)
pytestmark = pytest.mark.skipif(not INTERP and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")
RTOL = 2e-5


def _close(got, ref, rtol):
    err = (got.double().cpu() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rtol * scale, f"max err {err:.3e} vs scale {scale:.3e}"


@pytest.mark.parametrize("D,BN", [(64, 16), (64, 64), (128, 32)])
def test_qrot_vs_f64(D, BN):
    H = 3
    g = torch.Generator().manual_seed(D + BN)
    q = torch.randn(H, D, generator=g)
    q[:, 7] *= 20                                           # an outlier column
    R = rotation_matrix(D, dtype=torch.float32)
    y = torch.full((H, D), float("nan"))
    dv = lambda t: t.to(DEV)  # noqa: E731
    qd, Rd, yd = dv(q), dv(R), dv(y)
    AQ._qrot_kernel[(H, D // BN)](qd, Rd, yd, D=D, BN=BN, PDL=False)
    ref = q.double() @ rotation_matrix(D, dtype=torch.float64).T   # y_h = R q_h
    _close(yd, ref, RTOL)


def _chunk_rows_spec(T, NL, CHUNK, BT, MINR):
    """The split-K row formula as documented in attn_decode_q (`_chunk_rows`)."""
    ch = -(-T // NL)
    ch = -(-ch // BT) * BT
    return max(ch, min(CHUNK, MINR))


def _partials(H, D, NCH, nv, seed):
    """Random split-K partials for the first nv chunks of each head (log2-unit maxima spread
    over +-12, positive denominators). The other chunks are garbage that fails if read: NaN
    denominators and accumulators, and a maximum of 1e4 (NaN would vanish in a max; 1e4 drives
    every weight to 0 and the output to 0/0)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.full((H, NCH), 1e4)
    lsum = torch.full((H, NCH), float("nan"))
    acc = torch.full((H, NCH, D), float("nan"))
    m[:, :nv] = torch.rand(H, nv, generator=g) * 24 - 12
    lsum[:, :nv] = torch.rand(H, nv, generator=g) * 30 + 0.5
    acc[:, :nv] = torch.randn(H, nv, D, generator=g) * lsum[:, :nv, None]
    return m, lsum, acc


def _merge_f64(m, lsum, acc, nv):
    m, lsum, acc = m[:, :nv].double(), lsum[:, :nv].double(), acc[:, :nv].double()
    w = torch.exp2(m - m.max(dim=1, keepdim=True).values)
    return (acc * w[..., None]).sum(1) / (lsum * w).sum(1, keepdim=True)


@pytest.mark.parametrize("rot", [True, False])
@pytest.mark.parametrize("T,NL,CHUNK,BT,BN,RC", [
    (77, 8, 4, 16, 16, 2),           # 5 of 8 chunks hold rows; three merge steps
    (77, 8, 4, 16, 64, 32),          # one step, whole rows per program
    (1000, 8, 512, 16, 32, 4),       # chunk floor min(CHUNK, MINR) = 128 rows: nv = 8
    (5, 6, 512, 16, 16, 4),          # short context: one chunk holds all rows
])
def test_merge_out_split_vs_f64(rot, T, NL, CHUNK, BT, BN, RC):
    H, D, NCH, MINR = 3, 64, 10, 128
    nv = -(-T // _chunk_rows_spec(T, NL, CHUNK, BT, MINR))
    assert 1 <= nv <= NL
    m, lsum, acc = _partials(H, D, NCH, nv, seed=T + BN)
    g = torch.Generator().manual_seed(1)
    qg = torch.randn(H, 2 * D, generator=g) * 3
    R64 = rotation_matrix(D, dtype=torch.float64)
    o = _merge_f64(m, lsum, acc, nv)
    ref = (o @ R64 if rot else o) * torch.sigmoid(qg[:, D:].double())
    dv = lambda t: t.to(DEV)  # noqa: E731
    st = dv(torch.tensor([0, 0, T - 1], dtype=torch.int32))
    out = dv(torch.full((H, D), float("nan")))
    qgd = dv(qg)
    AQ._merge_out_kernel[(H, D // BN)](
        dv(torch.zeros(H, D)), dv(m), dv(lsum), dv(acc), st, dv(R64.float()), qgd[:, D:],
        qgd.stride(0), out, NCH, NL, CHUNK, D=D, BN=BN, RC=RC, BT=BT, MINR=MINR,
        SPLIT=True, ROT=rot, PDL=False)
    _close(out, ref, RTOL)


@pytest.mark.parametrize("rot", [True, False])
def test_merge_out_single_pass_vs_f64(rot):
    H, D, BN = 2, 64, 16
    g = torch.Generator().manual_seed(2)
    o_rot, qg = torch.randn(H, D, generator=g), torch.randn(H, 2 * D, generator=g)
    R64 = rotation_matrix(D, dtype=torch.float64)
    ref = (o_rot.double() @ R64 if rot else o_rot.double()) * torch.sigmoid(qg[:, D:].double())
    dv = lambda t: t.to(DEV)  # noqa: E731
    out, qgd, nan = dv(torch.full((H, D), float("nan"))), dv(qg), dv(torch.tensor([float("nan")]))
    AQ._merge_out_kernel[(H, D // BN)](
        dv(o_rot), nan, nan, nan, dv(torch.tensor([0, 0, 9], dtype=torch.int32)),
        dv(R64.float()), qgd[:, D:], qgd.stride(0), out, 1, 1, 1 << 30, D=D, BN=BN, RC=4,
        BT=16, MINR=128, SPLIT=False, ROT=rot, PDL=False)
    _close(out, ref, RTOL)


def _case(kv_type, H, Hkv, D, T, seed):
    q, kc, vc, qg, ref = quant_kv_case(kv_type, H, Hkv, D, T, seed)
    st = torch.tensor([0, 0, T - 1], dtype=torch.int32)
    return [t.to(DEV) for t in (q, kc, vc, qg, st)], ref


@pytest.mark.parametrize("mode", ["new", "old"])
@pytest.mark.parametrize("kv_type", ["q8_0", "tq3", "q8_0+tq3", "tq3+q8_0"])
def test_whole_call_modes(monkeypatch, mode, kv_type):
    """Single pass and split-K (with small merge steps) through attn_decode_q, new kernels and
    the former launches; rotating and non-rotating K / V formats."""
    monkeypatch.setenv(AQ.EXTRAS_ENV, mode)
    monkeypatch.setenv(AQ.XCFG_ENV, "qbn=16,obn=16,rc=2")
    H, Hkv, D, T = 4, 2, 64, 77
    (q, kc, vc, qg, st), ref = _case(kv_type, H, Hkv, D, T, seed=5)
    ws = AQ.make_workspace(kv_type, H, D, max_ctx=2048, chunk=16, device=DEV)
    q0 = q.clone()
    for n in (1, 6):
        out = torch.full((H, D), float("nan"), device=DEV)
        AQ.attn_decode_q(q, kc, vc, qg, out, st, ws, n_chunks=n, chunk=16, BT=16)
        _close(out, ref, TOL)
    assert torch.equal(q, q0)                       # q is an input only
    names = [n for n, _ in AQ.attn_decode_q_pieces(q, kc, vc, qg, out, st, ws, 6, 16)]
    rot_k = not kv_type.startswith("q8_0")
    if mode == "new":
        assert names == (["qrot"] if rot_k else []) + ["attn", "merge_out"]
    else:
        assert names == ["rowmat_q", "attn", "reduce", "rowmat_out"]


def test_bad_env(monkeypatch):
    monkeypatch.setenv(AQ.EXTRAS_ENV, "fast")
    with pytest.raises(ValueError):
        AQ.extras_mode()
    monkeypatch.setenv(AQ.EXTRAS_ENV, "old")
    monkeypatch.setenv(AQ.XCFG_ENV, "nope=3")
    with pytest.raises(ValueError):
        AQ.extras_config(256)


@pytest.mark.skipif(INTERP or not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("pdl_on", ["0", "1"])
@pytest.mark.parametrize("kv_type", ["tq3", "q8_0", "tq4+tq3"])
def test_device_graph_new_vs_f64(monkeypatch, pdl_on, kv_type):
    """27B head shape on the device, replayed from a CUDA graph over two layers (programmatic
    dependent launch on and off): new launches vs float64, single pass and split-K."""
    monkeypatch.setenv("TIGHTFIT_PDL", pdl_on)
    monkeypatch.delenv(AQ.EXTRAS_ENV, raising=False)
    H, Hkv, D = 24, 4, 256
    for T, n in ((300, 1), (3000, 12)):
        cases = [_case(kv_type, H, Hkv, D, T, seed=s) for s in (7, 8)]
        ws = AQ.make_workspace(kv_type, H, D, max_ctx=4096, chunk=256, device=DEV)
        outs = [torch.zeros(H, D, device=DEV) for _ in cases]

        def step():
            for (a, _), out in zip(cases, outs):
                AQ.attn_decode_q(a[0], a[1], a[2], a[3], out, a[4], ws, n_chunks=n, chunk=256)
        step()
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            step()
        for out in outs:
            out.fill_(float("nan"))
        gr.replay()
        torch.cuda.synchronize()
        for (_, ref), out in zip(cases, outs):
            _close(out, ref, TOL)


def test_merge_only_vs_f64():
    """`_merge_out_kernel` GATE=False ROT=False (the "merge" launch of XCFG msplit=1): out = the
    merged o_rot of its BN columns, no gate (the gate pointer is NaN garbage: must not be read)."""
    H, D, NCH, T, NL, CHUNK, BT = 3, 64, 10, 77, 8, 4, 16
    nv = -(-T // _chunk_rows_spec(T, NL, CHUNK, BT, 128))
    m, lsum, acc = _partials(H, D, NCH, nv, seed=11)
    ref = _merge_f64(m, lsum, acc, nv)
    dv = lambda t: t.to(DEV)  # noqa: E731
    out, nan = dv(torch.full((H, D), float("nan"))), dv(torch.full((H, 2 * D), float("nan")))
    AQ._merge_out_kernel[(H, D // 32)](
        dv(torch.zeros(H, D)), dv(m), dv(lsum), dv(acc),
        dv(torch.tensor([0, 0, T - 1], dtype=torch.int32)), dv(torch.full((D, D), float("nan"))),
        nan[:, D:], nan.stride(0), out, NCH, NL, CHUNK, D=D, BN=32, RC=2, BT=BT, MINR=128,
        SPLIT=True, ROT=False, PDL=False, GATE=False)
    _close(out, ref, RTOL)


@pytest.mark.parametrize("kv_type", ["q8_0", "tq3", "q8_0+tq3", "tq3+q8_0"])
@pytest.mark.parametrize("xcfg", ["qbn=16,obn=16,rc=2,msplit=1,mbn=32,mnw=2",
                                  "obn=64,rc=4,msplit=1,mbn=16"])
def test_whole_call_msplit_and_q_rotated(monkeypatch, kv_type, xcfg):
    """XCFG msplit=1 (split-K merge and the un-rotation + gate as two launches when V rotates)
    and q_rotated=True (q given as R q, no q rotation launch), vs float64 attention over the same
    bytes with the unrotated q; the torch twin with q_rotated too."""
    monkeypatch.setenv(AQ.EXTRAS_ENV, "new")
    monkeypatch.setenv(AQ.XCFG_ENV, xcfg)
    H, Hkv, D, T = 4, 2, 64, 77
    (q, kc, vc, qg, st), ref = _case(kv_type, H, Hkv, D, T, seed=6)
    ws = AQ.make_workspace(kv_type, H, D, max_ctx=2048, chunk=16, device=DEV)
    rot_k, rot_v = not kv_type.startswith("q8_0"), not kv_type.endswith("q8_0")
    R64 = rotation_matrix(D, dtype=torch.float64)
    q_r = ((q.double().cpu() @ R64.T) if rot_k else q.double().cpu()).float().to(DEV)
    for qq, qrot in ((q, False), (q_r, True)):
        for n in (1, 6):
            out = torch.full((H, D), float("nan"), device=DEV)
            AQ.attn_decode_q(qq, kc, vc, qg, out, st, ws, n_chunks=n, chunk=16, BT=16,
                             q_rotated=qrot)
            _close(out, ref, TOL)
        names = [nm for nm, _ in AQ.attn_decode_q_pieces(qq, kc, vc, qg, out, st, ws, 6, 16,
                                                           q_rotated=qrot)]
        tail = ["merge", "out"] if rot_v else ["merge_out"]
        assert names == (["qrot"] if rot_k and not qrot else []) + ["attn"] + tail
        out = torch.full((H, D), float("nan"), device=DEV)
        AQ.attn_decode_q_ref(qq, kc, vc, qg, out, st, ws, q_rotated=qrot)
        _close(out, ref, TOL)


def test_q_must_be_contiguous():
    H, Hkv, D, T = 4, 2, 64, 9
    (q, kc, vc, qg, st), _ = _case("tq3", H, Hkv, D, T, seed=7)
    ws = AQ.make_workspace("tq3", H, D, max_ctx=64, device=DEV)
    qwide = torch.zeros(H, 2 * D, device=DEV)
    qwide[:, :D] = q
    with pytest.raises(ValueError, match="contiguous"):
        AQ.attn_decode_q_pieces(qwide[:, :D], kc, vc, qg, torch.zeros(H, D, device=DEV), st, ws)
