"""`dequantize` against outside oracles: gguf-py's NumPy dequantizers and llama.cpp's C
`dequantize_row_*` (from llama-cpp-python's libggml-base.so), bit-exact on random blocks; and
hand-built blocks whose values are worked out by hand from spec/quant-formats.md."""
from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import gguf.quants
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tightfit.errors import GGUFError
from tightfit.quant import Q2_0, TRAITS, dequantize
from tightfit.quant.traits import GGML_TRAITS as TRAITS  # ggml types only: the oracles know no others  # noqa: E402,F811

# Byte offsets of the fp16 fields (scales, and the Q4_1/Q5_1 mins) per type, from the spec's
# layout tables; random bytes there would mostly be huge values, inf or NaN.
FP16_FIELDS = {2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 8: [0], 10: [80, 82], 11: [108],
               12: [0, 2], 13: [0, 2], 14: [208], 16: [0], 17: [0], 18: [0], 19: [0], 20: [0],
               21: [0], 22: [0], 23: [0], 34: [52], 35: [64], 41: [0], Q2_0: [0]}


def sane_fp16(rng, n):
    """Random fp16 scales: mostly normal magnitudes 1e-4..1, one in eight a subnormal (the
    spec's trap: real Q6_K/IQ4_XS files are full of them, and decoders must keep them)."""
    mag = 10 ** rng.uniform(-4, 0, n)
    sub = rng.random(n) < 0.125
    mag = np.where(sub, rng.integers(1, 1024, n) * 2.0 ** -24, mag)
    return (mag * rng.choice([-1, 1], n)).astype(np.float16)


