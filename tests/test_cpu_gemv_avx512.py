"""The AVX-512 VNNI host GEMV kernels (tightfit.kernels.cpu_gemv_avx512) against the AVX2 ones they
replace (bit for bit) and against gguf-py's dequantizer + float64 on the same int8 activations."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import gguf.quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from tightfit.kernels import cpu_gemv as G
from tightfit.kernels import cpu_gemv_avx512 as A
from tightfit.kernels import cpu_gemv_avx512_loop as AV
from tightfit.kernels import cpu_gemv_kern as K

NAMES = ["IQ4_XS", "Q4_K", "Q5_K", "Q6_K"]
SCALES = {"IQ4_XS": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}

needs_avx512 = pytest.mark.skipif(
    not A.available(), reason="host lacks avx512f + avx512bw + avx512vnni (or numba targets a "
                              "fixed CPU): the AVX-512 kernels cannot run here")


def blocks(rng, name, rows, k):
    bs, ts = GGML_QUANT_SIZES[T[name]]
    raw = rng.integers(0, 256, (rows, k // bs * ts), dtype=np.uint8)
    b = raw.reshape(rows, -1, ts)
    for o in SCALES[name]:
        b[:, :, o:o + 2] = rng.uniform(-0.1, 0.1, b.shape[:2]).astype(np.float16).view(
            np.uint8).reshape(rows, -1, 2)
    return raw


def quantized(x):
    B, k = x.shape
    xq, xd, xs = np.zeros((B, k), np.int8), np.zeros((B, k // 256), np.float32), \
        np.zeros((B, k // 16), np.int32)
    K.quantize_act(x, xq, xd, xs)
    return xq, xd, xs


def run(kern, name, raw, xq, xd, xs):
    y = np.full((xq.shape[0], raw.shape[0]), np.nan, np.float32)
    kern(int(T[name]), raw, xq, xd, xs, y, G._F16, G.per_thread(G._POOL, 16, np.int16))
    return y


def exact(raw, name, xq, xd):
    """float64 GEMV on exactly what the kernels multiply: x's int8 codes times the per-256 scale."""
    rows, k = raw.shape[0], xq.shape[1]
    W = gguf.quants.dequantize(raw, T[name]).astype(np.float64).reshape(rows, k)
    xdq = (xq.astype(np.float64).reshape(xq.shape[0], -1, 256) * xd[:, :, None]).reshape(-1, k)
    return xdq @ W.T, np.abs(xdq) @ np.abs(W).T + 1e-30


def int_sums(raw, name, xq):
    """Exact per-block integer sums from gguf-py's dequantizer run with the fp16 factors set to
    1 / 0 (so every weight is a small integer): (B, rows, nb) isum and msum (0 without mins)."""
    rows = raw.shape[0]
    ts = GGML_QUANT_SIZES[T[name]][1]
    one, zero = (np.array([v], np.float16).view(np.uint8) for v in (1, 0))

    def ints(d, dmin):
        r = raw.copy().reshape(rows, -1, ts)
        r[:, :, SCALES[name][0]:SCALES[name][0] + 2] = d
        if dmin is not None:
            r[:, :, 2:4] = dmin
        W = gguf.quants.dequantize(r.reshape(rows, -1), T[name]).astype(np.float64)
        return np.einsum("rnt,bnt->brn", W.reshape(rows, -1, 256),
                         xq.astype(np.float64).reshape(xq.shape[0], -1, 256))

    if name in ("Q4_K", "Q5_K"):
        return ints(one, zero), -ints(zero, one)
    return ints(one, None), np.zeros(1)


