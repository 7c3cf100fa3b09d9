"""CUDA C++ GEMV (tightfit.kernels.gemv_cuda) on the device at the model's real shapes, against
NumPy dequantization (gguf-py) + float64 matmul on sampled rows (plus the last rows: tails).
Skipped without a CUDA device or cupy. Outputs are poisoned with NaN before every run.

Bounds: vs the de-quantized int8 activations 1e-4 relative (integer dots are exact; fp32 scale
products / summation order only), vs the float activations 2e-2.
"""
from __future__ import annotations

import _interp

_interp.interpret_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("gguf")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)   # device-only module
pytest.importorskip("cupy")

from tightfit.kernels import gemv_cuda as gc  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act  # noqa: E402
from _gpu_blocks import check_graph_replay, gemv_errors, rand_weights  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gc.available(), reason="CUDA GEMV disabled (TIGHTFIT_GEMV)")]

NAMES = {8: "Q8_0", 2: "Q4_0", 6: "Q5_0", 20: "IQ4_NL", 23: "IQ4_XS", 12: "Q4_K", 13: "Q5_K",
         14: "Q6_K"}
TYPES = list(NAMES)
# issue 6's shapes (27B: FFN, attention q / k / v / o, GDN qkv and gate) and the GDN gates' 48 rows
SHAPES = [(5120, 17408), (17408, 5120), (5120, 1024), (5120, 48), (6144, 5120), (5120, 6144),
          (5120, 10240), (5120, 12288)]
NS = [1, 2, 4, 8, 11, 16]
# the 2-3-bit, 1-bit and ternary formats: the FFN and attention shapes, N = 1, 2, 4, 8, 16
LOWBIT = {10: "Q2_K", 11: "Q3_K", 16: "IQ2_XXS", 17: "IQ2_XS", 22: "IQ2_S", 18: "IQ3_XXS",
          21: "IQ3_S", 34: "TQ1_0", 35: "TQ2_0", 41: "Q1_0", 42: "Q2_0"}
NAMES.update(LOWBIT)
LOWBIT_SHAPES = [s for s in SHAPES if s[1] != 48]


def check(t, n_in, n_out, ns, seed=0, scale=(0.001, 0.01)):
    w = rand_weights(t, n_out, n_in, seed, scale=scale)
    for n in ns:
        x = torch.randn(n, n_in, device="cuda")
        out = torch.full((n, n_out), float("nan"), device="cuda")
        act = quantize_act(x, 0)
        y = gc.gemv_cuda(act, w, t, n_out, out)
        what = f"{NAMES[t]} {n_in}->{n_out} N={n}"
        assert not torch.isnan(y).any(), f"{what}: unwritten outputs"
        eq, ef = gemv_errors(w, t, n_out, x, act, y, seed=seed)
        assert eq < 1e-4, f"{what}: {eq:.2e} vs quantized-x reference"
        assert ef < 2e-2, f"{what}: {ef:.2e} vs float reference"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_device_shapes(t, shape):
    check(t, *shape, NS, seed=t * 7 + shape[1])


# every column count a launch can have (NCS: 1..8, 16), one at a time: the speculative verify
# block runs N = k + 1 = 5 (k = 4); N = 5..7 were untested until session 10 found the 27B's N = 5
# products wrong on IQ4_XS / Q5_K / Q6_K (bench/model_gemv_check.py)
EVERY_NC_CASES = [(t, sh) for t in (23, 13, 14, 12, 8)
                  for sh in ((5120, 17408), (17408, 5120), (6144, 5120))] + [(14, (5120, 248320))]


@pytest.mark.parametrize("n", [3, 5, 6, 7])
@pytest.mark.parametrize("t, shape", EVERY_NC_CASES,
                         ids=[f"{NAMES[t]}-{s[0]}to{s[1]}" for t, s in EVERY_NC_CASES])
def test_device_every_nc(t, shape, n):      # the output head (248320 rows) is Q6_K only
    check(t, *shape, [n], seed=t * 7 + shape[1] + n)