def random_blocks(tid, n, seed):
    t = TRAITS[tid]
    rng = np.random.default_rng(seed)
    if t.block_size == 1:
        v = rng.standard_normal(n).astype(np.float32)
        if tid == 1:
            return v.astype("<f2").view(np.uint8)
        if tid == 30:
            return (v.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
        return v.view(np.uint8)
    raw = rng.integers(0, 256, (n, t.type_size), dtype=np.uint8)
    for off in FP16_FIELDS.get(tid, []):
        raw[:, off:off + 2] = sane_fp16(rng, n).view(np.uint8).reshape(n, 2)
    if tid == 29:   # IQ1_M: fp16 super-scale spread over the top nibbles of bytes 49,51,53,55
        bits = sane_fp16(rng, n).view(np.uint16)
        for k in range(4):
            raw[:, 49 + 2 * k] = (raw[:, 49 + 2 * k] & 0x0F) | (((bits >> (4 * k)) & 15) << 4)
    if tid == 39:   # MXFP4: keep 12 * 2^(E-128) finite
        raw[:, 0] = rng.integers(0, 250, n)
    return raw.reshape(-1)


GGUF_TYPES = [tid for tid, t in TRAITS.items() if t.gguf_dequant]


def same_bits(a, b):
    a, b = np.asarray(a, np.float32).reshape(-1), np.asarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("tid", GGUF_TYPES, ids=[TRAITS[t].name for t in GGUF_TYPES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bit_exact_vs_gguf_py(tid, seed):
    t = TRAITS[tid]
    raw = random_blocks(tid, 96, seed)
    ref = gguf.quants.dequantize(raw.reshape(96, t.type_size), gguf.GGMLQuantizationType(tid))
    assert same_bits(dequantize(raw, tid), ref), t.name


@settings(max_examples=40, deadline=None)
@given(tid=st.sampled_from(GGUF_TYPES), seed=st.integers(0, 2 ** 32 - 1),
       n=st.integers(1, 9))
def test_bit_exact_vs_gguf_py_hypothesis(tid, seed, n):
    t = TRAITS[tid]
    raw = random_blocks(tid, n, seed)
    ref = gguf.quants.dequantize(raw.reshape(n, t.type_size), gguf.GGMLQuantizationType(tid))
    assert same_bits(dequantize(raw, tid), ref), t.name


# ---- llama.cpp's C reference, through ctypes ------------------------------------------------------

def _c_dequantizer(name):
    try:
        import llama_cpp
    except ImportError:
        pytest.skip("llama-cpp-python not installed: no C oracle")
    path = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    if not path.exists():
        pytest.skip(f"{path} absent: no C oracle")
    symbol = "dequantize_row_" + name.lower().replace("_k", "_K")     # C spells q4_K
    fn = getattr(ctypes.CDLL(str(path)), symbol, None)
    if fn is None:
        pytest.skip(f"libggml-base has no {symbol}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None

    def run(raw, n_elements):
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        out = np.empty(n_elements, dtype=np.float32)
        fn(raw.ctypes.data, out.ctypes.data, n_elements)
        return out
    return run


C_TYPES = [tid for tid in TRAITS if tid not in (0, 1, 30)]


@pytest.mark.llama
@pytest.mark.parametrize("tid", C_TYPES, ids=[TRAITS[t].name for t in C_TYPES])
def test_bit_exact_vs_llama_cpp_c(tid):
    t = TRAITS[tid]
    c_deq = _c_dequantizer(t.name)
    for seed in (10, 11):
        raw = random_blocks(tid, 64, seed)
        assert same_bits(dequantize(raw, tid), c_deq(raw, 64 * t.block_size)), t.name


# ---- hand-built blocks (values worked out from the spec's formulas) -------------------------------

def test_q1_0_hand_block():
    # d = 0.5 (fp16 0x3800); bit e%8 of byte e/8 set -> +d, clear -> -d
    qs = [0b00000101, 0xFF] + [0] * 14
    raw = np.array([0x00, 0x38] + qs, dtype=np.uint8)
    want = np.full(128, -0.5, dtype=np.float32)
    want[[0, 2]] = 0.5
    want[8:16] = 0.5
    np.testing.assert_array_equal(dequantize(raw, "Q1_0"), want)


def test_q2_0_hand_block():
    # d = 0.25 (fp16 0x3400); element e is crumb e%4 of byte e/4; value (c-1)*d
    qs = [0b11100100, 0b00011011] + [0x55] * 14
    raw = np.array([0x00, 0x34] + qs, dtype=np.uint8)
    want = np.zeros(64, dtype=np.float32)
    want[0:8] = [-0.25, 0.0, 0.25, 0.5, 0.5, 0.25, 0.0, -0.25]
    np.testing.assert_array_equal(dequantize(raw, Q2_0), want)


def test_q2_0_two_blocks_and_shape():
    b0 = [0x00, 0x3C] + [0xAA] * 16      # d = 1, all codes 2 -> +1
    b1 = [0x00, 0xC0] + [0x00] * 16      # d = -2, all codes 0 -> (0-1)*-2 = +2
    out = dequantize(np.array(b0 + b1, dtype=np.uint8), Q2_0, shape=(2, 64))
    assert out.shape == (2, 64)
    assert (out[0] == 1.0).all() and (out[1] == 2.0).all()


def test_q8_0_subnormal_scale_is_kept():
    # d = fp16 0x0001 = 2^-24 (the smallest subnormal); qs = 127 and -3
    raw = np.array([0x01, 0x00, 127, 0xFD] + [0] * 30, dtype=np.uint8)
    out = dequantize(raw, "Q8_0")
    assert out[0] == np.float32(127 * 2.0 ** -24) and out[1] == np.float32(-3 * 2.0 ** -24)
    assert (out[2:] == 0).all()


def test_tq1_0_hand_block():
    # All trits 1 except element 0 = 2 and element 240 = 0. qs[0] holds elements 0,32,..,128 with
    # element 0 most significant: v = 2*81+27+9+3+1 = 202 -> byte ceil(202*256/243) = 213.
    # Other qs bytes: v = 121 -> 128. qh[0] holds 240,244,248,252: v = (0*27+9+3+1)*3 = 39 -> 42;
    # other qh bytes v = 40*3 = 120 -> 127. d = 1.0 at byte 52.
    qs = [213] + [128] * 47
    qh = [42, 127, 127, 127]
    raw = np.array(qs + qh + [0x00, 0x3C], dtype=np.uint8)
    want = np.zeros(256, dtype=np.float32)
    want[0], want[240] = 1.0, -1.0
    np.testing.assert_array_equal(dequantize(raw, "TQ1_0"), want)


def test_q6_k_hand_block():
    # d = 1 at byte 208, scales[s] = s+1 (signed int8 at 192). ql = 0x21 everywhere (low nibble 1,
    # high 2), qh = 0b11100100 (crumb g = g). Element e: h=e/128, r=e%128, g=r/32:
    # low = 1 for g<2 else 2; high = g; q = low | high<<4, minus 32.
    raw = np.zeros(210, dtype=np.uint8)
    raw[0:128] = 0x21
    raw[128:192] = 0b11100100
    raw[192:208] = np.arange(1, 17, dtype=np.int8).view(np.uint8)
    raw[208:210] = [0x00, 0x3C]
    e = np.arange(256)
    g = (e % 128) // 32
    q = np.where(g < 2, 1, 2) + 16 * g - 32
    want = ((e // 16) + 1) * q
    np.testing.assert_array_equal(dequantize(raw, "Q6_K"), want.astype(np.float32))


# ---- errors ---------------------------------------------------------------------------------------

def test_partial_block_raises():
    with pytest.raises(GGUFError, match="whole number"):
        dequantize(np.zeros(35, np.uint8), "Q8_0")


def test_bad_shape_raises():
    with pytest.raises(GGUFError, match="shape"):
        dequantize(np.zeros(34, np.uint8), "Q8_0", shape=(2, 32))


def test_unknown_type_raises():
    with pytest.raises(GGUFError):
        dequantize(np.zeros(34, np.uint8), 4)


def test_accepts_bytes_and_2d_views():
    raw = random_blocks(12, 4, 3)
    a = dequantize(raw.reshape(4, -1), "Q4_K", shape=(2, 512))
    b = dequantize(raw.tobytes(), "Q4_K")
    assert a.shape == (2, 512) and a.dtype == np.float32
    assert same_bits(a, b)
