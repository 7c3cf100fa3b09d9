"""Group.gemv runs the low-bit integer types (IQ2/IQ3 grids, Q2_K, Q3_K) in ONE grouped call of
cpu_gemv_lowbit.gemv_lowbit_group, next to the SIMD group and the ternary group: each output
span bit-identical to per-matrix `gemv`, at most 3 parallel kernel calls per group."""
from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from tightfit.kernels import cpu_gemv as G
from tightfit.kernels import cpu_gemv_kern as K
from tightfit.kernels import cpu_gemv_lowbit as L
from tightfit.kernels import cpu_gemv_ternary as TQ

from test_cpu_gemv import SCALES, blocks, reference

SCALES = {**SCALES, "TQ2_0": [64]}
MIX = [("IQ4_XS", 41), ("IQ2_S", 37), ("IQ3_XXS", 1), ("Q3_K", 29), ("Q2_K", 53),
       ("TQ2_0", 19), ("IQ3_S", 0), ("IQ2_S", 300)]   # a 0-row matrix; many chunks of one


def _blocks(rng, name, rows, k):
    if name in SCALES and name != "TQ2_0":
        return blocks(rng, name, rows, k)
    bs, ts = GGML_QUANT_SIZES[T[name]]
    raw = rng.integers(0, 256, (rows, k // bs * ts), dtype=np.uint8)
    raw.reshape(rows, -1, ts)[:, :, 64:66] = rng.uniform(-0.1, 0.1, (rows, k // bs)).astype(
        np.float16).view(np.uint8).reshape(rows, -1, 2)
    return raw


def _mix(seed, k=512):
    rng = np.random.default_rng(seed)
    mats = []
    for i, (name, rows) in enumerate(MIX):
        raw = _blocks(rng, name, max(rows, 1), k)[:rows]
        if i % 2:
            raw.flags.writeable = False
        mats.append((raw, int(T[name])))
    return rng, mats


@pytest.mark.parametrize("batch", [1, 3])
def test_lowbit_group_equals_per_matrix_bit_for_bit(batch):
    rng, mats = _mix(60 + batch)
    x = rng.standard_normal((batch, 512)).astype(np.float32)
    grp = G.Group(mats)
    assert {grp.qtypes[i] for i in grp._lowbit()} >= {T.IQ2_S, T.IQ3_XXS, T.Q3_K, T.Q2_K}
    want = [G.gemv(w, q, x) for w, q in mats]
    for threads in (1, None):
        G.set_threads(threads)
        try:
            got = grp.gemv(x)
        finally:
            G.set_threads(None)
        for (a, b), y in zip(grp.spans, want):
            assert np.array_equal(got[:, a:b], y)
    if batch == 1:
        out = np.full(grp.n_out, np.nan, np.float32)
        grp.gemv(x[0], out=out)
        for (a, b), y in zip(grp.spans, want):
            assert np.array_equal(out[a:b], y[0])


def test_lowbit_group_vs_gguf_dequant_on_quantized_x():
    """IQ3_XXS through the group vs gguf-py's dequantizer + float64 on exactly the int8 x."""
    rng, mats = _mix(70, k=768)
    x = rng.standard_normal((2, 768)).astype(np.float32)
    y = G.Group(mats).gemv(x)
    j = [i for i, (_, q) in enumerate(mats) if q == T.IQ2_S][-1]
    raw = mats[j][0]
    a = sum(w.shape[0] for w, _ in mats[:j])
    xq, xd, xs = np.zeros((2, 768), np.int8), np.zeros((2, 3), np.float32), \
        np.zeros((2, 48), np.int32)
    K.quantize_act(x, xq, xd, xs)
    xdq = (xq.astype(np.float64).reshape(2, -1, 256) * xd[:, :, None]).reshape(2, 768)
    W = reference(raw, "IQ2_S", raw.shape[0], 768)
    want, scale = xdq @ W.T, np.abs(xdq) @ np.abs(W).T + 1e-30
    assert np.max(np.abs(y[:, a:a + raw.shape[0]] - want) / scale) < 1e-6


def test_lowbit_group_is_at_most_three_parallel_calls(monkeypatch):
    """SIMD group + ternary group + low-bit group; no per-matrix gemv for the integer types."""
    rng, mats = _mix(80)
    x = rng.standard_normal(512).astype(np.float32)
    calls = []

    def count(name, f):
        def g(*a, **k):
            calls.append(name)
            return f(*a, **k)
        return g
    monkeypatch.setattr(G, "_SIMD_GRP", count("simd", G._SIMD_GRP))
    real_gemv = G.gemv
    monkeypatch.setattr(G, "gemv", lambda w, qt, *a, **k: (calls.append(("gemv", qt)),
                                                           real_gemv(w, qt, *a, **k))[1])
    monkeypatch.setattr(L, "gemv_lowbit_group", count("lowbit", L.gemv_lowbit_group))
    for n in ("gemv_tq_group", "gemv_tq_group_simd"):
        monkeypatch.setattr(TQ, n, count("tq", getattr(TQ, n)))
    G.Group(mats).gemv(x)
    assert calls.count("lowbit") == 1 and calls.count("tq") == 1, calls
    # without the SIMD kernels (no AVX2, TIGHTFIT_CPU_SIMD=0) IQ4_XS alone takes its own gemv
    assert set(calls) - {"simd", "tq", "lowbit"} <= ({("gemv", T.IQ4_XS)} if not G.SIMD else set())
    assert len(calls) <= 3 or not G.SIMD, calls
