"""Tensor-core skinny GEMM (tightfit.kernels.gemv_mma) on the device at the model's real shapes,
against tightfit.quant's reference dequantization + float64 matmul on sampled rows (plus the last
rows: the partial 16-row tile), and against gemv_cuda on the same quantized activations. Skipped
without a CUDA device or cupy. Outputs are poisoned with NaN before every run.

Bounds: vs the de-quantized int8 activations 1e-4 relative (integer dots are exact; fp32 scale
products / summation order only), vs the float activations 2e-2; vs gemv_cuda 1e-5.
"""
from __future__ import annotations

import os
import torch

# Triton decides interpreter mode when a @triton.jit module is imported (see test_gemv_cuda_device)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("cupy")

from tightfit.kernels import gemv_cuda as gc  # noqa: E402
from tightfit.kernels import gemv_mma as gm  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act, quantize_act_ref  # noqa: E402
from tightfit.quant.dequant import dequantize  # noqa: E402
from tightfit.quant.traits import traits
from _gpu_blocks import rand_weights  # noqa: E402

pytestmark = [pytest.mark.gpu]

NAMES = {8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 23: "IQ4_XS"}
TYPES = list(NAMES)
SHAPES = [(5120, 17408), (17408, 5120), (5120, 1024), (5120, 40), (2304, 300)]
NS = [1, 2, 4, 5, 8, 11, 16]



def check(t, n_in, n_out, ns, seed=0, config=None):
    w = rand_weights(t, n_out, n_in, seed)
    rb = n_in // traits(t).block_size * traits(t).type_size
    rng = np.random.default_rng(seed)
    sel = np.unique(np.concatenate([rng.choice(n_out, size=min(48, n_out), replace=False),
                                    np.arange(max(0, n_out - 17), n_out)]))
    wsel = w.view(n_out, rb)[torch.from_numpy(sel).cuda()].cpu().numpy()
    W = dequantize(wsel, t).astype(np.float64).reshape(len(sel), n_in)
    for n in ns:
        x = torch.randn(n, n_in, device="cuda")
        act = quantize_act(x, 0)
        out = torch.full((n, n_out), float("nan"), device="cuda")
        y = gm.gemv_mma(act, w, t, n_out, out, config=config).cpu().numpy()
        what = f"{NAMES[t]} {n_in}->{n_out} N={n} {config or ''}"
        assert not np.isnan(y).any(), f"{what}: unwritten outputs"
        xn = x.cpu().numpy()
        q = act.q.cpu().numpy().astype(np.float64).reshape(n, n_in // 32, 32)
        d = act.d.cpu().numpy().astype(np.float64).reshape(n, n_in // 32)
        q_ref, _, _ = quantize_act_ref(xn)
        assert np.abs(q_ref.reshape(q.shape) - q).max() <= 1, "device quantize_act drifted"
        refq = (q * d[..., None]).reshape(n, n_in) @ W.T
        ref = xn.astype(np.float64) @ W.T
        ys = y[:, sel]
        eq = np.linalg.norm(ys - refq) / np.linalg.norm(refq)
        ef = np.linalg.norm(ys - ref) / np.linalg.norm(ref)
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


def test_device_many_columns():
    check(12, 2048, 512, [17, 24, 33], seed=5)


@pytest.mark.parametrize("t", [12, 14], ids=NAMES.get)
def test_cuda_graph_capture(t):
    n_in, n_out, n = 5120, 1024, 5
    w = rand_weights(t, n_out, n_in, 11)
    x = torch.randn(n, n_in, device="cuda")
    qa = quantize_act(x, 0)
    out = torch.full((n, n_out), float("nan"), device="cuda")
    gm.gemv_mma(qa, w, t, n_out, out)               # warm-up: module + geometry cached
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            quantize_act(x, 0, out=qa)
            gm.gemv_mma(qa, w, t, n_out, out)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        x.copy_(torch.randn(n, n_in, device="cuda"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = gm.gemv_mma(quantize_act(x, 0), w, t, n_out, torch.empty(n, n_out, device="cuda"))
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        # split tiles are atomically added: the fp32 summation order differs between runs
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_bad_inputs():
    w = rand_weights(12, 16, 256, 0)
    qa = quantize_act(torch.randn(1, 256, device="cuda"), 0)
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w[:-1], 12, 16, torch.empty(1, 16, device="cuda"))
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w, 12, 16, torch.empty(2, 16, device="cuda"))
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w, 2, 16, torch.empty(1, 16, device="cuda"))
