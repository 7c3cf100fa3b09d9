"""Decode attention on the quantized cache (tightfit/kernels/attn_decode_q.py) under
TRITON_INTERPRET=1: the Triton kernel and its torch twin against float64 attention over the SAME
quantized bytes, dequantized in the original basis outside the kernel
(tightfit.kvquant.reference.attention_quant_f64), every format, single pass and split-K."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.kernels import attn_decode_q as AQ  # noqa: E402
from tightfit.kvquant.formats import split_kv_type  # noqa: E402
from tightfit.kvquant.reference import alloc_cache, attention_quant_f64, write_rows  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and
                                not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")
DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
TOL = 2e-5          # relative to max |out|; fp16 hi/lo split dots keep ~fp32 accuracy


def _case(kv_type, H, Hkv, D, T, seed=0, outliers=True):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, Hkv, D, generator=g)
    v = torch.randn(T, Hkv, D, generator=g)
    if outliers:
        k[..., 3] = k[..., 3] * 15 + 8
        v[..., 5] *= 6
    q = torch.randn(H, D, generator=g) * 0.5
    qg = torch.randn(H, 2 * D, generator=g)
    kn, vn = split_kv_type(kv_type)
    kc, vc = alloc_cache(T + 3, Hkv, D, kn), alloc_cache(T + 3, Hkv, D, vn)
    write_rows(kc, vc, 0, k[: T // 2], v[: T // 2], kv_type)         # prefill chunk
    write_rows(kc, vc, T // 2, k[T // 2:], v[T // 2:], kv_type)      # then more rows
    ref = attention_quant_f64(q, kc, vc, T, kv_type, gate=qg[:, D:])
    to = lambda t: t.to(DEV)  # noqa: E731
    status = torch.tensor([0, 0, T - 1], dtype=torch.int32)
    return [to(t) for t in (q, kc, vc, qg, status)], ref


def _check(out, ref):
    err = (out.double().cpu() - ref).abs().max().item()
    assert err <= TOL * ref.abs().max().item(), f"max err {err:.3e} vs {ref.abs().max().item():.3e}"


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


@pytest.mark.parametrize("kv_type", ["tq3", "tq4_128+tq3_128"])
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
    (q, kc, vc, qg, status), ref = _case("tq3", H, Hkv, D, T, seed=2)
    kc[T:] = 255
    vc[T:] = 255
    ws = AQ.make_workspace("tq3", H, D, max_ctx=2048, chunk=16, device=DEV)
    out = torch.zeros(H, D, device=DEV)
    AQ.attn_decode_q(q, kc, vc, qg, out, status, ws, n_chunks=2, chunk=16, BT=16)
    _check(out, ref)
    assert ws.nbytes == 4 * (D * D + 32 + 2 * H * D + H * ws.m.shape[1] * (D + 2))
