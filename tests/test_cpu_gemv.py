"""CPU GEMV on raw GGUF blocks vs gguf-py's dequantizer + float64 matmul, on fresh random blocks.

Error bounds are relative to |x|.|W| per output: the integer kernels quantize x to int8 per 256
(round-to-nearest: |err| <= amax/254 per element, about 2e-3 of |x|.|W| on Gaussian data; bound
1e-2); the 32-element types and the fallback keep x in fp32 (bound 1e-5)."""
from __future__ import annotations

import numpy as np
import pytest
import gguf.quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from tightfit.kernels import cpu_gemv as G

# byte offsets of the fp16 scale fields (spec/quant-formats.md §2.3); set to sane finite values
SCALES = {"Q8_0": [0], "Q4_0": [0], "IQ4_NL": [0], "IQ4_XS": [0], "Q2_K": [80, 82],
          "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "F16": None,
          "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
          "Q5_0": [0], "IQ2_XXS": [0]}   # last two: fallback path
INT8_ACT = {"IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"}


def blocks(rng, name, rows, k):
    qt = T[name]
    bs, ts = GGML_QUANT_SIZES[qt]
    if SCALES[name] is None:
        return rng.standard_normal((rows, k)).astype(np.float16).view(np.uint8)
    raw = rng.integers(0, 256, (rows, k // bs * ts), dtype=np.uint8)
    b = raw.reshape(rows, -1, ts)
    for o in SCALES[name]:
        b[:, :, o:o + 2] = rng.uniform(-0.1, 0.1, b.shape[:2]).astype(np.float16).view(
            np.uint8).reshape(rows, -1, 2)
    return raw


def reference(raw, name, rows, k):
    return gguf.quants.dequantize(raw, T[name]).astype(np.float64).reshape(rows, k)


@pytest.mark.parametrize("name", list(SCALES))
@pytest.mark.parametrize("batch", [1, 3, 16])
def test_gemv_matches_numpy(name, batch):
    rng = np.random.default_rng(abs(hash((name, batch))) % 2**32)
    rows, k = 37, 512 + 256 * (name in ("Q8_0", "Q4_0", "IQ4_NL"))   # 768: a tail of < 8 blocks
    raw = blocks(rng, name, rows, k)
    x = rng.standard_normal((batch, k)).astype(np.float32)
    W = reference(raw, name, rows, k)
    want = x.astype(np.float64) @ W.T
    got = G.gemv(raw, T[name], x)
    scale = np.abs(x).astype(np.float64) @ np.abs(W).T + 1e-30
    tol = 1e-2 if name in INT8_ACT else 1e-5
    assert got.shape == (batch, rows)
    assert np.max(np.abs(got - want) / scale) < tol
    one = G.gemv(raw, T[name], x[0])
    assert one.shape == (rows,)
    assert np.max(np.abs(one - want[0]) / scale[0]) < tol
    if name in INT8_ACT:   # not merely inside the bound: the typical error is int8-sized
        assert np.median(np.abs(got - want) / scale) < 3e-3


@pytest.mark.parametrize("name", ["Q3_K", "Q4_K", "Q6_K", "IQ4_XS", "Q8_0", "Q5_0"])
def test_decode_rows_matches_dequant(name):
    rng = np.random.default_rng(7)
    rows, k = 50, 768
    raw = blocks(rng, name, rows, k)
    W = reference(raw, name, rows, k)
    ids = [0, 49, 17, 17]
    got = G.decode_rows(raw, T[name], ids)
    np.testing.assert_allclose(got, W[ids], rtol=1e-6, atol=1e-7)


def test_gemv_on_a_view_of_the_bytes():
    """Host rows are read in place: an offset view into a larger buffer must work unchanged."""
    rng = np.random.default_rng(3)
    raw = blocks(rng, "Q4_K", 64, 256)
    buf = np.concatenate([np.zeros(100, np.uint8), raw.reshape(-1)]).tobytes()
    view = G.as_rows(buf, raw.shape[1], 64, offset=100)
    assert not view.flags.writeable   # like the read-only mmap
    x = rng.standard_normal(256).astype(np.float32)
    W = reference(raw, "Q4_K", 64, 256)
    err = np.abs(G.gemv(view, T.Q4_K, x) - x.astype(np.float64) @ W.T)
    assert np.max(err / (np.abs(x).astype(np.float64) @ np.abs(W).T)) < 1e-2


def test_threads_and_reuse():
    """Thread count is configurable; results do not depend on it, nor on earlier calls that
    reused the scratch with another batch size; `out` is filled in place."""
    rng = np.random.default_rng(5)
    raw = blocks(rng, "Q5_K", 70, 512)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    old = G.n_threads()
    try:
        assert G.set_threads(1) == 1
        one = G.gemv(raw, T.Q5_K, x)
        G.gemv(raw, T.Q5_K, x[:2])
        G.set_threads(None)
        out = np.empty((4, 70), np.float32)
        got = G.gemv(raw, T.Q5_K, x, out=out)
        assert got.base is out or got is out
        np.testing.assert_array_equal(one, out)
    finally:
        G.set_threads(old)


def test_zero_activation_block():
    """An all-zero 256-slice of x (amax = 0) must give exactly the float result, not NaN."""
    rng = np.random.default_rng(6)
    raw = blocks(rng, "Q4_K", 8, 512)
    x = rng.standard_normal(512).astype(np.float32)
    x[:256] = 0
    want = x.astype(np.float64) @ reference(raw, "Q4_K", 8, 512).T
    got = G.gemv(raw, T.Q4_K, x)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-2 * np.abs(want).max())


def test_shape_mismatch_is_an_error():
    raw = np.zeros((4, 34), np.uint8)
    with pytest.raises(ValueError):
        G.gemv(raw, T.Q8_0, np.zeros(64, np.float32))
    with pytest.raises(IndexError):
        G.decode_rows(raw, T.Q8_0, [4])


@pytest.mark.parametrize("name", ["IQ4_XS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"])
def test_iq_kernel_extreme_scales(name):
    """gemv_iq's int16 scaled codes and int32 sums at their largest: every sub-block scale at its
    maximum (IQ4_XS: both ends, -32 and +31), a constant-magnitude x so every xq code is +-127."""
    rng = np.random.default_rng(11)
    rows, k = 9, 1024
    raw = blocks(rng, name, rows, k)
    b = raw.reshape(rows, -1, GGML_QUANT_SIZES[T[name]][1])
    scale_bytes = {"IQ2_XS": slice(66, 74), "IQ2_S": slice(74, 82), "IQ3_XXS": None,
                   "IQ3_S": slice(106, 110), "IQ4_XS": slice(2, 8)}[name]
    if name == "IQ3_XXS":
        b[:, :, 66:98].reshape(rows, -1, 8, 4)[..., 3] |= 0xF0     # top nibble of each u32
    else:
        b[:, :, scale_bytes] = 0xFF
        if name == "IQ4_XS":
            b[:, ::2, 2:8] = 0x00                                  # ls = 0: scale -32
    x = np.where(rng.random((2, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    W = reference(raw, name, rows, k)
    want = x.astype(np.float64) @ W.T
    got = G.gemv(raw, T[name], x)
    scale = np.abs(x).astype(np.float64) @ np.abs(W).T + 1e-30
    assert np.max(np.abs(got - want) / scale) < 1e-5              # +-1 quantizes exactly


def test_per_thread_scratch_rows_never_share_a_cache_line():
    """Every per-thread scratch row the kernels write at each 256-block (accumulators, mins, block
    scales, decode buffers) starts on its own 128-byte boundary. Packed rows put 16 threads'
    4-byte accumulators in one cache line: it then ping-pongs between cores once per block and
    the 16-thread host GEMV ran at ~2 GB/s on the device (issue 5, 8 GiB budget: 0.29 tok/s)."""
    for B, K in [(1, 5120), (3, 17408), (33, 256)]:
        s = G._scratch(B, K)
        for name in ("buf", "mins", "fbuf", "dsc", "acc", "b64", "b8", "sc64", "sc", "ssc"):
            a = getattr(s, name)
            assert a.shape[0] == G._POOL and a.flags.c_contiguous, name
            assert a.ctypes.data % G.LINE == 0, name
            assert a.strides[0] % G.LINE == 0, name
        assert s.acc.shape[1] >= B and s.mins.shape[1] >= 16 and s.dsc.shape[1] >= 8
        assert s.ssc.shape[1] >= 16
        assert s.b8.shape[1] == 256 and s.sc.shape[1] == 256   # two views of the same rows
        assert s.buf.shape[1] == 256 and s.fbuf.shape[1] == 256


def test_seed_mix_formats_take_the_parallel_kernels(monkeypatch):
    """Every matrix type of the seed-mix 27B (all of which the planner may leave on the host) goes
    through a parallel numba kernel, never the NumPy dequantize-then-matmul fallback; the
    embedding's type decodes natively."""
    from tightfit.kernels import cpu_gemv_kern as K
    from tightfit.plan.placement import inventory_from_preset
    inv = inventory_from_preset("qwen3.8-27b-seedmix")
    mats = {t.qtype for n, t in inv.tensors.items() if len(t.ne) == 2 and n != "token_embd.weight"
            and t.qtype not in (0, 1)}
    assert mats, "no quantized matrices in the preset"
    for qt in mats:
        assert qt in K.INT_TYPES or qt in K.F32_TYPES, f"type {qt} has no parallel kernel"
    assert inv.tensors["token_embd.weight"].qtype in G._DECODE_NATIVE

    def no_fallback(*a, **k):
        raise AssertionError("NumPy fallback used")
    monkeypatch.setattr(G, "_dequant_rows", no_fallback)
    names = {int(getattr(T, n)): n for n in SCALES if hasattr(T, n)}
    rng = np.random.default_rng(12)
    for qt in sorted(mats):
        raw = blocks(rng, names[qt], 8, 512)
        assert np.all(np.isfinite(G.gemv(raw, qt, rng.standard_normal(512).astype(np.float32))))
    for kern in (K.gemv_int, K.gemv_iq, K.gemv_f32, K.gemv_simd):
        assert kern.targetoptions.get("parallel"), kern


def test_chunked_schedule_same_result_and_restored():
    """gemv runs its rows in dynamic chunks and puts numba's chunk size back afterwards; the
    result does not depend on the chunking (each row is one thread's exact int32 sum)."""
    import numba
    rng = np.random.default_rng(13)
    raw = blocks(rng, "IQ4_XS", 300, 512)
    x = rng.standard_normal(512).astype(np.float32)
    got = G.gemv(raw, T.IQ4_XS, x)
    if hasattr(numba, "get_parallel_chunksize"):
        assert numba.get_parallel_chunksize() == 0
    old = G.n_threads()
    try:
        G.set_threads(1)
        np.testing.assert_array_equal(G.gemv(raw, T.IQ4_XS, x), got)
    finally:
        G.set_threads(old)


# ---- the AVX2 kernel (gemv_simd) ------------------------------------------------------------
SIMD_NAMES = ["IQ4_XS", "Q4_K", "Q5_K", "Q6_K"]
needs_simd = pytest.mark.skipif(not G.SIMD, reason="no AVX2 on this host (or TIGHTFIT_CPU_SIMD=0)")


def _int8_exact(raw, name, x, rows, k):
    """The GEMV with x replaced by exactly what the kernels multiply: its int8 codes times the
    per-256 scale. The integer kernels are exact on that up to the fp32 block sums."""
    from tightfit.kernels import cpu_gemv_kern as K
    B = x.shape[0]
    xq, xd, xs = np.zeros((B, k), np.int8), np.zeros((B, k // 256), np.float32), \
        np.zeros((B, k // 16), np.int32)
    K.quantize_act(x, xq, xd, xs)
    xdq = (xq.astype(np.float64).reshape(B, -1, 256) * xd[:, :, None]).reshape(B, k)
    W = reference(raw, name, rows, k)
    return xdq @ W.T, np.abs(xdq) @ np.abs(W).T + 1e-30


@needs_simd
@pytest.mark.parametrize("name", SIMD_NAMES)
def test_simd_kernel_is_exact_and_agrees_with_portable(name):
    """gemv_simd vs float64 on the int8 activations (1e-6: int32-exact sums, fp32 block
    factors), and vs the portable numba kernels it replaces (gemv_int / gemv_iq)."""
    from tightfit.kernels import cpu_gemv_kern as K
    assert T[name] in G.SIMD
    rng = np.random.default_rng(21)
    rows, k = 45, 1280
    raw = blocks(rng, name, rows, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    want, scale = _int8_exact(raw, name, x, rows, k)
    got = G.gemv(raw, T[name], x)
    assert np.max(np.abs(got - want) / scale) < 1e-6
    s = G._scratch(3, k)
    y = np.zeros((3, rows), np.float32)
    if name == "IQ4_XS":
        g64, m64, p16 = G._IQ[T[name]]
        xqp = K.permute_iq4(s.xq, s.xqp)
        K.gemv_iq(int(T[name]), raw, xqp, s.xd, y, G._F16, g64, m64, p16, s.b8, s.b64, s.sc,
                  s.sc64, s.acc)
    else:
        K.gemv_int(int(T[name]), raw, s.xq, s.xd, s.xs, y, G._F16, s.buf, s.mins, s.acc)
    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-6 * np.abs(y).max())


@needs_simd
@pytest.mark.parametrize("name", SIMD_NAMES)
def test_simd_kernel_extreme_codes_and_scales(name):
    """No int16 saturation in vpmaddubsw / vpmaddwd: every code and sub-block scale at its
    largest magnitude (IQ4_XS: codebook -127 at scale -32; Q6_K: code 63 at scale -128; Q4_K/Q5_K:
    code 15/31 at scale 63, min 63), x = +-1 so every xq code is +-127 (x quantizes exactly)."""
    rng = np.random.default_rng(22)
    rows, k = 7, 768
    raw = blocks(rng, name, rows, k)
    b = raw.reshape(rows, -1, GGML_QUANT_SIZES[T[name]][1])
    if name == "IQ4_XS":
        b[:, :, 2:8] = 0x00                 # ls = 0: scale -32
        b[:, :, 8:] = 0x00                  # codebook value -127 everywhere
        b[:, 1::2, 8:] = 0xFF               # ... and +113 in every other block
    elif name == "Q6_K":
        b[:, :, 0:192] = 0xFF               # code 63 (value +31) everywhere
        b[:, :, 192:208] = 0x80             # scale -128
    else:
        b[:, :, 4:16] = 0xFF                # every 6-bit scale and min 63
        b[:, :, 16:] = 0xFF                 # codes 15 / 31
    x = np.where(rng.random((2, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    x[1] = 1.0                              # all +127: the largest same-sign pair sums
    W = reference(raw, name, rows, k)
    want = x.astype(np.float64) @ W.T
    got = G.gemv(raw, T[name], x)
    scale = np.abs(x).astype(np.float64) @ np.abs(W).T + 1e-30
    assert np.max(np.abs(got - want) / scale) < 1e-5


def test_simd_switch_and_fallback_types():
    """Without AVX2 the SIMD set is empty (the portable kernels run everything); with it, it is
    exactly the four seed-mix types and every other integer type keeps its portable kernel."""
    from tightfit.kernels import cpu_gemv_kern as K
    assert set(K.SIMD_TYPES) == (set() if not K.HAVE_AVX2 else {T.IQ4_XS, T.Q4_K, T.Q5_K, T.Q6_K})
    assert set(G.SIMD) <= set(K.SIMD_TYPES) <= set(K.INT_TYPES)


# ---- grouped host call (issue 5): several matrices sharing x in one parallel call -------------
GROUP_MIX = ["IQ4_XS", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ2_S", "Q5_0"]   # SIMD + fallbacks


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_group_equals_per_matrix_bit_for_bit(batch):
    """Mixed formats, odd row counts (incl. a 1-row and a 0-row matrix), read-only and writable
    arrays: each matrix's columns of the grouped output equal its own gemv exactly."""
    rng = np.random.default_rng(50 + batch)
    k = 512
    mats = []
    for i, name in enumerate(GROUP_MIX):
        rows = (1, 37, 0, 53, 19, 7, 11)[i]
        raw = blocks(rng, name, max(rows, 1), k)[:rows]
        if i % 2:
            raw.flags.writeable = False
        mats.append((raw, T[name]))
    mats.append((blocks(rng, "IQ4_XS", 301, k), T["IQ4_XS"]))   # many chunks
    x = rng.standard_normal((batch, k)).astype(np.float32)
    grp = G.Group(mats)
    want = [G.gemv(w, q, x) for w, q in mats]
    for threads in (1, None):
        G.set_threads(threads)
        try:
            got = grp.gemv(x)
        finally:
            G.set_threads(None)
        assert got.shape == (batch, grp.n_out) and grp.n_out == sum(w.shape[0] for w, _ in mats)
        for (a, b), y in zip(grp.spans, want):
            assert np.array_equal(got[:, a:b], y)
    out = np.full((1, grp.n_out), np.nan, np.float32)
    one = grp.gemv(x[0], out=out)
    assert one.shape == (grp.n_out,) and np.shares_memory(one, out)
    for (a, b), (w, q) in zip(grp.spans, mats):
        assert np.array_equal(out[0, a:b], G.gemv(w, q, x[0]))


def test_group_checks_shapes():
    rng = np.random.default_rng(7)
    with pytest.raises(ValueError):
        G.Group([(blocks(rng, "Q4_K", 4, 256), T["Q4_K"]),
                 (blocks(rng, "Q4_K", 4, 512), T["Q4_K"])])
    grp = G.Group([(blocks(rng, "Q4_K", 4, 256), T["Q4_K"])])
    with pytest.raises(ValueError):
        grp.gemv(np.zeros(512, np.float32))
    with pytest.raises(ValueError):
        grp.gemv(np.zeros(256, np.float32), out=np.zeros((1, 3), np.float32))


def test_group_balances_chunks_by_bytes():
    """The chunk plan covers every row once, and chunks hold about equal bytes."""
    rng = np.random.default_rng(8)
    mats = [(blocks(rng, "IQ4_XS", 640, 256), T["IQ4_XS"]),
            (blocks(rng, "Q6_K", 96, 256), T["Q6_K"])]
    grp = G.Group(mats)
    idx = grp._grouped(1)
    if not idx:
        pytest.skip("no AVX2 kernel on this host")
    _ws, _q, _c, cm, c0, c1 = grp._plan(idx)
    for j, i in enumerate(idx):
        sel = cm == j
        r = sorted(zip(c0[sel], c1[sel]))
        assert r[0][0] == 0 and r[-1][1] == mats[i][0].shape[0]
        assert all(a[1] == b[0] for a, b in zip(r, r[1:]))
    rb = np.array([mats[idx[m]][0].shape[1] for m in cm])
    nb = (c1 - c0) * rb
    assert nb.max() <= 2 * nb.min() + 2 * rb.max()
