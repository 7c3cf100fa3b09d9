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
    from tightfit.kernels.gemv_cuda import NCS, compile_report
    rows = compile_report("sm_90", lowbit=False)
    got = {(r["type"], r["nc"]) for r in rows}
    assert got == {(t, nc) for t in MAIN_TYPES for nc in NCS}
    spills = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
    assert not spills, spills
    big = [r for r in rows if r["nc"] <= 4 and r["regs"] > 64]
    assert not big, big
