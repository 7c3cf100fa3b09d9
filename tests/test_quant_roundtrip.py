"""quantize -> dequantize for every type. Validity of the emitted blocks is judged by outside
decoders (gguf-py, llama.cpp's C dequantize_row_*): they must read our bytes exactly as we do.
Errors are measured on the outside decoder's output and bounded per type (the table below); the
quality is also held against llama.cpp's own quantizer on the same data."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import gguf
import gguf.quants
import numpy as np
import pytest

from tightfit.errors import GGUFError
from tightfit.quant import Q2_0, QTYPES_BY_NAME, TRAITS, dequantize, quantize, row_bytes
from tightfit.quant.traits import GGML_TRAITS as TRAITS  # ggml types only: the oracles know no others  # noqa: E402,F811

os.environ.setdefault("GGML_NO_BACKTRACE", "1")     # a ggml abort must not attach gdb

# Relative RMS error bounds on standard-normal rows (measured values are ~10-15% lower).
BOUND = {"F32": 0.0, "F16": 3e-4, "BF16": 3e-3, "Q8_0": 0.0065, "Q4_0": 0.095, "Q4_1": 0.085,
         "Q5_0": 0.047, "Q5_1": 0.042, "Q2_K": 0.31, "Q3_K": 0.165, "Q4_K": 0.082,
         "Q5_K": 0.042, "Q6_K": 0.021, "IQ2_XXS": 0.43, "IQ2_XS": 0.37, "IQ2_S": 0.33,
         "IQ3_XXS": 0.205, "IQ3_S": 0.15, "IQ1_S": 0.49, "IQ1_M": 0.46, "IQ4_NL": 0.085,
         "IQ4_XS": 0.085, "TQ1_0": 0.47, "TQ2_0": 0.47, "MXFP4": 0.125, "Q1_0": 0.62,
         "Q2_0": 0.41}
NAMES = sorted(QTYPES_BY_NAME, key=QTYPES_BY_NAME.get)
QUANTIZED = [n for n in NAMES if TRAITS[QTYPES_BY_NAME[n]].block_size > 1]


def _lib():
    try:
        import llama_cpp
    except ImportError:
        return None
    path = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    return ctypes.CDLL(str(path)) if path.exists() else None


LIB = _lib()


def c_dequantize(name, raw, n):
    fn = getattr(LIB, "dequantize_row_" + name.lower().replace("_k", "_K"))
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(n, dtype=np.float32)
    fn(raw.ctypes.data, out.ctypes.data, n)
    return out


def outside_dequantize(name, q, shape):
    """Decode with gguf-py, else llama.cpp's C; None if neither knows the type."""
    tid = QTYPES_BY_NAME[name]
    if TRAITS[tid].gguf_dequant:
        return gguf.quants.dequantize(q, gguf.GGMLQuantizationType(tid)).reshape(shape)
    if LIB is not None and TRAITS[tid].block_size > 1:
        return c_dequantize(name, q, int(np.prod(shape))).reshape(shape)
    return None


def rel_rms(y, x):
    return float(np.sqrt(((y - x) ** 2).mean() / (x ** 2).mean()))


@pytest.fixture(scope="module")
def normal_rows():
    return np.random.default_rng(7).standard_normal((8, 1024)).astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
def test_roundtrip_error_and_validity(name, normal_rows):
    x = normal_rows
    q = quantize(x, name)
    assert q.dtype == np.uint8 and q.shape == (8, row_bytes(name, 1024))
    ours = dequantize(q, name, x.shape)
    ref = outside_dequantize(name, q, x.shape)
    if ref is None:
        pytest.skip(f"no outside decoder for {name} (needs llama-cpp-python)")
    assert np.array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32)), \
        f"{name}: outside decoder reads our bytes differently"
    err = rel_rms(ref, x)
    assert err <= BOUND[name], f"{name}: relative RMS error {err:.4f} > {BOUND[name]}"