# fp16-subnormal block scales (the seed-mix 27B's IQ4_XS / Q5_K / Q6_K are all ~1e-5): every
# kernel variant's fp16 conversion must keep them (tf_gemv3's CSE-friendly tf_h2f read them as 0
# until session 10: N >= 2 products on wide matrices came out zero / wrong, N = 1 was right)
@pytest.mark.parametrize("shape", [(5120, 17408), (5120, 1024), (17408, 5120)],
                         ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_device_subnormal_scales(t, shape):
    check(t, *shape, [1, 2, 5, 8, 16], seed=t + shape[1], scale=(3e-6, 5e-5))


@pytest.mark.parametrize("shape", LOWBIT_SHAPES, ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", list(LOWBIT), ids=LOWBIT.get)
def test_device_shapes_lowbit(t, shape):
    check(t, *shape, [1, 2, 4, 8, 16], seed=t * 7 + shape[1])


def test_device_lm_head_q6k():
    check(14, 5120, 248320, [1, 2, 4, 8, 16], seed=3)


@pytest.mark.parametrize("wpr", [1, 2, 4, 8])
def test_device_wpr(wpr):
    for t in (12, 8):
        w = rand_weights(t, 300, 2048, wpr)
        x = torch.randn(3, 2048, device="cuda")
        qa = quantize_act(x, 0)
        y0 = gc.gemv_cuda(qa, w, t, 300, torch.full((3, 300), float("nan"), device="cuda"),
                          config={"wpr": 1})
        y = gc.gemv_cuda(qa, w, t, 300, torch.full((3, 300), float("nan"), device="cuda"),
                         config={"wpr": wpr})
        # a different split of K sums the same exact integer dots in another fp32 order: the
        # bound is relative to the output scale (an output near zero differs by ~1e-5 of max|y|)
        torch.testing.assert_close(y, y0, rtol=1e-5, atol=1e-5 * float(y0.abs().max()))


@pytest.mark.parametrize("t", [12, 14, 8], ids=NAMES.get)
def test_cuda_graph_capture(t):
    check_graph_replay(gc.gemv_cuda, t, 4)


def test_bad_inputs():
    w = rand_weights(12, 8, 256, 0)
    qa = quantize_act(torch.randn(1, 256, device="cuda"), 0)
    with pytest.raises(ValueError):
        gc.gemv_cuda(qa, w[:-1], 12, 8, torch.empty(1, 8, device="cuda"))
    with pytest.raises(ValueError):
        gc.gemv_cuda(qa, w, 12, 8, torch.empty(2, 8, device="cuda"))
    with pytest.raises(ValueError):
        gc.gemv_cuda(qa, w, 999, 8, torch.empty(1, 8, device="cuda"))


# kern v3 (x staged in shared memory, NC >= 2) against v2h on the same quantized activations:
# K % KC != 0 (2304, 5120 at KC 2048), n_out not a multiple of the CTA's 16 rows, NC 2..16 and
# 9..15 (8 + rest), both v3 wpr values.
@pytest.mark.parametrize("shape", [(5120, 1024), (2304, 300), (17408, 77), (1024, 5120)],
                         ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_device_v3_vs_v2h(t, shape):
    n_in, n_out = shape
    w = rand_weights(t, n_out, n_in, 5 + t)
    for n in (1, 2, 3, 5, 8, 11, 16):
        qa = quantize_act(torch.randn(n, n_in, device="cuda"), 0)
        y2 = gc.gemv_cuda(qa, w, t, n_out, torch.full((n, n_out), float("nan"), device="cuda"),
                          config={"kern": "v2h"})
        for wpr in (1, 2):
            cfg = {"kern": "v3", "wpr": wpr} if n >= 2 and n != 16 else {"kern": "v3"}
            y3 = gc.gemv_cuda(qa, w, t, n_out, torch.full((n, n_out), float("nan"), device="cuda"),
                              config=cfg)
            assert not torch.isnan(y3).any(), f"{NAMES[t]} {shape} N={n} {cfg}: unwritten outputs"
            e = float(torch.linalg.norm(y3 - y2) / torch.linalg.norm(y2))
            assert e < 1e-5, f"{NAMES[t]} {shape} N={n} {cfg}: {e:.2e} vs v2h"
