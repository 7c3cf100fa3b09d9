"""CUDA C++ GEMV (tightfit.kernels.gemv_cuda) on the device at the model's real shapes, against
NumPy dequantization (gguf-py) + float64 matmul on sampled rows (plus the last rows: tails).
Skipped without a CUDA device or cupy. Outputs are poisoned with NaN before every run.

Bounds: vs the de-quantized int8 activations 1e-4 relative (integer dots are exact; fp32 scale
products / summation order only), vs the float activations 2e-2.
"""
from __future__ import annotations

import os  # noqa: E402
import torch  # noqa: E402

# Triton decides interpreter mode when a @triton.jit module is imported, and modules are imported
# once per test session: without a GPU they must come in interpreted, as every kernel test expects
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("cupy")

from gguf.quants import dequantize as gg_dequantize  # noqa: E402

from tightfit.kernels import gemv_cuda as gc  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act, quantize_act_ref  # noqa: E402
from tightfit.quant.traits import traits
from _gpu_blocks import rand_weights  # noqa: E402

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


def dequant_rows(raw, t, n_rows, n_in):
    """float64 rows: gguf-py's dequantizer where the installed version has the type, else
    tightfit's reference (checked against gguf-py wherever gguf-py has the type, in CI)."""
    if traits(t).gguf_dequant:
        return gg_dequantize(raw, gguf.GGMLQuantizationType(t)).astype(np.float64).reshape(n_rows, n_in)
    from tightfit.quant.dequant import dequantize
    return np.asarray(dequantize(raw.reshape(-1), t, (n_rows, n_in)), np.float64).reshape(n_rows, n_in)



def check(t, n_in, n_out, ns, seed=0):
    w = rand_weights(t, n_out, n_in, seed)
    rb = n_in // traits(t).block_size * traits(t).type_size
    rng = np.random.default_rng(seed)
    sel = np.unique(np.concatenate([rng.choice(n_out, size=min(48, n_out), replace=False),
                                    np.arange(max(0, n_out - 3), n_out)]))
    wsel = w.view(n_out, rb)[torch.from_numpy(sel).cuda()].cpu().numpy()
    W = dequant_rows(wsel, t, len(sel), n_in)
    for n in ns:
        x = torch.randn(n, n_in, device="cuda")
        out = torch.full((n, n_out), float("nan"), device="cuda")
        act = quantize_act(x, 0)
        y = gc.gemv_cuda(act, w, t, n_out, out).cpu().numpy()
        assert not np.isnan(y).any(), f"{NAMES[t]} {n_in}->{n_out} N={n}: unwritten outputs"
        xn = x.cpu().numpy()
        # the kernel's own int8 activations (the device's rounding of exact ties may differ
        # from the NumPy quantizer's by one step, ~1e-4 of the result): the oracle is the
        # float64 product on the SAME quantized x; quantize_act has its own reference tests
        q = act.q.cpu().numpy().astype(np.float64).reshape(n, n_in // 32, 32)
        d = act.d.cpu().numpy().astype(np.float64).reshape(n, n_in // 32)
        q_ref, _, _ = quantize_act_ref(xn)
        assert np.abs(q_ref.reshape(q.shape) - q).max() <= 1, "device quantize_act drifted"
        refq = (q * d[..., None]).reshape(n, n_in) @ W.T
        ref = xn.astype(np.float64) @ W.T
        ys = y[:, sel]
        eq = np.linalg.norm(ys - refq) / np.linalg.norm(refq)
        ef = np.linalg.norm(ys - ref) / np.linalg.norm(ref)
        what = f"{NAMES[t]} {n_in}->{n_out} N={n}"
        assert eq < 1e-4, f"{what}: {eq:.2e} vs quantized-x reference"
        assert ef < 2e-2, f"{what}: {ef:.2e} vs float reference"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_device_shapes(t, shape):
    check(t, *shape, NS, seed=t * 7 + shape[1])


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
    n_in, n_out, n = 5120, 1024, 4
    w = rand_weights(t, n_out, n_in, 11)
    x = torch.randn(n, n_in, device="cuda")
    qa = quantize_act(x, 0)
    out = torch.full((n, n_out), float("nan"), device="cuda")
    gc.gemv_cuda(qa, w, t, n_out, out)               # warm-up: module + geometry cached
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            quantize_act(x, 0, out=qa)
            gc.gemv_cuda(qa, w, t, n_out, out)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        x.copy_(torch.randn(n, n_in, device="cuda"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = gc.gemv_cuda(quantize_act(x, 0), w, t, n_out,
                           torch.empty(n, n_out, device="cuda"))
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


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
