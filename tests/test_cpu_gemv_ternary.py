"""Host GEMV for the ternary types TQ2_0 (35) and TQ1_0 (34): the native kernels of
tightfit.kernels.cpu_gemv_ternary (AVX2 and portable) against gguf-py's dequantizer + float64.

Against the activations the kernels actually multiply (x quantized to int8 per 256, dequantized
exactly) the only error is fp32 rounding of the per-block factors and the running sum (bound
1e-5 of |x|.|W| per output); against the float activations the int8 rounding adds about 2e-3
(bound 2e-2)."""
from __future__ import annotations

import numpy as np
import pytest
import gguf.quants
from gguf.constants import GGMLQuantizationType as T

from tightfit.kernels import cpu_gemv as G
from tightfit.kernels import cpu_gemv_kern as K
from tightfit.kernels import cpu_gemv_ternary as TQ

NAMES = ["TQ2_0", "TQ1_0"]
TS = {"TQ2_0": 66, "TQ1_0": 54}


def ternary(rng, name, rows, k):
    """Valid blocks: gguf-py's quantizer on weights in {-s, 0, +s} with a random s per 256."""
    s = rng.uniform(0.01, 0.2, (rows, k // 256, 1)).astype(np.float32)
    w = (rng.integers(-1, 2, (rows, k // 256, 256)) * s).reshape(rows, k).astype(np.float32)
    raw = gguf.quants.quantize(w, T[name])
    assert raw.shape == (rows, k // 256 * TS[name]) and raw.dtype == np.uint8
    return raw


def reference(raw, name, rows, k):
    return gguf.quants.dequantize(raw, T[name]).astype(np.float64).reshape(rows, k)


def quantized_x(x):
    """x as the kernels see it: int8 codes per 256 times their fp32 scale, in float64."""
    B, k = x.shape
    xq, xd, xs = np.zeros((B, k), np.int8), np.zeros((B, k // 256), np.float32), \
        np.zeros((B, k // 16), np.int32)
    K.quantize_act(x, xq, xd, xs)
    return (xq.astype(np.float64).reshape(B, -1, 256) * xd[:, :, None]).reshape(B, k)


def check(raw, name, x, got, tol_q=1e-5, tol_f=2e-2):
    rows, k = raw.shape[0], x.shape[1]
    W = reference(raw, name, rows, k)
    xdq = quantized_x(x)
    scale = np.abs(xdq) @ np.abs(W).T + 1e-30
    assert np.max(np.abs(got - xdq @ W.T) / scale) <= tol_q
    scale_f = np.abs(x).astype(np.float64) @ np.abs(W).T + 1e-30
    assert np.max(np.abs(got - x.astype(np.float64) @ W.T) / scale_f) <= tol_f


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rows,k,batch", [(1, 256, 1), (37, 256, 3), (7, 5120, 1),
                                          (130, 5120, 2), (19, 17408, 1), (5, 17408, 3)])
def test_gemv_matches_gguf(name, rows, k, batch):
    rng = np.random.default_rng((rows * 31 + k + batch + len(name)) % 2**32)
    raw = ternary(rng, name, rows, k)
    x = rng.standard_normal((batch, k)).astype(np.float32)
    got = G.gemv(raw, T[name], x)
    assert got.shape == (batch, rows) and got.dtype == np.float32
    check(raw, name, x, got)
    one = G.gemv(raw, T[name], x[0])
    assert one.shape == (rows,)
    np.testing.assert_array_equal(one, got[0])


@pytest.mark.parametrize("name", NAMES)
def test_simd_and_portable_kernels_agree_bit_for_bit(name):
    """gemv_tq_simd and gemv_tq compute the same int32 block sums and the same fp32 running sum;
    both at 1 thread and at all threads (rows are independent: no thread dependence)."""
    rng = np.random.default_rng(5)
    rows, k, B = 67, 1280, 2
    raw = ternary(rng, name, rows, k)
    raw.flags.writeable = False     # the signature gemv compiles (mmap rows are read-only)
    x = rng.standard_normal((B, k)).astype(np.float32)
    xq, xd, xs = np.zeros((B, k), np.int8), np.zeros((B, k // 256), np.float32), \
        np.zeros((B, k // 16), np.int32)
    xb = np.zeros((B, k // 256), np.int32)
    K.quantize_act(x, xq, xd, xs)
    TQ.block_sums(xs, xb)
    np.testing.assert_array_equal(xb, xq.astype(np.int64).reshape(B, -1, 256).sum(-1))
    y = np.zeros((B, rows), np.float32)
    TQ.gemv_tq(int(T[name]), raw, xq, xd, xb, y, G._F16)
    check(raw, name, x, y)
    if K.HAVE_AVX2:
        ys = np.zeros((B, rows), np.float32)
        TQ.gemv_tq_simd(int(T[name]), raw, xq, xd, xb, ys, G._F16)
        np.testing.assert_array_equal(ys, y)
    old = G.n_threads()
    try:
        G.set_threads(1)
        one = G.gemv(raw, T[name], x)
    finally:
        G.set_threads(old)
    np.testing.assert_array_equal(one, G.gemv(raw, T[name], x))
    np.testing.assert_array_equal(one, y)


@pytest.mark.parametrize("name", NAMES)
def test_any_byte_and_extreme_codes(name):
    """Arbitrary bytes (TQ2_0 code 3 = +2d, TQ1_0 bytes outside the encoder's range) decode as
    gguf-py decodes them, and x = +-1 (every code +-127) with the largest codes does not saturate
    the int16 partial sums."""
    rng = np.random.default_rng(9)
    rows, k = 23, 768
    raw = rng.integers(0, 256, (rows, k // 256 * TS[name]), dtype=np.uint8)
    b = raw.reshape(rows, -1, TS[name])
    o = TS[name] - 2
    b[:, :, o:] = rng.uniform(-0.1, 0.1, b.shape[:2]).astype(np.float16).view(np.uint8).reshape(
        rows, -1, 2)
    b[:3, :, :o] = 0xFF                     # TQ2_0: all codes 3; TQ1_0: trits of 255
    b[3:5, :, :o] = 0x00
    x = rng.standard_normal((3, k)).astype(np.float32)
    x[1] = np.where(rng.random(k) < 0.5, -1.0, 1.0)
    x[2] = 1.0
    check(raw, name, x, G.gemv(raw, T[name], x))
    xz = np.zeros((1, k), np.float32)       # an all-zero activation block: xd = 0, output 0
    assert np.array_equal(G.gemv(raw, T[name], xz), np.zeros((1, rows), np.float32))


@pytest.mark.parametrize("batch", [1, 3])
def test_group_with_ternary_equals_gemv_bit_for_bit(batch):
    """TQ2_0 and TQ1_0 next to IQ4_XS (the AVX2 grouped kernel), Q8_0 and a fallback type, odd
    row counts, an empty matrix, read-only rows: every matrix's columns equal its own gemv."""
    rng = np.random.default_rng(70 + batch)
    k = 512
    mats = [(ternary(rng, "TQ2_0", 301, k), T.TQ2_0),
            (rng.integers(0, 256, (37, k // 256 * 136), dtype=np.uint8), T.IQ4_XS),
            (ternary(rng, "TQ1_0", 53, k), T.TQ1_0),
            (ternary(rng, "TQ2_0", 1, k)[:0], T.TQ2_0),
            (rng.integers(0, 256, (11, k // 32 * 22), dtype=np.uint8), T.Q5_0),
            (ternary(rng, "TQ1_0", 1, k), T.TQ1_0)]
    for w, qt in mats:     # sane fp16 scales for the random-byte ones
        if qt == T.IQ4_XS:
            w.reshape(w.shape[0], -1, 136)[:, :, :2] = np.array([0.01], np.float16).view(np.uint8)
        elif qt == T.Q5_0:
            w.reshape(w.shape[0], -1, 22)[:, :, :2] = np.array([0.01], np.float16).view(np.uint8)
    mats[2][0].flags.writeable = False
    x = rng.standard_normal((batch, k)).astype(np.float32)
    grp = G.Group(mats)
    assert set(grp._ternary()) == {0, 2, 5}
    want = [G.gemv(w, q, x) for w, q in mats]
    for threads in (1, None):
        G.set_threads(threads)
        try:
            got = grp.gemv(x)
        finally:
            G.set_threads(None)
        for (a, b), y in zip(grp.spans, want):
            assert np.array_equal(got[:, a:b], y)
    check(mats[0][0], "TQ2_0", x, got[:, grp.spans[0][0]:grp.spans[0][1]])
    out = np.full((1, grp.n_out), np.nan, np.float32)
    one = grp.gemv(x[0], out=out)
    assert np.shares_memory(one, out)
    for (a, b), (w, q) in zip(grp.spans, mats):
        assert np.array_equal(out[0, a:b], G.gemv(w, q, x[0]))


@pytest.mark.parametrize("name", NAMES)
def test_decode_rows_native(name, monkeypatch):
    rng = np.random.default_rng(11)
    rows, k = 9, 768
    raw = ternary(rng, name, rows, k)
    raw.reshape(rows, -1, TS[name])[0, 1, :TS[name] - 2] = 0xFF   # out-of-range bytes decode too
    W = reference(raw, name, rows, k)

    def no_fallback(*a, **kw):
        raise AssertionError("NumPy fallback used")
    monkeypatch.setattr(G, "_dequant_rows", no_fallback)
    ids = [0, 8, 3, 3, 0, 1]
    np.testing.assert_array_equal(G.decode_rows(raw, T[name], ids), W[ids].astype(np.float32))


def test_ternary_types_take_the_parallel_kernels(monkeypatch):
    """TQ2_0 and TQ1_0 never go through the NumPy dequantize-then-matmul fallback, in gemv, in a
    Group or in decode_rows; the kernels are numba-parallel; with TIGHTFIT_CPU_SIMD=0 (TQ_SIMD
    False) the portable kernels give the same result."""
    def no_fallback(*a, **kw):
        raise AssertionError("NumPy fallback used")
    monkeypatch.setattr(G, "_dequant_rows", no_fallback)
    rng = np.random.default_rng(12)
    simd = G.TQ_SIMD
    assert simd == bool(G.SIMD)     # both follow AVX2 and TIGHTFIT_CPU_SIMD
    for name in NAMES:
        qt = int(T[name])
        assert qt in TQ.TQ_TYPES and qt in G.NATIVE and qt in G._DECODE_NATIVE
        raw = ternary(rng, name, 8, 512)
        x = rng.standard_normal(512).astype(np.float32)
        y = G.gemv(raw, qt, x)
        assert np.all(np.isfinite(y))
        assert np.array_equal(G.Group([(raw, qt)]).gemv(x), y)
        G.decode_rows(raw, qt, [0, 7])
        monkeypatch.setattr(G, "TQ_SIMD", False)
        assert np.array_equal(G.gemv(raw, qt, x), y)
        assert np.array_equal(G.Group([(raw, qt)]).gemv(x), y)
        monkeypatch.setattr(G, "TQ_SIMD", simd)
    for kern in (TQ.gemv_tq, TQ.gemv_tq_simd, TQ.gemv_tq_group, TQ.gemv_tq_group_simd):
        assert kern.targetoptions.get("parallel"), kern
    s = G._scratch(2, 512)
    assert s.xb.shape == (2, 2) and s.xb.dtype == np.int32
