"""CUDA GEMV format code (tightfit/kernels/cuda/gemv_fmt_main.cuh) compiled as host C++ and run
through the CPU harness (tightfit.kernels.cuda_host) against gguf-py's dequantization.

Bounds:
- vs the float64 product of gguf.quants.dequantize(W) and the DE-quantized int8 activations (what
  the kernel computes exactly in integers): 1e-5 relative (fp32 scale products and summation order
  only; ~1e-7 seen; a decoding bug gives O(1));
- vs the float activations: 2e-2 relative on outputs of >= 8 values (int8 per-32 rounding of x,
  0.3-0.7 % on random data), and everywhere the hard bound |err| <= sum_i |w_i| * d_i / 2 (each
  activation is off by at most half its step d).
"""
from __future__ import annotations

import os  # noqa: E402
import torch  # noqa: E402

# Triton decides interpreter mode when a @triton.jit module is imported, and modules are imported
# once per test session: without a GPU they must come in interpreted, as every kernel test expects
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import functools
import re
import shutil

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gg_dequantize  # noqa: E402

from tightfit.kernels import cuda_host  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act_ref  # noqa: E402
from tightfit.quant.traits import traits  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="no host C++ compiler")

MAIN_TYPES = [8, 2, 6, 20, 23, 12, 13, 14]   # Q8_0 Q4_0 Q5_0 IQ4_NL IQ4_XS Q4_K Q5_K Q6_K
NAMES = {8: "Q8_0", 2: "Q4_0", 6: "Q5_0", 20: "IQ4_NL", 23: "IQ4_XS", 12: "Q4_K", 13: "Q5_K",
         14: "Q6_K"}
F16_FIELDS = {8: [0], 2: [0], 6: [0], 20: [0], 23: [0], 12: [0, 2], 13: [0, 2], 14: [208]}


