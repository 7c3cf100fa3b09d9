"""Tensor-core skinny GEMM (tightfit.kernels.gemv_mma) on the device at the model's real shapes,
against NumPy dequantization (gguf-py) + float64 matmul on sampled rows (plus the last
rows: the partial 16-row tile), and against gemv_cuda on the same quantized activations. Skipped
without a CUDA device or cupy. Outputs are poisoned with NaN before every run.

Bounds: vs the de-quantized int8 activations 1e-4 relative (integer dots are exact; fp32 scale
products / summation order only), vs the float activations 2e-2; vs gemv_cuda 1e-5.
"""
from __future__ import annotations

import _interp

_interp.interpret_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)   # device-only module
pytest.importorskip("cupy")

from tightfit.kernels import gemv_cuda as gc  # noqa: E402
from tightfit.kernels import gemv_mma as gm  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act  # noqa: E402
from _gpu_blocks import check_graph_replay, gemv_errors, rand_weights  # noqa: E402

pytestmark = [pytest.mark.gpu]

NAMES = {8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 23: "IQ4_XS"}
TYPES = list(NAMES)
SHAPES = [(5120, 17408), (17408, 5120), (5120, 1024), (5120, 40), (2304, 300)]
NS = [1, 2, 4, 5, 8, 11, 16]



def check(t, n_in, n_out, ns, seed=0, config=None, scale=(0.001, 0.01)):
    w = rand_weights(t, n_out, n_in, seed, scale=scale)
    for n in ns:
        x = torch.randn(n, n_in, device="cuda")
        act = quantize_act(x, 0)
        out = torch.full((n, n_out), float("nan"), device="cuda")
        y = gm.gemv_mma(act, w, t, n_out, out, config=config)
        what = f"{NAMES[t]} {n_in}->{n_out} N={n} {config or ''}"
        assert not torch.isnan(y).any(), f"{what}: unwritten outputs"
        # the last 17 rows: the partial 16-row tile
        eq, ef = gemv_errors(w, t, n_out, x, act, y, seed=seed, tail=17)
        assert eq < 1e-4, f"{what}: {eq:.2e} vs quantized-x reference"
        assert ef < 2e-2, f"{what}: {ef:.2e} vs float reference"
        if gc.available() and gc.supported(t):
            yc = gc.gemv_cuda(act, w, t, n_out, torch.full((n, n_out), float("nan"), device="cuda"))
            e = float(torch.linalg.norm(out - yc) / torch.linalg.norm(yc))
            assert e < 1e-5, f"{what}: {e:.2e} vs gemv_cuda"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_device_shapes(t, shape):
    check(t, *shape, NS, seed=t * 7 + shape[1])


# other stream-K grids: different item ranges per warp, tiles split at other places (atomics)
@pytest.mark.parametrize("cps", [1, 3, 8])
@pytest.mark.parametrize("t", [12, 14, 8], ids=NAMES.get)
def test_device_grid(t, cps):
    check(t, 4096, 300, [3, 16], seed=cps, config={"ctas_per_sm": cps})
    check(t, 17408, 1024, [8], seed=cps, config={"ctas_per_sm": cps})


# both row-tile variants at N <= 8: tf_mma_rt (rt 2, the default) and tf_mma (rt 1, also what
# every N > 8 chunk runs)
@pytest.mark.parametrize("rt", [1, 2])
@pytest.mark.parametrize("shape", [(5120, 1024), (2304, 300), (17408, 1040)],
                         ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_device_rt(t, shape, rt):
    check(t, *shape, [1, 5, 8, 11], seed=t + shape[1], config={"rt": rt})


# the cp.async-pipelined kernel (gemv_mma_pipe.cuh) at N <= 8: both row-tile counts and ring
# depths, rows whose byte offset is not 16-aligned (Q6_K at K = 5120: 4,200-byte rows), partial
# last tiles, split tiles (atomics), and an N = 11 call (its first 8 columns run here, the rest on
# tf_mma); Q8_0 is not pipelined and must fall back
@pytest.mark.parametrize("nst", [2, 3])
@pytest.mark.parametrize("rt", [1, 2])
@pytest.mark.parametrize("shape", [(5120, 17408), (17408, 5120), (5120, 1040), (2304, 300)],
                         ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", list(gm.PIPE_TYPES) + [8], ids=NAMES.get)
def test_device_pipe(t, shape, rt, nst):
    check(t, *shape, [1, 3, 5, 8, 11], seed=t + shape[1] + 7 * rt + nst,
          config={"pipe": 1, "rt": rt, "nst": nst})


def test_device_pipe_grid():
    for cps in (1, 3):
        check(23, 4096, 300, [5], seed=cps, config={"pipe": 1, "ctas_per_sm": cps})


# fp16-subnormal block scales (the seed-mix 27B's IQ4_XS / Q5_K / Q6_K): both kernels, and the
# CUDA GEMV comparison inside check() runs its N >= 2 variant (tf_gemv3) on them too
@pytest.mark.parametrize("pipe", [0, 1])
@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_device_subnormal_scales(t, pipe):
    check(t, 5120, 17408, [2, 5, 8, 11], seed=t + 11, config={"pipe": pipe}, scale=(3e-6, 5e-5))


def test_device_many_columns():
    check(12, 2048, 512, [17, 24, 33], seed=5)


@pytest.mark.parametrize("t", [12, 14], ids=NAMES.get)
def test_cuda_graph_capture(t):
    check_graph_replay(gm.gemv_mma, t, 5, atomic=True)     # stream-K tiles added atomically


def test_bad_inputs():
    w = rand_weights(12, 16, 256, 0)
    qa = quantize_act(torch.randn(1, 256, device="cuda"), 0)
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w[:-1], 12, 16, torch.empty(1, 16, device="cuda"))
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w, 12, 16, torch.empty(2, 16, device="cuda"))
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w, 2, 16, torch.empty(1, 16, device="cuda"))
