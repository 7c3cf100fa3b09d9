"""Decode attention on the quantized cache (tightfit/kernels/attn_decode_q.py) under
TRITON_INTERPRET=1 on a CPU, compiled on CUDA tensors on a GPU (where attn_decode_q picks the
CUDA attention kernel for its shapes: head_dim 128 / 256): the kernels and their torch twin against float64 attention over the SAME
quantized bytes, dequantized in the original basis outside the kernel
(tightfit.kvquant.reference.attention_quant_f64), every format, single pass and split-K.

Tolerance (TOL, relative to max |out|): the kernel decodes the K and V codes to fp16 tensor-core
operands, C[idx] * scale (q8_0: int8 * d) rounded ONCE to fp16 (unit roundoff u = 2^-11 ~ 4.9e-4),
exactly the rounding an FP16 cache applies to its values; q and the probabilities p are split into
fp16 hi + lo parts (two dots each, fp32 accumulation), so they add no rounding of their own. A
score then moves by at most u * sum_d |q_d k_d| and an output by at most ~u * max|v| (a convex
combination of rounded V rows), un-rotation being orthogonal. Measured on these cases (and on the
27B head shape with T = 200): 0.9e-4 .. 4.5e-4 of max |out|; TOL = 2e-3 ~ 4u leaves room for the
outlier cases (|v| up to 6x the rms) while a wrong code, scale, block or row (errors of order 1e-2
and up) still fails. The torch twin attn_decode_q_ref is fp32 and far inside it."""
from __future__ import annotations

import os

import torch

# Interpret only where there is no GPU. (This used to be an unconditional
# os.environ.setdefault("TRITON_INTERPRET", "1"): on the H200, after another test module had
# already imported attn_decode_q as compiled kernels, it switched DEV to "cpu" and the compiled
# `_attn_q_kernel` got CPU tensors -> "ValueError: Pointer argument (at 0) cannot be accessed
# from Triton (cpu tensor?)"; it also made every later-imported kernel module interpreted.)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from tightfit.kernels import attn_decode_q as AQ  # noqa: E402
from tightfit.kvquant.formats import split_kv_type  # noqa: E402
from tightfit.kvquant.reference import alloc_cache, attention_quant_f64, write_rows  # noqa: E402
from _kv_cases import check_close, quant_kv_case  # noqa: E402