def extreme_case(rng, name, batch, rows=7, k=768):
    """Every code and sub-block scale at its largest magnitude (as the AVX2 test), x = +-127
    everywhere (row 1 all +127): raw blocks and the quantized activations."""
    raw = blocks(rng, name, rows, k)
    b = raw.reshape(rows, -1, GGML_QUANT_SIZES[T[name]][1])
    if name == "IQ4_XS":
        b[:, :, 2:8] = 0x00                 # scale -32
        b[:, :, 8:] = 0x00                  # codebook -127 everywhere
        b[:, 1::2, 8:] = 0xFF               # ... and +113 in every other block
    elif name == "Q6_K":
        b[:, :, 0:192] = 0xFF               # code 63
        b[:, :, 192:208] = 0x80             # scale -128
    else:
        b[:, :, 4:16] = 0xFF                # 6-bit scales and mins 63
        b[:, :, 16:] = 0xFF                 # codes 15 / 31
    x = np.where(rng.random((batch, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    x[1] = 1.0
    return (raw,) + quantized(x)


def documented_fp(raw, name, xq, xd):
    """The kernel's fp32 arithmetic as its docstring states it, on independently computed block
    integers: IQ4_XS/Q6_K acc = fma(f * xd, isum, acc); Q4_K/Q5_K acc = fma(xd, fma(f, isum,
    -(dmin * msum)), acc)."""
    from numba import njit
    isum, msum = int_sums(raw, name, xq)
    ts = GGML_QUANT_SIZES[T[name]][1]
    o = 208 if name == "Q6_K" else 0
    blk = raw.reshape(raw.shape[0], -1, ts)

    def f16(off):
        return blk[:, :, off:off + 2].copy().view(np.float16)[..., 0].astype(np.float32)

    f = f16(o)
    dmin = f16(2) if name in ("Q4_K", "Q5_K") else f

    @njit(cache=False)
    def fp(mins, isum, msum, f, dmin, xd, y):
        for b in range(y.shape[0]):
            for r in range(y.shape[1]):
                acc = np.float32(0.0)
                for i in range(f.shape[1]):
                    if mins:
                        v = A._fma(f[r, i], np.float32(isum[b, r, i]),
                                   -(dmin[r, i] * np.float32(msum[b, r, i])))
                        acc = A._fma(xd[b, i], v, acc)
                    else:
                        acc = A._fma(f[r, i] * xd[b, i], np.float32(isum[b, r, i]), acc)
                y[b, r] = acc

    y = np.zeros((xq.shape[0], raw.shape[0]), np.float32)
    mins = name in ("Q4_K", "Q5_K")
    fp(mins, isum.astype(np.int64), (msum if mins else isum).astype(np.int64), f, dmin, xd, y)
    return y


def close_to_avx2(got, name, raw, xq, xd, xs, scale):
    """vs the AVX2 gemv_simd: the same integers, fp32 within rounding. Not asserted bitwise:
    gemv_simd is compiled with fastmath and LLVM rounds its `acc += xd * (f * isum)` as
    fma(f * xd, isum, acc) in the code numba caches but as fma(xd, f * isum, acc) in a fresh
    in-process compile (numba 0.68 / LLVM 22, IQ4_XS and Q6_K), so its bits vary from run to run."""
    if K.HAVE_AVX2:
        ref = run(K.gemv_simd, name, raw, xq, xd, xs)
        assert np.max(np.abs(got - ref) / scale) < 1e-6


def test_available_matches_cpu_flags():
    """available() is the three features, read from LLVM's host CPU query; on Linux the kernel's
    /proc/cpuinfo flags agree (numba's target not overridden)."""
    import os
    from numba.core import config
    p = Path("/proc/cpuinfo")
    if not p.exists() or config.CPU_NAME not in (None, "host") or config.CPU_FEATURES:
        pytest.skip("no /proc/cpuinfo, or numba compiles for a fixed CPU")
    flags = set(re.search(r"^flags\s*:(.*)$", p.read_text(), re.M).group(1).split())
    assert A.available() == ({"avx512f", "avx512bw", "avx512_vnni"} <= flags)
    assert A.ENABLED == (A.available() and os.environ.get("TIGHTFIT_CPU_AVX512", "1") != "0")
    assert set(A.TYPES) == {T.IQ4_XS, T.Q4_K, T.Q5_K, T.Q6_K}


@needs_avx512
@pytest.mark.parametrize("name", NAMES)
def test_exact_on_int8_activations_and_equal_to_avx2(name):
    """1280 = 5 blocks, 45 rows, batch 3: within 1e-5 of float64 on the int8 activations,
    bit-identical to the documented fp32 form on exact block integers, and next to gemv_simd."""
    rng = np.random.default_rng(31)
    rows, k = 45, 1280
    raw = blocks(rng, name, rows, k)
    xq, xd, xs = quantized(rng.standard_normal((3, k)).astype(np.float32))
    got = run(A.gemv_avx512, name, raw, xq, xd, xs)
    want, scale = exact(raw, name, xq, xd)
    assert np.max(np.abs(got - want) / scale) < 1e-5
    np.testing.assert_array_equal(got, documented_fp(raw, name, xq, xd))
    close_to_avx2(got, name, raw, xq, xd, xs, scale)


@needs_avx512
@pytest.mark.parametrize("name", NAMES)
def test_extreme_codes_and_scales(name):
    """No int16 overflow in the vpdpbusd lanes / vpmaddubsw pairs fed to vpdpwssd: every code
    and sub-block scale at its largest magnitude (as the AVX2 test), xq = +-127 everywhere."""
    raw, xq, xd, xs = extreme_case(np.random.default_rng(32), name, 2)
    assert np.abs(xq).min() == 127
    got = run(A.gemv_avx512, name, raw, xq, xd, xs)
    want, scale = exact(raw, name, xq, xd)
    assert np.max(np.abs(got - want) / scale) < 1e-5
    np.testing.assert_array_equal(got, documented_fp(raw, name, xq, xd))
    close_to_avx2(got, name, raw, xq, xd, xs, scale)


@needs_avx512
def test_every_scale_and_min_value():
    """Each 6-bit scale/min position and value (Q4_K/Q5_K packing), IQ4_XS 6-bit scales and
    Q6_K int8 scales, swept over rows: decoded on vectors, so checked exhaustively."""
    rng = np.random.default_rng(33)
    k = 256
    for name in NAMES:
        ts = GGML_QUANT_SIZES[T[name]][1]
        raw = blocks(rng, name, 256, k)
        b = raw.reshape(256, -1, ts)
        v = np.arange(256, dtype=np.uint8)
        if name in ("Q4_K", "Q5_K"):
            for j in range(12):
                b[:, 0, 4 + j] = np.roll(v, 17 * j)
        elif name == "IQ4_XS":
            for j in range(6):
                b[:, 0, 2 + j] = np.roll(v, 29 * j)
        else:
            for j in range(16):
                b[:, 0, 192 + j] = np.roll(v, 11 * j)
        xq, xd, xs = quantized(rng.standard_normal((1, k)).astype(np.float32))
        got = run(A.gemv_avx512, name, raw, xq, xd, xs)
        want, scale = exact(raw, name, xq, xd)
        assert np.max(np.abs(got - want) / scale) < 1e-5, name


@needs_avx512
@pytest.mark.parametrize("name", NAMES)
def test_batch_rows_bit_identical_to_one_row_each(name):
    """Several activation rows (the speculative verify block's M = k + 1) go through the
    multi-column block code, COLS rows per decode, a short last group padded: every output is
    bit-identical to running that activation row alone (batch invariance: the step and the
    verify block agree on the host rows), and within 1e-5 of float64 on the int8 activations."""
    rng = np.random.default_rng(50)
    rows, k = 19, 768
    raw = blocks(rng, name, rows, k)
    for batch in (2, 4, 5, 7, 9):
        xq, xd, xs = quantized(rng.standard_normal((batch, k)).astype(np.float32))
        got = run(A.gemv_avx512, name, raw, xq, xd, xs)
        for b in range(batch):
            one = run(A.gemv_avx512, name, raw, xq[b:b + 1].copy(), xd[b:b + 1].copy(),
                      xs[b:b + 1].copy())
            np.testing.assert_array_equal(got[b:b + 1], one, err_msg=f"{name} B={batch} row {b}")
        want, scale = exact(raw, name, xq, xd)
        assert np.max(np.abs(got - want) / scale) < 1e-5


@pytest.mark.skipif(not A.ENABLED, reason="the AVX-512 kernels are not in use here (host "
                                         "features, or TIGHTFIT_CPU_AVX512=0)")
def test_public_gemv_batches_k_quants_on_the_avx512_kernel():
    """cpu_gemv.gemv sends a 6-row batch of a K-quant to the AVX-512 kernel (not gemv_int, whose
    rounding differs): each row of the result equals that row computed alone, bit for bit, and
    float64 on the int8 activations within 1e-5."""
    rng = np.random.default_rng(51)
    raw = blocks(rng, "Q5_K", 33, 512)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    y = G.gemv(raw, T.Q5_K, x)
    for b in range(6):
        np.testing.assert_array_equal(y[b], G.gemv(raw, T.Q5_K, x[b]))
    want, scale = exact(raw, "Q5_K", *quantized(x)[:2])
    assert np.max(np.abs(y - want) / scale) < 1e-5


def _group_case(rng, batch: int, k: int = 512):
    """Four matrices of the four formats (row counts 301 / 37 / 1 / 53: ragged chunks) as one
    cpu_gemv.Group, its chunk plan, int8 activations for `batch` rows, the per-thread scale
    scratch and a NaN-filled output."""
    mats = [(blocks(rng, n, r, k), T[n]) for n, r in
            (("IQ4_XS", 301), ("Q4_K", 37), ("Q5_K", 1), ("Q6_K", 53))]
    grp = G.Group(mats)
    plan = grp._plan(tuple(range(len(mats))))
    xq, xd, xs = quantized(rng.standard_normal((batch, k)).astype(np.float32))
    ssc = G.per_thread(G._POOL, 16, np.int16)
    return mats, grp, plan, xq, xd, xs, ssc, np.full((batch, grp.n_out), np.nan, np.float32)


@needs_avx512
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_group_kernel_equals_per_matrix(batch):
    """gemv_avx512_group with cpu_gemv.Group's chunk plan: each matrix's columns bit-identical to
    gemv_avx512 on that matrix alone, and next to the AVX2 gemv_simd_group."""
    rng = np.random.default_rng(40 + batch)
    mats, grp, (ws, qts, cols, cm, c0, c1), xq, xd, xs, ssc, y = _group_case(rng, batch)
    A.gemv_avx512_group(ws, qts, cols, cm, c0, c1, xq, xd, xs, y, G._F16, ssc)
    if K.HAVE_AVX2:
        y2 = np.full((batch, grp.n_out), np.nan, np.float32)
        K.gemv_simd_group(ws, qts, cols, cm, c0, c1, xq, xd, xs, y2, G._F16, ssc)
        np.testing.assert_allclose(y, y2, rtol=1e-5, atol=1e-5 * np.abs(y2).max())
    for (a, b), (w, qt) in zip(grp.spans, mats):
        np.testing.assert_array_equal(y[:, a:b], run(A.gemv_avx512, qt.name, w, xq, xd, xs))


@needs_avx512
def test_assembly_uses_zmm_vnni_and_no_64bit_widening():
    """The block code compiles to vpdpbusd / vpdpwssd on zmm registers (Q4_K/Q5_K/Q6_K the
    former, IQ4_XS vpmaddubsw + vpdpwssd) with no 64-bit lane arithmetic or widening."""
    from numba import njit, types
    arr8 = types.Array(types.uint8, 1, "C")
    sig = (arr8, types.Array(types.int8, 1, "C"), types.int64, types.Array(types.int32, 1, "C"),
           types.int64)
    wide = re.compile(r"\b(vpmov[sz]x[bwd]q|vpaddq|vpsubq|vpmul[u]?dq|vpmullq)\b")

    def wrap(bd):
        def f(blk, xq, xo, xs, so):
            return bd(blk, xq, xo, xs, so)
        return njit(sig, cache=False)(f)

    for bd in (A._bd_iq4_xs, A._bd_q4_k, A._bd_q5_k, A._bd_q6_k):
        f = wrap(bd)
        asm = f.inspect_asm(f.signatures[0])
        dp = re.findall(r"^\s*(vpdp\w+)\s+[^\n]*%zmm", asm, re.M)
        assert "vpdpwssd" in dp
        if bd is not A._bd_iq4_xs:
            assert dp.count("vpdpbusd") == 4
        else:
            assert len(re.findall(r"vpmaddubsw\s[^\n]*%zmm", asm)) == 4
        assert not wide.findall(asm), wide.findall(asm)


@needs_avx512
@pytest.mark.parametrize("name", NAMES)
def test_prefetch_changes_nothing_but_the_hint(name):
    """With a software-prefetch distance (TIGHTFIT_CPU_PREFETCH) the outputs are bit-identical,
    also for the last rows, whose prefetches point past the matrix; both kernels."""
    rng = np.random.default_rng(50)
    raw = blocks(rng, name, 29, 768)
    xq, xd, xs = quantized(rng.standard_normal((2, 768)).astype(np.float32))
    ssc = G.per_thread(G._POOL, 16, np.int16)
    want = run(A.gemv_avx512, name, raw, xq, xd, xs)
    # L1 only, L1 + a farther L2 prefetch (prefetcht1), L2 only
    for pf in (64, 1024, 4096, A.prefetch_arg(1024, 8192), A.prefetch_arg(0, 4096)):
        y = np.full_like(want, np.nan)
        A.gemv_avx512(int(T[name]), raw, xq, xd, xs, y, G._F16, ssc, np.int64(pf))
        np.testing.assert_array_equal(y, want)
    grp = G.Group([(raw, T[name])])
    ws, qts, cols, cm, c0, c1 = grp._plan((0,))
    y = np.full_like(want, np.nan)
    A.gemv_avx512_group(ws, qts, cols, cm, c0, c1, xq, xd, xs, y, G._F16, ssc,
                        np.int64(A.prefetch_arg(2048, 8192)))
    np.testing.assert_array_equal(y, want)


def test_prefetch_env_is_checked(monkeypatch):
    """The distance comes from TIGHTFIT_CPU_PREFETCH (default 2048, the device sweep's best);
    anything but a byte count is refused with the variable's name."""
    monkeypatch.delenv("TIGHTFIT_CPU_PREFETCH", raising=False)
    assert A._prefetch_env() == 2048
    monkeypatch.setenv("TIGHTFIT_CPU_PREFETCH", "0")
    assert A._prefetch_env() == 0
    for bad in ("-5", "2k", "1.5"):
        monkeypatch.setenv("TIGHTFIT_CPU_PREFETCH", bad)
        with pytest.raises(ValueError, match="TIGHTFIT_CPU_PREFETCH"):
            A._prefetch_env()


def test_prefetch_l2_env_and_packing(monkeypatch):
    """The L2 distance (TIGHTFIT_CPU_PREFETCH_L2, default 0 = none) rides in the high 32 bits of
    the kernels' pf argument; bad values are refused with the variable's name."""
    monkeypatch.delenv("TIGHTFIT_CPU_PREFETCH_L2", raising=False)
    assert A._prefetch_l2_env() == 0
    monkeypatch.setenv("TIGHTFIT_CPU_PREFETCH_L2", "8192")
    assert A._prefetch_l2_env() == 8192
    assert A.prefetch_arg(2048, 8192) == 2048 + (8192 << 32)
    assert A.prefetch_arg(2048, 0) == 2048
    for bad in ("-1", "8k"):
        monkeypatch.setenv("TIGHTFIT_CPU_PREFETCH_L2", bad)
        with pytest.raises(ValueError, match="TIGHTFIT_CPU_PREFETCH_L2"):
            A._prefetch_l2_env()
    with pytest.raises(ValueError):
        A.prefetch_arg(-1, 0)


# ---- the vector-epilogue row loop (cpu_gemv_avx512_loop): the default AVX-512 host kernel
@needs_avx512
@pytest.mark.parametrize("name", NAMES)
def test_vector_epilogue_exact_and_next_to_the_scalar_form(name):
    """gemv_avx512v: within 1e-5 of float64 on the int8 activations (relative to |x|.|W|), within
    fp32 rounding of the scalar form whose integers test_exact_on_int8_activations... checks bit
    for bit (the same _block_cols IR), and every activation row bit-identical alone or batched."""
    rng = np.random.default_rng(60)
    rows, k = 41, 1280
    raw = blocks(rng, name, rows, k)
    for batch in (1, 2, 5, 9):
        xq, xd, xs = quantized(rng.standard_normal((batch, k)).astype(np.float32))
        got = run(AV.gemv_avx512v, name, raw, xq, xd, xs)
        want, scale = exact(raw, name, xq, xd)
        assert np.max(np.abs(got - want) / scale) < 1e-5
        scalar = run(A.gemv_avx512, name, raw, xq, xd, xs)
        assert np.max(np.abs(got - scalar) / scale) < 1e-6
        for b in range(batch):
            one = run(AV.gemv_avx512v, name, raw, xq[b:b + 1].copy(), xd[b:b + 1].copy(),
                      xs[b:b + 1].copy())
            np.testing.assert_array_equal(got[b:b + 1], one, err_msg=f"{name} B={batch} row {b}")


@needs_avx512
@pytest.mark.parametrize("name", NAMES)
def test_vector_epilogue_extremes(name):
    """Largest codes and scales, x = +-127 everywhere: the int32 lanes converted to fp32 (exact
    below 2^24) still give the float64 result within 1e-5."""
    raw, xq, xd, xs = extreme_case(np.random.default_rng(61), name, 3)
    got = run(AV.gemv_avx512v, name, raw, xq, xd, xs)
    want, scale = exact(raw, name, xq, xd)
    assert np.max(np.abs(got - want) / scale) < 1e-5


@needs_avx512
@pytest.mark.parametrize("batch", [1, 5])
def test_vector_group_kernel_equals_per_matrix(batch):
    """gemv_avx512v_group with Group's chunk plan: each matrix's columns bit-identical to
    gemv_avx512v on that matrix alone and within 1e-5 of float64 on the int8 activations."""
    rng = np.random.default_rng(62 + batch)
    mats, grp, (ws, qts, cols, cm, c0, c1), xq, xd, xs, ssc, y = _group_case(rng, batch)
    AV.gemv_avx512v_group(ws, qts, cols, cm, c0, c1, xq, xd, xs, y, G._F16, ssc)
    for (a, b), (w, qt) in zip(grp.spans, mats):
        np.testing.assert_array_equal(y[:, a:b], run(AV.gemv_avx512v, qt.name, w, xq, xd, xs))
        want, scale = exact(w, qt.name, xq, xd)
        assert np.max(np.abs(y[:, a:b] - want) / scale) < 1e-5


def test_epilogue_switch(monkeypatch):
    """TIGHTFIT_CPU_EPILOGUE picks the kernel pair; anything else is refused with a clear error."""
    monkeypatch.setenv("TIGHTFIT_CPU_EPILOGUE", "scalar")
    assert G._epilogue_env() == "scalar"
    monkeypatch.setenv("TIGHTFIT_CPU_EPILOGUE", "vector")
    assert G._epilogue_env() == "vector"
    monkeypatch.setenv("TIGHTFIT_CPU_EPILOGUE", "fast")
    with pytest.raises(ValueError, match="TIGHTFIT_CPU_EPILOGUE"):
        G._epilogue_env()
    if A.ENABLED and G._VEC:
        assert G._SIMD_ONE is AV.gemv_avx512v and G._SIMD_GRP is AV.gemv_avx512v_group
