"""Low-bit CUDA GEMV formats (tightfit/kernels/cuda/gemv_fmt_lowbit.cuh) on the CPU, through the
g++ host harness (tightfit.kernels.cuda_host.host_gemv), against the slow reference: float64
product of the dequantized weights (gguf-py's gguf.quants, or tightfit.quant where gguf-py lacks
the type: Q1_0, Q2_0) with the activations. Fresh random blocks: random bytes everywhere except
the fp16 scale fields (every byte pattern is a valid block for these formats).

Bounds:
- vs the reference fed the DE-quantized int8 activations (q*d, exactly what the kernel sees):
  1e-5, relative to the norm of the result and, element by element, relative to |W|.|x| (the
  natural scale of fp32 summation error; the min/offset terms cancel in Q2_K and Q3_K). Only the
  fp32 rounding of d_x and the fp32 accumulation differ; a decoding slip gives O(1).
- vs the reference fed the float activations: 2e-2 relative (int8 per-32 rounding of x costs
  ~0.3-0.7 % on random data, amax/254 per element; see tests/test_kernels_gemv.py).
"""
from __future__ import annotations

import os  # noqa: E402
import torch  # noqa: E402

# Triton decides interpreter mode when a @triton.jit module is imported, and modules are imported
# once per test session: without a GPU they must come in interpreted, as every kernel test expects
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import re
import shutil

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="needs a C++ compiler")

from tightfit.kernels.cuda.lowbit import LOWBIT_FORMATS  # noqa: E402
from tightfit.kernels.cuda import tables as cuda_tables  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act_ref  # noqa: E402
from tightfit.quant.traits import traits  # noqa: E402

F16_FIELDS = {10: [80, 82], 11: [108], 16: [0], 17: [0], 22: [0], 18: [0], 21: [0], 34: [52],
              35: [64], 41: [0], 42: [0]}
TYPES = sorted(LOWBIT_FORMATS)


def tname(t):
    return traits(t).name