@pytest.mark.llama
@pytest.mark.parametrize("name", QUANTIZED)
def test_quality_close_to_llama_cpp_quantizer(name, normal_rows):
    if LIB is None:
        pytest.skip("llama-cpp-python not installed")
    tid, x = QTYPES_BY_NAME[name], normal_rows
    LIB.ggml_quantize_init.argtypes = [ctypes.c_int]
    LIB.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    LIB.ggml_quantize_chunk.restype = ctypes.c_size_t
    LIB.ggml_quantize_init(tid)
    imatrix = np.ones(x.shape[1], dtype=np.float32)   # IQ2_XXS/IQ2_XS/IQ1_* demand one
    theirs = np.zeros(x.shape[0] * row_bytes(name, x.shape[1]), dtype=np.uint8)
    LIB.ggml_quantize_chunk(tid, x.ctypes.data, theirs.ctypes.data, 0, x.shape[0], x.shape[1],
                            imatrix.ctypes.data)
    e_theirs = rel_rms(c_dequantize(name, theirs, x.size).reshape(x.shape), x)
    e_ours = rel_rms(c_dequantize(name, quantize(x, name), x.size).reshape(x.shape), x)
    assert e_ours <= 1.3 * e_theirs, f"{name}: ours {e_ours:.4f} vs llama.cpp {e_theirs:.4f}"


# ---- fp16 scales: non-subnormal by default ---------------------------------------------------------

# fp16 scale fields per type (byte offsets from spec/quant-formats.md §2); Q4_1/Q5_1 mins are
# values, not scales, and are checked separately.
SCALE_FIELDS = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "Q4_1": [0], "Q5_1": [0],
                "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
                "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
                "IQ1_S": [0], "IQ4_NL": [0], "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64],
                "Q1_0": [0], "Q2_0": [0]}


def fp16_scales(name, q):
    blocks = q.reshape(-1, TRAITS[QTYPES_BY_NAME[name]].type_size)
    if name == "IQ1_M":   # top nibble of each of the four u16 scale words, word k = bits 4k..
        w = np.ascontiguousarray(blocks[:, 48:56]).view("<u2")
        bits = sum(((w[:, k] >> 12) & 15).astype(np.uint16) << (4 * k) for k in range(4))
        return bits.astype(np.uint16).view(np.float16)
    return np.concatenate([np.ascontiguousarray(blocks[:, o:o + 2]).view("<f2").ravel()
                           for o in SCALE_FIELDS[name]])


def is_subnormal(h):
    a = np.abs(h.astype(np.float32))
    return (a > 0) & (a < 2.0 ** -14)


@pytest.mark.parametrize("name", sorted(SCALE_FIELDS) + ["IQ1_M"])
def test_no_subnormal_scales_for_realistic_weights(name):
    # std 0.02 is the realistic weight scale at which natural Q6_K/IQ4_XS scales are subnormal
    x = (np.random.default_rng(3).standard_normal((16, 1024)) * 0.02).astype(np.float32)
    h = fp16_scales(name, quantize(x, name))
    assert np.isfinite(h).all() and not is_subnormal(h).any(), name
    assert (h != 0).all(), f"{name}: a non-zero block got a zero scale"


def test_allow_subnormal_keeps_natural_q6_k_scales():
    # The traps spec measures ~92% subnormal Q6_K super-scales at weight std 0.01-0.02.
    x = (np.random.default_rng(3).standard_normal((16, 1024)) * 0.02).astype(np.float32)
    h = fp16_scales("Q6_K", quantize(x, "Q6_K", allow_subnormal=True))
    assert is_subnormal(h).mean() > 0.5
    y = gguf.quants.dequantize(quantize(x, "Q6_K", allow_subnormal=True),
                               gguf.GGMLQuantizationType.Q6_K).reshape(x.shape)
    assert rel_rms(y, x) < BOUND["Q6_K"]


# ---- determinism, row independence, shapes ----------------------------------------------------------

@pytest.mark.parametrize("name", ["Q4_K", "IQ2_S", "IQ1_M", "IQ4_XS", "TQ1_0", "Q2_0", "MXFP4"])
def test_deterministic_and_row_independent(name):
    x = np.random.default_rng(5).standard_normal((6, 512)).astype(np.float32)
    a, b = quantize(x, name), quantize(x.copy(), name)
    assert np.array_equal(a, b)
    assert np.array_equal(a[2:5], quantize(x[2:5], name))   # rows can be quantized in parallel
    x3 = x.reshape(2, 3, 512)
    assert np.array_equal(quantize(x3, name).reshape(a.shape), a)


