"""Tensor-core skinny GEMM (tightfit.kernels.gemv_mma) on the device at the model's real shapes,
against NumPy dequantization (gguf-py) + float64 matmul on sampled rows (plus the last
rows: the partial 16-row tile), and against gemv_cuda on the same quantized activations. Skipped
without a CUDA device or cupy. Outputs are poisoned with NaN before every run.

Repeatability: split tile groups are summed in a fixed order (deterministic stream-K fixup), so
repeated calls and graph replays are bitwise equal, and the fixup counters are zero after a call.

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
from _gpu_blocks import capture, check_graph_replay, gemv_errors, rand_weights  # noqa: E402

pytestmark = [pytest.mark.gpu]

NAMES = {8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 23: "IQ4_XS", 17: "IQ2_XS",
         18: "IQ3_XXS", 21: "IQ3_S", 22: "IQ2_S"}
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
    check_graph_replay(gm.gemv_mma, t, 5)     # deterministic fixup: bitwise equal to eager


# ---- bitwise repeatability (deterministic stream-K fixup: no atomics, no zeroed out)
DET_SHAPES = [(5120, 48), (5120, 1024), (6144, 5120), (5120, 10240), (17408, 5120),
              (6144, 17408), (5120, 40000)]


def _poison(out, i):
    if i % 2:
        out.fill_(float("nan"))
    else:
        out.copy_(torch.randn_like(out) * 1e30)      # garbage, not zeros


@pytest.mark.parametrize("pipe", [0, 1])
@pytest.mark.parametrize("shape", DET_SHAPES, ids=lambda s: f"{s[0]}to{s[1]}")
@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_device_bitwise_repeatable(t, shape, pipe):
    """Three runs into poisoned buffers are bitwise equal, agree with the reference, and leave every
    fixup counter at zero; a captured graph replayed twice equals the eager result bitwise."""
    n_in, n_out = shape
    w = rand_weights(t, n_out, n_in, seed=t + n_out)
    cfg = {"pipe": pipe}
    for n in (1, 5, 8, 15, 16):
        x = torch.randn(n, n_in, device="cuda")
        act = quantize_act(x, 0)
        what = f"{NAMES[t]} {n_in}->{n_out} N={n} pipe={pipe}"
        outs = []
        for i in range(3):
            out = torch.empty(n, n_out, device="cuda")
            _poison(out, i)
            gm.gemv_mma(act, w, t, n_out, out, config=cfg)
            outs.append(out)
        torch.cuda.synchronize()
        assert not torch.isnan(outs[0]).any(), f"{what}: unwritten outputs"
        for o in outs[1:]:
            assert torch.equal(o, outs[0]), f"{what}: runs differ"
        cnt = gm.fixup_counters()
        assert cnt is not None and int(cnt.abs().sum()) == 0, f"{what}: counters not reset"
        if n in (1, 8):
            eq, ef = gemv_errors(w, t, n_out, x, act, outs[0], seed=t, tail=17)
            assert eq < 1e-4, f"{what}: {eq:.2e} vs quantized-x reference"
            assert ef < 2e-2, f"{what}: {ef:.2e} vs float reference"
        if n in (5, 16) and n_out <= 17408:
            gout = torch.empty(n, n_out, device="cuda")
            gm.prepare(t, n_out=n_out)
            g = capture(lambda: gm.gemv_mma(act, w, t, n_out, gout, config=cfg))
            for i in range(2):
                _poison(gout, i)
                g.replay()
                torch.cuda.synchronize()
                assert torch.equal(gout, outs[0]), f"{what}: graph replay {i} differs from eager"
            assert int(gm.fixup_counters().abs().sum()) == 0


def test_device_grids_bitwise():
    """Other stream-K grids (ctas_per_sm, fill off): repeatable and zero counters afterwards."""
    for cps in (1, 3, 8):
        for fill in (0, 1):
            w = rand_weights(12, 1040, 17408, seed=cps)
            act = quantize_act(torch.randn(8, 17408, device="cuda"), 0)
            cfg = {"ctas_per_sm": cps, "fill": fill}
            a = gm.gemv_mma(act, w, 12, 1040, torch.full((8, 1040), float("nan"), device="cuda"),
                            config=cfg)
            b = gm.gemv_mma(act, w, 12, 1040, torch.full((8, 1040), 7.0, device="cuda"),
                            config=cfg)
            torch.cuda.synchronize()
            assert torch.equal(a, b), (cps, fill)
            assert int(gm.fixup_counters().abs().sum()) == 0


def test_workspace_growth_refused_in_capture():
    """A call whose output needs more counters than the workspace holds cannot grow it inside a
    capture (clear error); prepare() sizes it beforehand."""
    dev = torch.cuda.current_device()
    ws = gm._ws.get(dev)
    big = (ws.groups if ws else 0) * 16 + 4096
    w = rand_weights(12, big, 256, seed=1)
    act = quantize_act(torch.randn(5, 256, device="cuda"), 0)
    out = torch.empty(5, big, device="cuda")
    gm.prepare(12)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot grow during CUDA graph capture"):
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            gm.gemv_mma(act, w, 12, big, out)
    torch.cuda.synchronize()
    gm.prepare(12, n_out=big)
    assert gm._ws[dev].groups >= -(-big // 16)


def test_bad_inputs():
    w = rand_weights(12, 16, 256, 0)
    qa = quantize_act(torch.randn(1, 256, device="cuda"), 0)
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w[:-1], 12, 16, torch.empty(1, 16, device="cuda"))
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w, 12, 16, torch.empty(2, 16, device="cuda"))
    with pytest.raises(ValueError):
        gm.gemv_mma(qa, w, 2, 16, torch.empty(1, 16, device="cuda"))