# the device follows how the kernels were actually built (at their module's import, possibly by
# another test module), not the environment now: interpreted kernels take CPU tensors only,
# compiled ones CUDA tensors only
INTERP = isinstance(AQ._attn_q_kernel, InterpretedFunction)
pytestmark = pytest.mark.skipif(not INTERP and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")
DEV = "cpu" if INTERP else "cuda"
def _case(kv_type, H, Hkv, D, T, seed=0):
    """tests/_kv_cases.quant_kv_case on this module's device, with the status word of T rows."""
    q, kc, vc, qg, ref = quant_kv_case(kv_type, H, Hkv, D, T, seed)
    status = torch.tensor([0, 0, T - 1], dtype=torch.int32)
    return [t.to(DEV) for t in (q, kc, vc, qg, status)], ref


def _check(out, ref):
    check_close(out, ref)      # TOL of max |ref|: see the module docstring


TYPES = ["q8_0", "tq4", "tq3", "tq2", "q8_0+tq3", "tq4+tq3", "tq3+q8_0"]


@pytest.mark.parametrize("kv_type", TYPES)
def test_single_pass_and_split(kv_type):
    H, Hkv, D, T = 4, 2, 64, 77
    (q, kc, vc, qg, status), ref = _case(kv_type, H, Hkv, D, T)
    ws = AQ.make_workspace(kv_type, H, D, max_ctx=2048, chunk=32, device=DEV)
    out = torch.zeros(H, D, device=DEV)
    AQ.attn_decode_q(q, kc, vc, qg, out, status, ws)
    _check(out, ref)
    out2 = torch.zeros(H, D, device=DEV)                 # 4 chunks of 32 launched, 3 hold rows
    AQ.attn_decode_q(q, kc, vc, qg, out2, status, ws, n_chunks=4, chunk=32)
    _check(out2, ref)
    out3 = torch.zeros(H, D, device=DEV)
    AQ.attn_decode_q_ref(q, kc, vc, qg, out3, status, ws)
    _check(out3, ref)


@pytest.mark.parametrize("kv_type", ["tq3", "tq4_128+tq3_128", "tq3_128+q8_0"])
def test_27b_head_shape(kv_type):
    """24 query heads on 4 KV heads (group 6, padded to 16), head_dim 256, split-K."""
    H, Hkv, D, T = 24, 4, 256, 40
    (q, kc, vc, qg, status), ref = _case(kv_type, H, Hkv, D, T, seed=1)
    ws = AQ.make_workspace(kv_type, H, D, max_ctx=4096, chunk=16, device=DEV)
    out = torch.zeros(H, D, device=DEV)
    AQ.attn_decode_q(q, kc, vc, qg, out, status, ws, n_chunks=3, chunk=16, BT=16)
    _check(out, ref)


def test_position_from_status():
    """T comes from status[2]: rows past it are never read (fill them with garbage)."""
    H, Hkv, D, T = 2, 1, 32, 20
    (q, kc, vc, qg, status), ref = _case("tq3", H, Hkv, D, T, seed=2)   # rows past T poisoned
    ws = AQ.make_workspace("tq3", H, D, max_ctx=2048, chunk=16, device=DEV)
    out = torch.zeros(H, D, device=DEV)
    AQ.attn_decode_q(q, kc, vc, qg, out, status, ws, n_chunks=2, chunk=16, BT=16)
    _check(out, ref)
    assert ws.nbytes == 4 * (D * D + 32 + 2 * H * D + H * ws.m.shape[1] * (D + 2))


def test_split_rows_from_device_T():
    """Split-K rows per program come from T on the device: 8 programs for T = 77 (16 rows each,
    5 hold rows), and a `chunk` too small to cover T with n_chunks still covers it."""
    H, Hkv, D, T = 4, 2, 64, 77
    (q, kc, vc, qg, status), ref = _case("tq4+tq3", H, Hkv, D, T, seed=3)
    ws = AQ.make_workspace("tq4+tq3", H, D, max_ctx=2048, chunk=4, device=DEV)
    for n, ch in ((8, 4), (3, 8)):
        out = torch.zeros(H, D, device=DEV)
        AQ.attn_decode_q(q, kc, vc, qg, out, status, ws, n_chunks=n, chunk=ch, BT=16)
        _check(out, ref)


@pytest.mark.parametrize("kv_type,D", [("q8_0", 128), ("tq3", 128), ("tq4_128+tq2", 128),
                                        ("tq3_128+q8_0", 128), ("tq3", 256)])
def test_write_kernel_matches_reference(kv_type, D):
    """qk_prep_q writes the same bytes and q as the torch path (its rotations in registers,
    tightfit.kernels.rht; the torch path's a dense product with R). D = 256 is the 27B head, the
    16 x 16 split that Triton once compiled to a TF32 dot."""
    from tightfit.kernels import attn_decode as A
    from tightfit.kernels import kv_write_q as KW
    H, Hkv, pos = 4, 2, 5
    g = torch.Generator().manual_seed(4)
    qg, k, v = torch.randn(H, 2 * D, generator=g), torch.randn(Hkv * D, generator=g), \
        torch.randn(Hkv * D, generator=g)
    nw = 1 + 0.1 * torch.randn(D, generator=g)
    cos, sin = A.rope_tables(16, 32, 1e4)
    kn, vn = split_kv_type(kv_type)
    outs = []
    for fn in (KW.qk_prep_q, KW.qk_prep_q_ref):
        kc, vc = alloc_cache(8, Hkv, D, kn), alloc_cache(8, Hkv, D, vn)
        q_out = torch.zeros(H, D)
        st = torch.tensor([0, 0, pos], dtype=torch.int32)
        ws = KW.make_write_workspace(kv_type, Hkv, D)
        to = lambda t: t.to(DEV)  # noqa: E731
        a = [to(t) for t in (qg, k, v, nw, nw, cos, sin, kc, vc, q_out, st)]
        fn(*a, 1e-6, ws if DEV == "cpu" else KW.make_write_workspace(kv_type, Hkv, D, device=DEV))
        outs.append([t.cpu() for t in (a[7], a[8], a[9])])
    (kc1, vc1, q1), (kc2, vc2, q2) = outs
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    assert torch.allclose(q1, q2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_type", ["tq3", "q8_0", "tq4_128+tq2", "q8_0+tq3"])
def test_write_kernel_rotate_q(kv_type):
    """qk_prep_q(rotate_q=True): the same cache bytes, q_out = R q (float64 product of the plain
    q_out, when K rotates; else q_out unchanged), the torch twin too; then attention with
    q_rotated=True over the written cache equals the plain call (float64 oracle)."""
    from tightfit.kernels import attn_decode as A
    from tightfit.kernels import kv_write_q as KW
    from tightfit.kvquant.formats import get_format, rotation_matrix
    H, Hkv, D, pos = 4, 2, 128, 6
    g = torch.Generator().manual_seed(9)
    qg, k, v = torch.randn(H, 2 * D, generator=g), torch.randn(Hkv * D, generator=g), \
        torch.randn(Hkv * D, generator=g)
    nw = 1 + 0.1 * torch.randn(D, generator=g)
    cos, sin = A.rope_tables(16, 32, 1e4)
    kn, vn = split_kv_type(kv_type)
    kc0, vc0 = alloc_cache(8, Hkv, D, kn), alloc_cache(8, Hkv, D, vn)
    kk, vv = torch.randn(pos, Hkv, D, generator=g), torch.randn(pos, Hkv, D, generator=g)
    write_rows(kc0, vc0, 0, kk, vv, kv_type)                      # rows before the new one
    to = lambda t: t.to(DEV)  # noqa: E731
    res = {}
    for name, fn in (("k", KW.qk_prep_q), ("ref", KW.qk_prep_q_ref)):
        for rq in (False, True):
            kc, vc, q_out = to(kc0.clone()), to(vc0.clone()), to(torch.zeros(H, D))
            st = to(torch.tensor([0, 0, pos], dtype=torch.int32))
            ws = KW.make_write_workspace(kv_type, Hkv, D, device=DEV)
            fn(*[to(t) for t in (qg, k, v, nw, nw, cos, sin)], kc, vc, q_out, st, 1e-6, ws,
               rotate_q=rq)
            res[name, rq] = (kc, vc, q_out, st)
    R64 = rotation_matrix(D, dtype=torch.float64)
    rot_k = get_format(kn).rotate
    for name in ("k", "ref"):
        kc, vc, q0, _ = res[name, False]
        kc1, vc1, q1, _ = res[name, True]
        assert torch.equal(kc.cpu(), kc1.cpu()) and torch.equal(vc.cpu(), vc1.cpu())
        want = q0.double().cpu() @ R64.T if rot_k else q0.double().cpu()
        err = (q1.double().cpu() - want).abs().max().item()
        assert err <= 1e-5 * want.abs().max().item(), f"{name}: q_out err {err:.3e}"
    kc, vc, q0, st = res["k", False]
    q1 = res["k", True][2]
    T = pos + 1
    ref = attention_quant_f64(q0.cpu(), kc.cpu(), vc.cpu(), T, kv_type, gate=qg[:, D:])
    ws = AQ.make_workspace(kv_type, H, D, max_ctx=2048, chunk=16, device=DEV)
    qgd = to(qg)
    for qq, qrot in ((q0, False), (q1, True)):
        for n in (1, 2):
            out = torch.zeros(H, D, device=DEV)
            AQ.attn_decode_q(qq, kc, vc, qgd, out, st, ws, n_chunks=n, chunk=16, BT=16,
                             q_rotated=qrot)
            _check(out, ref)


_IMPORT_ORDER_PROBE = r"""
import importlib.util, os, sys
import torch
torch.cuda.is_available = lambda: True          # a GPU machine, as far as the modules can tell
mods = {}
for name in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location(name, os.path.join("tests", name + ".py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    mods[name] = m
print({n: (m.DEV, m.INTERP) for n, m in mods.items()}, os.environ.get("TRITON_INTERPRET"))
for n, m in mods.items():
    assert m.DEV == "cuda" and not m.INTERP, (n, m.DEV, m.INTERP)
assert os.environ.get("TRITON_INTERPRET") != "1"
"""


@pytest.mark.parametrize("order", [("test_attn_decode_q_extras", "test_kvquant_kernel"),
                                   ("test_kvquant_kernel", "test_attn_decode_q_extras")])
def test_device_choice_follows_kernels(order):
    """On a GPU machine both attn_decode_q test modules run the compiled kernels on CUDA tensors,
    in either collection order (the H200 failure: extras imported attn_decode_q compiled, then
    this module set TRITON_INTERPRET=1 and chose DEV = "cpu" -> the compiled kernel got CPU
    tensors: ValueError "Pointer argument (at 0) cannot be accessed from Triton"). Run in a
    fresh interpreter with torch.cuda.is_available faked to True (imports only, no launch)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the repository and tests/ (the modules import tests/_interp.py and tests/_kv_cases.py)
    env["PYTHONPATH"] = os.pathsep.join([root, os.path.join(root, "tests"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _IMPORT_ORDER_PROBE, *order], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