# ---- special inputs ---------------------------------------------------------------------------------

# Grid types whose levels are far apart (IQ2 magnitudes 8/25/43, IQ3 4..62) cannot hold a flat
# row to 20%; 1-bit and IQ1 codes cannot hold a lone spike at all.
_FLAT_TOL = {n: 0.3 for n in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")}
_NO_SPIKE = {"Q1_0", "IQ1_S", "IQ1_M"}


@pytest.mark.parametrize("name", NAMES)
def test_special_rows(name):
    rows = np.zeros((5, 1024), dtype=np.float32)
    rows[1] = 0.37                                             # constant
    rows[2, 100] = 5.0                                         # single spike
    rows[3] = np.random.default_rng(1).standard_normal(1024) * 1e4      # near fp16 max
    rows[4] = np.random.default_rng(2).standard_normal(1024) * 1e-7     # far below fp16 normal
    q = quantize(rows, name)
    y = outside_dequantize(name, q, rows.shape)
    if y is None:
        y = dequantize(q, name, rows.shape)
    assert np.isfinite(y).all(), name
    assert (y[0] == 0).all(), f"{name}: zero row does not decode to zeros"
    tol = _FLAT_TOL.get(name, 0.2)
    assert np.abs(y[1] - 0.37).max() < 0.37 * tol, f"{name}: constant row"
    if name not in _NO_SPIKE:
        assert abs(y[2, 100] - 5.0) < 5.0 * 0.25, f"{name}: spike"
    assert rel_rms(y[3], rows[3]) <= max(BOUND[name], 1e-3) * 1.2, f"{name}: large row"
    # Scales stay >= 2^-14 (non-subnormal policy), so codes without an exact zero (IQ4_NL's
    # smallest level is 1, IQ2's is 8/8) put a floor of ~2^-14 under tiny rows.
    assert np.abs(y[4]).max() <= 2.0 ** -13, f"{name}: tiny row blew up"


def test_exactly_representable_inputs_round_trip_exactly():
    rng = np.random.default_rng(11)
    cases = {
        "Q8_0": rng.integers(-127, 128, (4, 256)) * 0.125,
        "TQ2_0": rng.integers(-1, 2, (4, 256)) * 0.5,
        "TQ1_0": rng.integers(-1, 2, (4, 256)) * 0.5,
        "Q1_0": rng.choice([-0.25, 0.25], (4, 256)),
        "MXFP4": rng.choice([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6],
                            (4, 256)) * 2.0 ** -3,
    }
    for name, x in cases.items():
        x = np.asarray(x, dtype=np.float32)
        if name == "Q8_0":
            x[:, ::32] = 127 * 0.125                      # every block spans the full range
        if name == "MXFP4":
            x[:, ::32] = 6 * 2.0 ** -3
        if name.startswith("TQ"):
            x[:, ::256] = 0.5
        y = outside_dequantize(name, quantize(x, name), x.shape)
        if y is None:
            y = dequantize(quantize(x, name), name, x.shape)
        np.testing.assert_array_equal(y, x, err_msg=name)


def test_q2_0_ternary_input_round_trips_exactly():
    # Ternary-Bonsai style: codes -1, 0, +1 times a per-group scale (spec §5.2)
    x = np.random.default_rng(12).integers(-1, 2, (4, 256)).astype(np.float32) * 0.75
    x[:, ::64] = 0.75
    q = quantize(x, Q2_0)
    y = outside_dequantize("Q2_0", q, x.shape)
    np.testing.assert_array_equal(y if y is not None else dequantize(q, Q2_0, x.shape), x)


def test_bad_inputs():
    with pytest.raises(GGUFError, match="multiple"):
        quantize(np.zeros((2, 100), np.float32), "Q4_K")
    with pytest.raises(ValueError):
        quantize(np.full((1, 32), np.nan, np.float32), "Q8_0")
    with pytest.raises(GGUFError):
        quantize(np.zeros((1, 32), np.float32), 31)