def rand_blocks(rng, t, rows, k, subnormal=False):
    """Random bytes with sane fp16 scales (every bit pattern of the code bytes is a valid block)."""
    tr = traits(t)
    raw = rng.integers(0, 256, size=(rows * k // tr.block_size, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        sc = rng.uniform(0.001, 0.01, raw.shape[0]) * rng.choice([-1.0, 1.0], raw.shape[0])
        if subnormal:
            sc[::3] = rng.uniform(1e-7, 6e-5, sc[::3].shape)        # fp16 subnormals
        raw[:, off:off + 2] = sc.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def reference(t, w, x):
    rows = w.shape[0]
    k = x.shape[1]
    W = gg_dequantize(w, gguf.GGMLQuantizationType(t)).astype(np.float64).reshape(rows, k)
    q, d, s16 = quantize_act_ref(x)
    xdq = (q * d[..., None]).reshape(x.shape)
    step = np.repeat(d, 32, axis=1) / 2                       # max |x - q*d| per element
    hard = step @ np.abs(W).T
    return xdq @ W.T, x.astype(np.float64) @ W.T, (q.reshape(x.shape), d, s16), hard


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_case(t, rows, k, n, seed, subnormal=False):
    rng = np.random.default_rng(seed)
    w = rand_blocks(rng, t, rows, k, subnormal)
    x = rng.standard_normal((n, k)).astype(np.float32)
    refq, reff, (q, d, s16), hard = reference(t, w, x)
    y = cuda_host.host_gemv(t, w, q, d, s16)
    assert y.shape == (n, rows) and y.dtype == np.float32
    what = f"{NAMES[t]} rows={rows} K={k} N={n}"
    assert rel(y, refq) < 1e-5, f"{what}: {rel(y, refq):.2e} vs quantized-x reference"
    assert np.all(np.abs(y - reff) <= hard * 1.001 + 1e-5 * np.abs(reff).max()), what
    if y.size >= 8:
        assert rel(y, reff) < 2e-2, f"{what}: {rel(y, reff):.2e} vs float reference"
    return w, x, (q, d, s16), y


def test_harness_builds():
    assert cuda_host.host_available()
    assert set(MAIN_TYPES) <= set(cuda_host.host_types())


@pytest.mark.parametrize("t", MAIN_TYPES, ids=NAMES.get)
def test_struct_matches_traits(t):
    qk, bb, parts = cuda_host.host_info(t)
    tr = traits(t)
    assert (qk, bb) == (tr.block_size, tr.type_size)
    assert parts in (1, 2, 4, 8, 16, 32)


@pytest.mark.parametrize("k", [256, 512, 1024])
@pytest.mark.parametrize("t", MAIN_TYPES, ids=NAMES.get)
def test_host_gemv(t, k):
    for i, (rows, n) in enumerate([(1, 1), (7, 3), (40, 8), (13, 16), (5, 2), (3, 11)]):
        run_case(t, rows, k, n, seed=1000 * t + k + i)


@pytest.mark.parametrize("t", [8, 2, 6, 20], ids=NAMES.get)
def test_host_gemv_32_multiples(t):
    for i, k in enumerate([32, 96, 160, 5120 // 16]):
        run_case(t, 9, k, 1 + i % 8, seed=77 * t + i)


@pytest.mark.parametrize("t", MAIN_TYPES, ids=NAMES.get)
def test_host_gemv_all_columns(t):
    for n in range(1, 9):
        run_case(t, 4, 256, n, seed=31 * t + n)


@pytest.mark.parametrize("t", MAIN_TYPES, ids=NAMES.get)
def test_subnormal_scales(t):
    run_case(t, 6, 512, 2, seed=5 * t, subnormal=True)


@pytest.mark.parametrize("t", MAIN_TYPES, ids=NAMES.get)
def test_corrupted_block_changes_result(t):
    """The harness really reads every byte class: flipping code bits of one block moves that
    row's output (and only that row)."""
    w, x, (q, d, s16), y = run_case(t, 5, 512, 2, seed=9 * t)
    tr = traits(t)
    w2 = w.copy()
    off = F16_FIELDS[t][0]
    j = (off + 4) % tr.type_size if t != 14 else 17          # a code byte, not the scale
    w2[3, j] ^= 0x77
    y2 = cuda_host.host_gemv(t, w2, q, d, s16)
    assert not np.allclose(y2[:, 3], y[:, 3])
    np.testing.assert_array_equal(np.delete(y2, 3, axis=1), np.delete(y, 3, axis=1))
    refq2 = reference(t, w2, x)[0]
    assert rel(y2, refq2) < 1e-5


def test_bad_inputs():
    rng = np.random.default_rng(0)
    w = rand_blocks(rng, 12, 2, 256)
    q, d, s16 = quantize_act_ref(rng.standard_normal((1, 256)))
    with pytest.raises(ValueError):
        cuda_host.host_gemv(999, w, q.reshape(1, 256), d, s16)
    with pytest.raises(ValueError):
        cuda_host.host_gemv(12, w[:, :-1], q.reshape(1, 256), d, s16)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_sm90_no_spills():
    # compile_report needs a concrete variant ("auto" is not one): the N = 1 modules, v2h (the
    # default's) and v4. v3 (launch bounds without a register cap) is not held to 64 registers.
    from tightfit.kernels.gemv_cuda import NCS, compile_report
    for kern in ("v2h", "v4"):
        rows = compile_report("sm_90", lowbit=False, kern=kern)
        got = {(r["type"], r["nc"]) for r in rows}
        assert got == {(t, nc) for t in MAIN_TYPES for nc in NCS}, kern
        spills = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
        assert not spills, (kern, spills)
        # v4's Q6_K at NC = 1 is tf_gemv5 (built for <= 80 registers: session 5's measured winner)
        big = [r for r in rows if r["nc"] <= 4 and r["regs"] > (
            80 if (kern == "v4" and r["nc"] == 1 and r["format"] == "F_Q6_K") else 64)]
        assert not big, (kern, big)


# ---------------------------------------------------------------- single-column compute1 (kern v4)
# tf_gemv4 (gemv_kernel.cuh) calls F::load + F::compute1 at N = 1 where a format has compute1; the
# harness's dot<NC> goes through compute<NC> (what v2 / v3 run). This driver runs load + compute1
# for every (block, part) so that path is checked against gguf-py the same way.
_C1_DRIVER = r"""
// ---- compute1 driver (tests/test_gemv_cuda_host.py)
template <class F, class = void> struct tf_t_c1 { static constexpr bool value = false; };
template <class F> struct tf_t_c1<F, decltype((void)&F::compute1)> { static constexpr bool value = true; };
template <class F, class = void> struct tf_t_l1 { static constexpr bool value = false; };
template <class F> struct tf_t_l1<F, decltype((void)&F::load1)> { static constexpr bool value = true; };
template <class F>
static int tf_run1(const uint8_t* w, int rows, int row_bytes, const int8_t* xq, const float* xd,
                   const int32_t* xs, int K, float* y) {
  if constexpr (!tf_t_c1<F>::value) {
    return -3;
  } else {
    if (K % F::QK || row_bytes != (K / F::QK) * F::BB) return -2;
    const int nb = K / F::QK;
    for (int r = 0; r < rows; ++r) {
      float acc = 0.f;
      for (int b = 0; b < nb; ++b)
        for (int p = 0; p < F::PARTS; ++p) {
          typename F::Raw raw;
          const uint8_t* blk = w + (size_t)r * row_bytes + (size_t)b * F::BB;
          if constexpr (tf_t_l1<F>::value) F::load1(blk, p, raw);   // as tf_load1 (gemv_kernel.cuh)
          else F::load(blk, p, raw);
          F::compute1(raw, p, xq + (size_t)b * F::QK, xd + b * (F::QK / 32),
                      (const int*)xs + b * (F::QK / 16), K, acc);
        }
      y[r] = acc;
    }
    return 0;
  }
}
extern "C" int tf_host_gemv1(int qtype, const uint8_t* w, int rows, int row_bytes, const int8_t* xq,
                             const float* xd, const int32_t* xs, int K, float* y) {
  switch (qtype) {
#define TF_TYPE_CASE(F, T) case T: return tf_run1<F>(w, rows, row_bytes, xq, xd, xs, K, y);
    TF_MAIN_FORMATS(TF_TYPE_CASE)
#undef TF_TYPE_CASE
  }
  return -1;
}
"""
C1_TYPES = [23, 13, 14]  # formats with compute1 (F_IQ4_XS; F_Q5_K, F_Q6_K for kern v5)


@functools.lru_cache(maxsize=1)
def _c1_lib():
    import ctypes
    from tightfit.kernels.cuda_source import formats_source
    lib = ctypes.CDLL(str(cuda_host.compile_host(formats_source(False, lowbit=False) + _C1_DRIVER)))
    P = ctypes.c_void_p
    lib.tf_host_gemv1.argtypes = [ctypes.c_int, P, ctypes.c_int, ctypes.c_int, P, P, P,
                                  ctypes.c_int, P]
    lib.tf_host_gemv1.restype = ctypes.c_int
    return lib


def host_gemv1(t, w, q, d, s16):
    lib = _c1_lib()
    w = np.ascontiguousarray(w, np.uint8)
    q = np.ascontiguousarray(q, np.int8).reshape(-1)
    d = np.ascontiguousarray(d, np.float32).reshape(-1)
    s16 = np.ascontiguousarray(np.rint(np.asarray(s16, np.float64)), np.int32).reshape(-1)
    # compute1 reads xd / xs16 pairs with 8-byte loads on the device: keep the host copies aligned too
    assert d.ctypes.data % 8 == 0 and s16.ctypes.data % 8 == 0 and q.ctypes.data % 16 == 0
    y = np.empty(w.shape[0], np.float32)
    rc = lib.tf_host_gemv1(t, w.ctypes.data, w.shape[0], w.shape[1], q.ctypes.data, d.ctypes.data,
                           s16.ctypes.data, q.size, y.ctypes.data)
    if rc:
        raise ValueError(f"tf_host_gemv1 rc={rc} for type {t}")
    return y


def test_compute1_formats_listed():
    """Every format with compute1 is tested below (and only those answer the driver)."""
    from tightfit.kernels.cuda_source import formats_source
    src = formats_source(False, lowbit=False)
    with_c1 = [t for t in MAIN_TYPES if re.search(
        r"struct F_\w+ \{\s*static constexpr int TYPE = %d\b(?:(?!\nstruct ).)*?compute1\(" % t,
        src, re.S)]
    assert sorted(with_c1) == sorted(C1_TYPES)


@pytest.mark.parametrize("k", [256, 1024, 5120, 17408])
@pytest.mark.parametrize("t", C1_TYPES, ids=NAMES.get)
def test_compute1(t, k):
    for i, (rows, subnormal) in enumerate([(1, False), (9, False), (33, True)]):
        rng = np.random.default_rng(4242 + 7 * t + k + i)
        w = rand_blocks(rng, t, rows, k, subnormal)
        x = rng.standard_normal((1, k)).astype(np.float32)
        if i == 2:
            x[0, ::5] *= 40.0       # large |x| outliers: int8 ends saturate at +-127
        refq, reff, (q, d, s16), hard = reference(t, w, x)
        y = host_gemv1(t, w, q, d, s16)
        what = f"{NAMES[t]} compute1 rows={rows} K={k}"
        assert rel(y[None], refq) < 1e-5, f"{what}: {rel(y[None], refq):.2e}"
        assert np.all(np.abs(y[None] - reff) <= hard * 1.001 + 1e-5 * np.abs(reff).max()), what
        # same as the compute<NC> path up to fp32 rounding of the scale products
        y0 = cuda_host.host_gemv(t, w, q, d, s16)[0]
        # (fp32 partial sums and scale products in a different order; rows=1 is a single,
        # possibly cancelling output: 1.4e-6 seen for Q5_K at K = 5120, 1.8e-6 IQ4_XS at 17408)
        assert rel(y, y0) < 5e-6, f"{what}: {rel(y, y0):.2e} vs compute<1>"


@pytest.mark.parametrize("t", [23], ids=NAMES.get)
def test_compute1_all_codes_and_scales(t):
    """Every 4-bit code in every nibble position and every 6-bit scale: one-hot x picks single
    weights, so a wrong lookup or scale shows up as an exact mismatch with gguf-py."""
    assert t == 23
    tr = traits(t)
    rng = np.random.default_rng(7)
    rows, k = 64, 256
    raw = rng.integers(0, 256, size=(rows, tr.type_size), dtype=np.uint8)
    raw[:, 0:2] = np.array([0.01], np.float16).view(np.uint8)       # d
    ls = (np.arange(rows * 8) % 64).reshape(rows, 8)                 # 64 scales, each sub-block
    sh = np.zeros(rows, np.uint32)
    for j in range(8):
        sh |= ((ls[:, j] >> 4) & 3).astype(np.uint32) << (2 * j)
    raw[:, 2] = sh & 0xFF
    raw[:, 3] = sh >> 8
    for j in range(4):
        raw[:, 4 + j] = (ls[:, 2 * j] & 15) | ((ls[:, 2 * j + 1] & 15) << 4)
    r_, j_ = np.meshgrid(np.arange(rows), np.arange(128), indexing="ij")
    raw[:, 8:] = (17 * r_ + j_) % 256            # both nibbles of every byte run through 0..15
    W = gg_dequantize(raw, gguf.GGMLQuantizationType(t)).astype(np.float64).reshape(rows, k)
    for e in range(k):
        q = np.zeros((1, k), np.int8)
        q[0, e] = 127 if e % 2 else -127
        d = np.full((1, k // 32), 0.5, np.float32)
        s16 = q.reshape(1, -1, 16).astype(np.int32).sum(-1)
        y = host_gemv1(t, raw, q, d, s16)
        np.testing.assert_allclose(y, W[:, e] * q[0, e] * 0.5, rtol=1e-6, atol=0)


def _onehot_check(t, raw, k, scale=0.5, atol=1e-12):
    """Every element e of the block row: one-hot x (+-127 at e) picks W[:, e] (up to fp32 rounding;
    atol for Q5_K, whose d*sc*q - dmin*m cancels: the smallest decoding error, one code or min step,
    is >= 1e-3 there)."""
    rows = raw.shape[0]
    W = gg_dequantize(raw, gguf.GGMLQuantizationType(t)).astype(np.float64).reshape(rows, k)
    for e in range(k):
        q = np.zeros((1, k), np.int8)
        q[0, e] = 127 if e % 2 else -127
        d = np.full((1, k // 32), scale, np.float32)
        s16 = q.reshape(1, -1, 16).astype(np.int32).sum(-1)
        y = host_gemv1(t, raw, q, d, s16)
        np.testing.assert_allclose(y, W[:, e] * q[0, e] * scale, rtol=2e-6, atol=atol,
                                   err_msg=f"{NAMES[t]} element {e}")


def test_compute1_q5k_all_scales_mins_and_codes():
    """Q5_K compute1 (kern v5): every 6-bit scale and min in every sub-block slot (both packings of
    the 12-byte scale field), every 5-bit code in every nibble / qh-bit position."""
    t = 13
    tr = traits(t)
    rows, k = 64, 256
    raw = np.zeros((rows, tr.type_size), np.uint8)
    raw[:, 0:2] = np.array([0.01], np.float16).view(np.uint8)       # d
    raw[:, 2:4] = np.array([0.003], np.float16).view(np.uint8)      # dmin
    sc = (np.arange(rows * 8) % 64).reshape(rows, 8)
    mn = ((np.arange(rows * 8) * 7 + 5) % 64).reshape(rows, 8)
    S = np.zeros((rows, 12), np.int64)
    for j in range(4):
        S[:, j] |= sc[:, j]
        S[:, j + 4] |= mn[:, j]
    for j in range(4, 8):
        S[:, j + 4] = (sc[:, j] & 15) | ((mn[:, j] & 15) << 4)
        S[:, j - 4] |= (sc[:, j] >> 4) << 6
        S[:, j] |= (mn[:, j] >> 4) << 6
    raw[:, 4:16] = S.astype(np.uint8)
    r_, j_ = np.meshgrid(np.arange(rows), np.arange(160), indexing="ij")
    raw[:, 16:] = (37 * r_ + 11 * j_ + (j_ >> 5)) % 256          # qh + qs: all bit patterns
    # the scale field decodes to what was meant (the test's own packing is right)
    W = gg_dequantize(raw, gguf.GGMLQuantizationType(t)).reshape(rows, k)
    assert np.isfinite(W).all()
    _onehot_check(t, raw, k, atol=1e-5)
    # and with random fp16 d / dmin of both signs, including subnormals
    rng = np.random.default_rng(11)
    raw2 = rand_blocks(rng, t, rows, k, subnormal=True)
    raw2[:, 4:] = raw[:, 4:]
    _onehot_check(t, raw2, k, scale=0.25, atol=1e-5)


def test_compute1_q6k_all_scales_and_codes():
    """Q6_K compute1 (kern v5): every int8 sub-scale (-128..127) in every slot, every 6-bit code in
    every (ql nibble, qh bit pair) position, blocks at both 4-byte alignments (odd/even block)."""
    t = 14
    tr = traits(t)
    rows, k = 32, 512                                # two blocks per row: offsets 0 and 210
    raw = np.zeros((rows, 2, tr.type_size), np.uint8)
    i_ = np.arange(rows * 2 * 16).reshape(rows, 2, 16)
    raw[:, :, 192:208] = ((i_ * 3 + 128) % 256).astype(np.uint8)   # all 256 int8 values
    raw[:, :, 208:210] = np.array([0.002], np.float16).view(np.uint8)
    r_, b_, j_ = np.meshgrid(np.arange(rows), np.arange(2), np.arange(192), indexing="ij")
    raw[:, :, :192] = (29 * r_ + 13 * j_ + 101 * b_ + (j_ >> 4)) % 256
    raw = raw.reshape(rows, -1)
    _onehot_check(t, raw, k)


@pytest.mark.parametrize("t", [13, 14], ids=NAMES.get)
def test_compute1_random_rows_long_k(t):
    """Random blocks at K = 17408 (the FFN down shape), many rows: compute1 == gguf-py."""
    rng = np.random.default_rng(99 + t)
    k, rows = 17408, 24
    w = rand_blocks(rng, t, rows, k)
    x = rng.standard_normal((1, k)).astype(np.float32) * rng.uniform(0.1, 10, (1, k)).astype(np.float32)
    refq, reff, (q, d, s16), hard = reference(t, w, x)
    y = host_gemv1(t, w, q, d, s16)
    assert rel(y[None], refq) < 1e-5
    assert np.all(np.abs(y[None] - reff) <= hard * 1.001 + 1e-5 * np.abs(reff).max())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_sm90_v5_no_spills():
    """kern v5 / v5s modules: no spills anywhere; tf_gemv5 <= 80 registers (min 3 CTAs/SM),
    tf_gemv5s <= 64; both instantiate exactly the N = 1 kernels of Q5_K / Q6_K."""
    from tightfit.kernels.gemv_cuda import NCS, compile_report
    for kern, cap in (("v5", 80), ("v5s", 64)):
        rows = compile_report("sm_90", lowbit=False, kern=kern)
        assert {(r["type"], r["nc"]) for r in rows} == {(t, nc) for t in MAIN_TYPES for nc in NCS}
        spills = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
        assert not spills, (kern, spills)
        big = [r for r in rows if r["nc"] == 1 and r["regs"] > (cap if r["type"] in (13, 14) else 64)]
        assert not big, (kern, big)