def rand_blocks(rng, t, rows, k):
    tr = traits(t)
    raw = rng.integers(0, 256, size=(rows * k // tr.block_size, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        sc = rng.uniform(0.001, 0.01, raw.shape[0]).astype(np.float16)
        raw[:, off:off + 2] = sc.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def dequant(t, w, k):
    if traits(t).gguf_dequant:
        import gguf.quants as gq
        from gguf.constants import GGMLQuantizationType
        out = gq.dequantize(w.reshape(-1), GGMLQuantizationType(t))
    else:
        from tightfit.quant.dequant import dequantize
        out = dequantize(w.reshape(-1), t)
    return np.asarray(out, np.float64).reshape(w.shape[0], k)


def _gemv():
    from tightfit.kernels.cuda_host import host_gemv
    return host_gemv


def check(t, w, x, k, y=None):
    q, d, s16 = quantize_act_ref(x)
    xdq = (q * d[..., None]).reshape(x.shape[0], k)
    if y is None:
        y = _gemv()(t, w, q.reshape(x.shape[0], k), d, s16)
    wd = dequant(t, w, k)
    refq = xdq @ wd.T
    scale = np.abs(xdq) @ np.abs(wd).T
    eq = np.linalg.norm(y - refq) / np.linalg.norm(refq)
    emax = np.max(np.abs(y - refq) / scale)
    assert eq < 1e-5 and emax < 1e-5, f"{tname(t)}: {eq:.2e} (norm), {emax:.2e} (elem) vs q8 x"
    ref = x.astype(np.float64) @ wd.T
    ef = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert ef < 2e-2, f"{tname(t)}: {ef:.2e} vs float x"
    return y


def test_registry_matches_header():
    from tightfit.kernels.cuda_source import CUDA_DIR, LOWBIT, format_list
    src = (CUDA_DIR / LOWBIT).read_text()
    listed = dict((tid, name) for name, tid in format_list(src))
    assert listed == LOWBIT_FORMATS
    for t, name in LOWBIT_FORMATS.items():
        m = re.search(rf"struct {name} {{\s*static constexpr int TYPE = (\d+), QK = (\d+), "
                      rf"BB = (\d+), PARTS = (\d+);", src)
        assert m, name
        tr = traits(t)
        assert (int(m[1]), int(m[2]), int(m[3])) == (t, tr.block_size, tr.type_size), name
        assert int(m[2]) // int(m[4]) == 32, name       # one 32-group per part


def test_tables_match_gguf():
    import gguf.quants as gq
    for name, cls in (("iq2xxs", gq.IQ2_XXS), ("iq2xs", gq.IQ2_XS), ("iq2s", gq.IQ2_S),
                      ("iq3xxs", gq.IQ3_XXS), ("iq3s", gq.IQ3_S)):
        cls.init_grid()
        g = np.asarray(cls.grid).reshape(cls.grid_shape)
        w = cuda_tables.grid_words(name)
        got = w.view(np.uint8).reshape(g.shape)
        assert np.array_equal(got, g.astype(np.uint8)), name
    ks = np.frombuffer(gq.IQ2_XXS.ksigns, np.uint8)
    m = cuda_tables.sign_mask64()
    bits = lambda v: np.array([(int(v) >> (8 * j)) & 0xFF for j in range(8)])  # noqa: E731
    for i in range(128):
        assert np.array_equal(bits(m[256 + i]), ((int(ks[i]) >> np.arange(8)) & 1) * 0xFF), i
    for b in range(256):
        assert np.array_equal(bits(m[b]), ((b >> np.arange(8)) & 1) * 0xFF), b
    src = cuda_tables.tables_source()
    for name, n, _ in cuda_tables.GRIDS:
        assert f"tf_{name}_g16[{n}]" in src


def _prmt(a, b, s):
    """PTX prmt.b32 default mode (what tf_lb_prmt runs on the device)."""
    v = (int(b) << 32) | int(a)
    r = 0
    for k in range(4):
        sel = (int(s) >> (4 * k)) & 15
        byte = (v >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        r |= byte << (8 * k)
    return r


def _bytes(w):
    return np.array([(w >> (8 * j)) & 0xFF for j in range(4)], np.uint8).view(np.int8)


def test_g16_grids_decode():
    """The 16-bit code words + byte_perm LUTs give back gguf's grids (and the decode the
    header does: IQ2 (e | e << 14) & 0x33333333 as selector, IQ3 e as selector)."""
    import gguf.quants as gq
    for name, cls in (("iq2xxs", gq.IQ2_XXS), ("iq2xs", gq.IQ2_XS), ("iq2s", gq.IQ2_S),
                      ("iq3xxs", gq.IQ3_XXS), ("iq3s", gq.IQ3_S)):
        cls.init_grid()
        g = np.asarray(cls.grid).reshape(cls.grid_shape).astype(np.int64)
        e16 = cuda_tables.grid16(name)
        lut = cuda_tables.lut_words(name)
        for i, e in enumerate(e16.astype(np.int64)):
            if g.shape[1] == 8:
                sel = (e | (e << 14)) & 0x33333333
                got = np.concatenate([_bytes(_prmt(lut[0], lut[1], sel & 0xFFFF)),
                                      _bytes(_prmt(lut[0], lut[1], sel >> 16))])
                neg = np.concatenate([_bytes(_prmt(lut[0], lut[1], (sel | 0x44444444) & 0xFFFF)),
                                      _bytes(_prmt(lut[0], lut[1], (sel | 0x44444444) >> 16))])
            else:
                got = _bytes(_prmt(lut[0], lut[1], e))
                neg = _bytes(_prmt(lut[2], lut[3], e))
            assert np.array_equal(got, g[i]), (name, i)
            assert np.array_equal(neg, -g[i]), (name, i)


def test_sign_bit_tricks_exhaustive():
    """The multiply tricks of gemv_fmt_lowbit.cuh for every sign byte / ksigns index, with
    junk in the bits above the field (the header feeds shifted words)."""
    import gguf.quants as gq
    ks = np.frombuffer(gq.IQ2_XXS.ksigns, np.uint8)
    M = 0xFFFFFFFF
    for junk in (0, 0xABCDE700, 0xFFFFFF00):
        for s in range(256):
            w = (s | junk) & M
            want = sum(((s >> j) & 1) << (4 * j + 2) for j in range(8))
            # IQ2 explicit signs (tf_lb_sgn_nib + the masks of tf_lb_iq2_w8)
            ev, od = ((w & 0x55) * 0x00104104) & M, ((w & 0xAA) * 0x00820820) & M
            assert (ev & 0x04040404) | (od & 0x40404040) == want, (s, junk)
            # IQ3 masks (tf_lb_mask_lo / hi)
            m0 = _prmt(((w & 0x0F) * 0x10204080) & M, 0, 0xBA98)
            m1 = _prmt(((w & 0xF0) * 0x01020408) & M, 0, 0xBA98)
            assert m0 | m1 << 32 == sum((((s >> j) & 1) * 0xFF) << (8 * j) for j in range(8))
        for k in range(128):
            s8 = int(ks[k])
            for sh in (0, 7, 9, 14, 21, 25):
                w = ((k << sh) | (junk & ~(0x7F << sh))) & M
                kk = w >> sh
                pc = bin(w & (0x7F << sh)).count("1")
                want = sum(((s8 >> j) & 1) << (4 * j + 2) for j in range(8))
                ev = ((kk & 0x55) * 0x00104104) & M
                od = ((kk & 0x2A) * 0x00820820 + (pc << 30)) & M
                assert (ev & 0x04040404) | (od & 0x40404040) == want, (k, sh, junk)
                # IQ3_XXS: high mask with the parity at bit 31
                m1 = _prmt(((kk & 0x70) * 0x01020408 + (pc << 31)) & M, 0, 0xBA98)
                assert m1 == sum((((s8 >> (4 + j)) & 1) * 0xFF) << (8 * j) for j in range(4))


def test_tables_match_triton_host_tables():
    pytest.importorskip("triton")
    from tightfit.kernels.gemv_iq import host_tables
    ht = host_tables()
    assert np.array_equal(ht["sign"].view(np.uint64), cuda_tables.sign_mask64())
    for name, _, _ in cuda_tables.GRIDS:
        assert np.array_equal(ht[name].view(cuda_tables.grid_words(name).dtype),
                              cuda_tables.grid_words(name)), name


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("k", [256, 512])
@pytest.mark.parametrize("t", TYPES, ids=tname)
def test_lowbit_gemv(t, k, n):
    rng = np.random.default_rng(1000 * t + 10 * n + k // 256)
    rows = int(rng.integers(1, 34))
    w = rand_blocks(rng, t, rows, k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    if n > 1:
        x[1] += 0.5                       # a column with a non-zero mean: min/offset terms
    check(t, w, x, k)


@pytest.mark.parametrize("t", TYPES, ids=tname)
def test_lowbit_gemv_nc16(t):
    rng = np.random.default_rng(77 + t)
    w = rand_blocks(rng, t, 5, 256)
    check(t, w, rng.standard_normal((16, 256)).astype(np.float32), 256)


@pytest.mark.parametrize("t", TYPES, ids=tname)
def test_every_byte_matters(t):
    """Change each byte of one block in turn: the output must follow the reference, and move
    whenever the reference moves (a byte the kernel ignores or misplaces fails here)."""
    rng = np.random.default_rng(500 + t)
    tr = traits(t)
    k = 256 if tr.block_size <= 256 else tr.block_size
    rows = 2
    w = rand_blocks(rng, t, rows, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    q, d, s16 = quantize_act_ref(x)
    qk = q.reshape(3, k)
    y0 = _gemv()(t, w, qk, d, s16)
    ref0 = (q * d[..., None]).reshape(3, k) @ dequant(t, w, k).T
    blk = 1 if w.shape[1] > tr.type_size else 0       # a block other than the row's first
    moved = 0
    for off in range(tr.type_size):
        w2 = w.copy()
        f16 = any(off in (o, o + 1) for o in F16_FIELDS[t])
        w2[1, blk * tr.type_size + off] ^= np.uint8(0x01 if f16 else 0x5A)
        y = _gemv()(t, w2, qk, d, s16)
        check(t, w2, x, k, y)
        ref = (q * d[..., None]).reshape(3, k) @ dequant(t, w2, k).T
        if np.abs(ref - ref0).max() > 1e-3 * np.abs(ref0).max():
            moved += 1
            assert np.abs(y - y0).max() > 1e-4 * np.abs(y0).max(), f"{tname(t)}: byte {off}"
        assert np.array_equal(y[:, 0], y0[:, 0]), "row 0 was not touched"
    assert moved >= tr.type_size - 2, f"{tname(t)}: only {moved} of {tr.type_size} bytes moved"
