"""Triton GEMV on repacked T3 blocks (TRITON_INTERPRET=1, tiny shapes).

Oracle: gguf-py's dequantization of the original TQ2_0 blocks (and tightfit.quant's for Q2_0,
which gguf-py 0.19 lacks), then a float64 matmul. The T3 blocks come from tightfit.tools.repack.
"""
from __future__ import annotations

import numpy as np
import pytest

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf.quants import dequantize as gg_dequantize, quantize as gg_quantize  # noqa: E402

from tightfit.kernels import gemv_t3 as T3  # noqa: E402
from tightfit.kernels.gemv_t3 import gemv_t3, gemv_t3_ref  # noqa: E402
from tightfit.tools.repack import Q2_0, TQ2_0, T3_64, T3_256, repack_chunks  # noqa: E402

# the device follows how the kernels were built (possibly by an earlier test module), not the
# environment now: interpreted kernels take CPU tensors, compiled ones CUDA tensors
INTERP = _interp.interpreted(T3)
pytestmark = pytest.mark.skipif(not INTERP and not torch.cuda.is_available(),
                                reason="needs a GPU or TRITON_INTERPRET=1")
DEV = "cpu" if INTERP else "cuda"


def _repack(raw: np.ndarray, src: int, rows: int) -> np.ndarray:
    return np.concatenate(list(repack_chunks(raw.reshape(-1), src)), axis=0).reshape(rows, -1)


@pytest.mark.parametrize("rows,cols", [(5, 256), (21, 768)])
def test_gemv_t3_256_matches_dequantized_tq2_0(rows, cols):
    rng = np.random.default_rng(rows)
    t = rng.integers(-1, 2, size=(rows, cols)).astype(np.float32)
    sc = np.exp(rng.standard_normal((rows, cols // 256, 1))).astype(np.float32) * 0.03
    tq2 = gg_quantize((t.reshape(rows, -1, 256) * sc).reshape(rows, cols), QT.TQ2_0)
    w = gg_dequantize(tq2, QT.TQ2_0).reshape(rows, cols).astype(np.float64)
    x = rng.standard_normal(cols).astype(np.float32)
    t3 = _repack(tq2, TQ2_0, rows)
    assert t3.shape == (rows, cols // 256 * T3_256.type_size)
    y = gemv_t3(torch.from_numpy(t3).to(DEV), T3_256.type_id, torch.from_numpy(x).to(DEV)).cpu().numpy()
    want = w @ x.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(gemv_t3_ref(t3, T3_256.type_id, x), want, rtol=1e-6, atol=1e-6)


def test_gemv_t3_64_matches_dequantized_q2_0():
    from tightfit.quant import dequantize
    rng = np.random.default_rng(11)
    rows, cols = 19, 320                       # 5 blocks per row, rows not a multiple of the tile
    n = rows * cols // 64
    codes = rng.integers(0, 3, size=(n, 64)).astype(np.uint8).reshape(n, 16, 4)
    qs = codes[:, :, 0] | (codes[:, :, 1] << 2) | (codes[:, :, 2] << 4) | (codes[:, :, 3] << 6)
    d = (rng.standard_normal(n) * 0.05).astype("<f2").view(np.uint8).reshape(n, 2)
    q2 = np.concatenate([d, qs], axis=1)
    w = dequantize(q2, Q2_0).reshape(rows, cols).astype(np.float64)
    x = rng.standard_normal(cols).astype(np.float32)
    t3 = _repack(q2, Q2_0, rows)
    y = gemv_t3(torch.from_numpy(t3).to(DEV), T3_64.type_id, torch.from_numpy(x).to(DEV)).cpu().numpy()
    want = w @ x.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_gemv_t3_rejects_bad_shapes():
    w = torch.zeros((2, 15), dtype=torch.uint8)
    with pytest.raises(ValueError):
        gemv_t3(w, T3_64.type_id, torch.zeros(65))
    with pytest.raises(ValueError):
        gemv_t3(torch.zeros((2, 16), dtype=torch.uint8), T3_64.type_id, torch.zeros(64))
