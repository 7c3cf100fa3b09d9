"""CPU GEMV on raw GGUF blocks vs gguf-py's dequantizer + float64 matmul, on fresh random blocks."""
from __future__ import annotations

import numpy as np
import pytest
import gguf.quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from tightfit.kernels import cpu_gemv as G

# byte offsets of the fp16 scale fields (spec/quant-formats.md §2.3); set to sane finite values
SCALES = {"Q8_0": [0], "Q4_0": [0], "IQ4_NL": [0], "IQ4_XS": [0], "Q2_K": [80, 82],
          "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "F16": None,
          "Q5_0": [0], "IQ3_XXS": [0]}   # last two: fallback path


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
@pytest.mark.parametrize("batch", [1, 3])
def test_gemv_matches_numpy(name, batch):
    rng = np.random.default_rng(hash((name, batch)) % 2**32)
    rows, k = 37, 512            # 37: not a multiple of the row chunk
    raw = blocks(rng, name, rows, k)
    x = rng.standard_normal((batch, k)).astype(np.float32)
    W = reference(raw, name, rows, k)
    want = x.astype(np.float64) @ W.T
    got = G.gemv(raw, T[name], x)
    scale = np.abs(x).astype(np.float64) @ np.abs(W).T + 1e-30
    assert got.shape == (batch, rows)
    assert np.max(np.abs(got - want) / scale) < 1e-5
    one = G.gemv(raw, T[name], x[0])
    assert one.shape == (rows,)
    assert np.max(np.abs(one - want[0]) / scale[0]) < 1e-5


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
    x = rng.standard_normal(256).astype(np.float32)
    np.testing.assert_allclose(G.gemv(view, T.Q4_K, x), x.astype(np.float64) @ reference(raw, "Q4_K", 64, 256).T,
                               rtol=1e-4, atol=1e-4)


def test_shape_mismatch_is_an_error():
    raw = np.zeros((4, 34), np.uint8)
    with pytest.raises(ValueError):
        G.gemv(raw, T.Q8_0, np.zeros(64, np.float32))
    with pytest.raises(IndexError):
        G.decode_rows(raw, T.Q8_0, [4])
