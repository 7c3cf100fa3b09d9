"""GEMV kernels vs the slow reference (NumPy dequantization + float64 matmul), on CPU under
TRITON_INTERPRET=1 with the integer emulation of dp4a/prmt, tiny shapes, fresh random blocks.

Two bounds per call:
- against the reference fed the int8-quantized activations the kernel itself uses: 1e-3
  (only fp32 accumulation order differs; Q4_K/Q5_K/Q2_K subtract a min term, so cancellation
  makes this looser than plain fp32 rounding; a decoding bug gives O(1));
- against the reference fed the float activations: 2e-2. int8 per-32 rounding of x costs
  ~0.3-0.7 % relative error on random data (amax/254 per element), 2 % leaves headroom.
"""
from __future__ import annotations

import numpy as np
import pytest

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from tightfit.kernels.gemv import gemv, gemv_ref, type_name  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act, quantize_act_ref, LAYOUTS  # noqa: E402
from tightfit.kernels.embed import embed_rows  # noqa: E402
from tightfit.quant.traits import traits  # noqa: E402

# CPU tensors: only where the kernels were built for the interpreter
pytestmark = pytest.mark.skipif(not _interp.interpreted("tightfit.kernels.gemv",
                                                        "tightfit.kernels.quantize_act",
                                                        "tightfit.kernels.embed"),
                                reason="CPU tests run the Triton interpreter")

# byte offsets of the fp16 scale fields inside one GGUF block (spec/quant-formats.md §2)
F16_FIELDS = {8: [0], 2: [0], 6: [0], 20: [0], 42: [0], 41: [0], 10: [80, 82], 11: [108],
              12: [0, 2], 13: [0, 2], 14: [208], 23: [0], 35: [64], 34: [52], 16: [0], 17: [0],
              22: [0], 18: [0], 21: [0]}
PRIORITY = [23, 13, 14, 11, 12, 8, 17, 22, 21, 18, 20, 10]      # the 27B mix, by bytes
OTHERS = [2, 6, 16, 35, 34, 41, 42]


def rand_blocks(rng, t, n_out, n_in):
    tr = traits(t)
    raw = rng.integers(0, 256, size=(n_out * n_in // tr.block_size, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        sc = rng.uniform(0.001, 0.01, raw.shape[0]).astype(np.float16)
        raw[:, off:off + 2] = sc.view(np.uint8).reshape(-1, 2)
    return raw.reshape(n_out, -1)


def run_check(t, n, n_out, n_in, seed):
    rng = np.random.default_rng(seed)
    w = rand_blocks(rng, t, n_out, n_in)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    out = torch.full((n, n_out), float("nan"))
    y = gemv(torch.from_numpy(x), torch.from_numpy(w.reshape(-1).copy()), t, n_out, n_in,
             out=out).numpy()
    assert not np.isnan(y).any(), "unwritten outputs"
    ref = gemv_ref(x, w, t, n_out, n_in)
    q, d, _ = quantize_act_ref(x)
    refq = gemv_ref((q * d[..., None]).reshape(n, n_in), w, t, n_out, n_in)
    eq = np.linalg.norm(y - refq) / np.linalg.norm(refq)
    ef = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert eq < 1e-3, f"{type_name(t)} N={n}: {eq:.2e} vs quantized-x reference"
    assert ef < 2e-2, f"{type_name(t)} N={n}: {ef:.2e} vs float reference"


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("t", PRIORITY, ids=type_name)
def test_gemv_priority(t, n):
    run_check(t, n, 16, 512 if n == 1 else 256, seed=1000 * t + n)


@pytest.mark.parametrize("t", OTHERS, ids=type_name)
def test_gemv_others(t):
    run_check(t, 3, 8, 256, seed=7 * t)


@pytest.mark.parametrize("n,n_out,n_in", [(1, 16, 512), (8, 8, 256), (2, 5, 768)])
def test_gemv_tq1_0(n, n_out, n_in):
    """TQ1_0 (base-3 trits, three stages of different strides): every element position of the
    block is checked against the NumPy decoder through fresh random bytes (all bytes decode)."""
    run_check(34, n, n_out, n_in, seed=3400 + n)


def test_tq1_0_trit_swar():
    """The packed-word trit extraction equals the spec formula byte by byte, all 256 bytes."""
    from tightfit.quant.dequant_k import trits
    b = np.arange(256, dtype=np.uint8)
    want = trits(b[None, :], 5)[0]                       # [5, 256]
    w = b.reshape(64, 4).view(np.uint32).astype(np.int64)
    for n in range(5):
        e = w & 0x00FF00FF
        o = (w >> 8) & 0x00FF00FF
        for _ in range(n):
            e, o = (e * 3) & 0x00FF00FF, (o * 3) & 0x00FF00FF
        q = (((e * 3) >> 8) & 0x00030003) | ((((o * 3) >> 8) & 0x00030003) << 8)
        got = q.astype(np.uint32).view(np.uint8).reshape(-1)
        assert np.array_equal(got, want[n]), n


@pytest.mark.parametrize("t", [0, 1, 30], ids=type_name)
def test_gemv_float(t):
    rng = np.random.default_rng(t)
    n, n_out, n_in = 3, 24, 200
    wf = rng.standard_normal((n_out, n_in)).astype(np.float32)
    raw = {0: wf, 1: wf.astype(np.float16), 30: None}[t]
    if t == 30:
        raw = (wf.view(np.uint32) >> 16).astype(np.uint16)
    raw = np.ascontiguousarray(raw).view(np.uint8)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    out = torch.full((n, n_out), float("nan"))
    y = gemv(torch.from_numpy(x), torch.from_numpy(raw.reshape(-1).copy()), t, n_out, n_in,
             out=out).numpy()
    ref = gemv_ref(x, raw, t, n_out, n_in)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("layout", range(4))
def test_quantize_act(layout):
    x = np.random.default_rng(layout).standard_normal((2, 512)).astype(np.float32)
    x[1, :32] = 0.0                                   # an all-zero block must give d = 0
    a = quantize_act(torch.from_numpy(x), layout)
    q, d, s16 = quantize_act_ref(x)
    got = a.q.numpy().reshape(2, -1, 32)
    assert np.array_equal(got, q.reshape(2, -1, 32)[:, :, LAYOUTS[layout]])
    np.testing.assert_allclose(a.d.numpy(), d, rtol=1e-6, atol=0)
    assert np.array_equal(a.s16.numpy(), s16)


@pytest.mark.parametrize("t", [11, 1, 14], ids=type_name)
def test_embed_rows(t):
    rng = np.random.default_rng(t)
    n_embd, vocab = 512, 12
    if t == 1:
        raw = rng.standard_normal((vocab, n_embd)).astype(np.float16).view(np.uint8)
    else:
        raw = rand_blocks(rng, t, vocab, n_embd)
    ids = torch.tensor([3, 0, 11, 3])
    y = embed_rows(ids, torch.from_numpy(raw.reshape(-1).copy()), t, n_embd).numpy()
    from tightfit.quant.dequant import dequantize
    ref = dequantize(raw.reshape(-1), t, (vocab, n_embd))[ids.numpy()]
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
