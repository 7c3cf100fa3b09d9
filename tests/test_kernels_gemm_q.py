"""Batched quantized GEMM (tightfit/kernels/gemm_q.py, gemm_q_torch.py) against the slow reference:
tightfit.quant's NumPy dequantization (itself checked bit-exact against gguf-py) and a float64
matmul. Fresh random blocks (valid fp16 scales written into random bytes), outputs poisoned with
NaN. The Triton kernels run under TRITON_INTERPRET=1 (prmt emulated).

Bounds:
- torch decoders and the Triton tile decoders (fp32 out): bit-exact with the NumPy reference;
- Triton paths vs the reference fed the same bf16-rounded x and W: 1e-5 relative (only fp32
  summation order differs; a decoding or layout bug gives O(1));
- Triton paths vs the float reference: 1.5e-2 relative (bf16 rounding of x and W);
- fp32 CPU path vs the float reference: 1e-5.
"""
from __future__ import annotations

import numpy as np
import pytest

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tightfit.kernels.gemm_q import FUSED_TYPES, chunk_rows, gemm_q, gemm_q_ref  # noqa: E402
from tightfit.kernels.gemm_q_torch import DECODERS, dequant_rows  # noqa: E402
from tightfit.quant.dequant import dequantize  # noqa: E402
from tightfit.quant.traits import traits  # noqa: E402

# CPU tensors: only where the kernels were built for the interpreter
interp = pytest.mark.skipif(not _interp.interpreted("tightfit.kernels.gemm_q"),
                            reason="CPU tests of the Triton kernels need TRITON_INTERPRET=1")

F16_FIELDS = {8: [0], 20: [0], 10: [80, 82], 11: [108], 12: [0, 2], 13: [0, 2], 14: [208],
              23: [0], 16: [0], 17: [0], 22: [0], 18: [0], 21: [0],
              2: [0], 6: [0], 41: [0], 42: [0], 35: [64], 34: [52]}
ISSUE6 = [2, 6, 41, 42, 35, 34]           # issue 6's list beyond the seed mix (byte-gather decoders)
SEED_MIX = [23, 13, 14, 12, 11, 8, 10, 17, 22, 21, 18, 20]   # the 12 formats of the seed mix


def rand_w(rng, t, n_out, n_in):
    tr = traits(t)
    raw = rng.integers(0, 256, size=(n_out * n_in // tr.block_size, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        sc = rng.uniform(0.001, 0.01, raw.shape[0]).astype(np.float16)
        raw[:, off:off + 2] = sc.view(np.uint8).reshape(-1, 2)
    return raw.reshape(n_out, -1)


def bf16_ref(x, w, t, n_out, n_in):
    wf = dequantize(w.reshape(-1), t, (n_out, n_in))
    wb = torch.from_numpy(wf).bfloat16().double().numpy()
    xb = torch.from_numpy(x).bfloat16().double().numpy()
    return xb @ wb.T


def rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / (np.abs(b).max() + 1e-12))


@pytest.mark.parametrize("t", sorted(DECODERS))
def test_torch_decoders_bit_exact(t):
    rng = np.random.default_rng(100 + t)
    n_in = 512
    w = rand_w(rng, t, 5, n_in)
    want = dequantize(w.reshape(-1), t, (5, n_in))
    got = dequant_rows(torch.from_numpy(w.copy()), t, n_in).numpy()
    assert np.array_equal(got, want)


def test_fused_types():
    """Every format of the 27B mixes, IQ2_XXS and the rest of issue 6's quantized list has a fused
    tile decoder (no torch-decoder fallback on the GPU for n_in % 256 == 0) and a torch decoder
    (no NumPy host fallback on the CPU path)."""
    assert set(SEED_MIX) | {16} | set(ISSUE6) <= set(FUSED_TYPES)
    assert set(FUSED_TYPES) <= set(DECODERS)


@interp
@pytest.mark.parametrize("t", sorted(FUSED_TYPES))
def test_tile_decoder_bit_exact(t):
    """gemm_q_decode.decode_tile (through the dequant kernel, fp32 out) == NumPy dequantize,
    bit for bit: element order, field offsets, sign parity, scale arithmetic. 16 rows x 2 K steps
    of random blocks (IQ2_XS: 1,024 random 7-bit sign indices)."""
    from tightfit.kernels.gemm_q import dequant_chunk
    rng = np.random.default_rng(200 + t)
    n_out, n_in = 16, 512
    w = rand_w(rng, t, n_out, n_in)
    out = torch.full((n_out, n_in), float("nan"))
    got = dequant_chunk(torch.from_numpy(w.reshape(-1).copy()), t, n_in, 0, n_out, out=out,
                        use_triton=True).numpy()
    assert np.array_equal(got, dequantize(w.reshape(-1), t, (n_out, n_in)))


@interp
@pytest.mark.parametrize("t", sorted(FUSED_TYPES))
@pytest.mark.parametrize("M", [16, 20, 33])
def test_fused_kernel(t, M):
    rng = np.random.default_rng(1000 * t + M)
    n_out, n_in = 40, 512                  # 40 rows: a partial BN=64 tile; M=33: BM=64 masking
    w = rand_w(rng, t, n_out, n_in)
    x = rng.standard_normal((M, n_in)).astype(np.float32)
    out = torch.full((M, n_out), float("nan"))
    y = gemm_q(torch.from_numpy(x), torch.from_numpy(w.reshape(-1).copy()), t, n_out, n_in,
               out=out, mode="fused").numpy()
    assert not np.isnan(y).any(), "unwritten outputs"
    assert rel(y, bf16_ref(x, w, t, n_out, n_in)) < 1e-5
    assert rel(y, gemm_q_ref(x, w, t, n_out, n_in)) < 1.5e-2


@interp
@pytest.mark.parametrize("t", SEED_MIX)
def test_dequant_path_chunks(t):
    """Decode into a bf16 scratch, several row chunks (the last one partial), then matmul."""
    rng = np.random.default_rng(7 + t)
    n_out, n_in, M = 37, 512, 18
    w = rand_w(rng, t, n_out, n_in)
    x = rng.standard_normal((M, n_in)).astype(np.float32)
    scratch = 16 * 2 * n_in                  # 16 bf16 rows (fewer for the torch decoders)
    assert chunk_rows(t, n_in, scratch) < n_out
    out = torch.full((M, n_out), float("nan"))
    y = gemm_q(torch.from_numpy(x), torch.from_numpy(w.reshape(-1).copy()), t, n_out, n_in,
               out=out, mode="dequant", scratch_bytes=scratch).numpy()
    assert not np.isnan(y).any()
    assert rel(y, bf16_ref(x, w, t, n_out, n_in)) < 1e-5
    assert rel(y, gemm_q_ref(x, w, t, n_out, n_in)) < 1.5e-2


@pytest.mark.parametrize("t", SEED_MIX + ISSUE6)
def test_cpu_fp32_path(t):
    rng = np.random.default_rng(50 + t)
    n_out, n_in, M = 9, 256, 5
    w = rand_w(rng, t, n_out, n_in)
    x = rng.standard_normal((M, n_in)).astype(np.float32)
    y = gemm_q(torch.from_numpy(x), torch.from_numpy(w.reshape(-1).copy()), t, n_out, n_in,
               mode="torch", scratch_bytes=4 * 2 * n_in).numpy()
    assert rel(y, gemm_q_ref(x, w, t, n_out, n_in)) < 1e-5


@pytest.mark.parametrize("dt", [torch.float32, torch.float16, torch.bfloat16])
def test_float_matrices(dt):
    rng = np.random.default_rng(3)
    n_out, n_in, M = 11, 64, 6
    w = torch.from_numpy(rng.standard_normal((n_out, n_in)).astype(np.float32)).to(dt)
    x = rng.standard_normal((M, n_in)).astype(np.float32)
    raw = w.contiguous().view(torch.uint8).reshape(-1)
    qt = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}[dt]
    y = gemm_q(torch.from_numpy(x), raw, qt, n_out, n_in).numpy()
    want = x.astype(np.float64) @ w.double().numpy().T
    assert rel(y, want) < 1e-5


def test_errors():
    x = torch.zeros(4, 256)
    w = torch.zeros(10 * 136, dtype=torch.uint8)
    with pytest.raises(ValueError):
        gemm_q(torch.zeros(4, 128), w, 23, 10, 256)
    with pytest.raises(ValueError):
        gemm_q(x, w, 10, 10, 256, mode="fused")      # Q2_K: 84 bytes per 256, not 136
    with pytest.raises(ValueError):
        gemm_q(x, torch.zeros(10 * 160, dtype=torch.uint8), 3, 10, 256, mode="fused")  # Q4_1
    with pytest.raises(ValueError):
        gemm_q(x, w, 23, 10, 256, mode="nope")


LARGE_TILE_CASES = ([(t, 1, 1) for t in SEED_MIX] + [(t, 0, 1) for t in (23, 14, 17)]
                    + [(t, 1, 0) for t in (13, 22)])


@interp
@pytest.mark.parametrize("t,swap,mfast", LARGE_TILE_CASES)
def test_fused_kernel_large_tile_variants(t, swap, mfast):
    """The large-M variants of the fused kernel (bench/gemm_sweep.py's candidates): W as the
    register A operand (SWAP, transposed store), token tiles fastest (MFAST), partial tiles in
    both dimensions (M = 40 of BM = 32, 40 rows of BN = 32), out a column slice of a wider
    buffer (as the batched forward passes it)."""
    rng = np.random.default_rng(77 * t + 3 * swap + mfast)
    n_out, n_in, M = 40, 512, 40
    w = rand_w(rng, t, n_out, n_in)
    x = rng.standard_normal((M, n_in)).astype(np.float32)
    buf = torch.full((M, n_out + 8), float("nan"))
    cfg = {"BM": 32, "BN": 32, "num_warps": 4, "num_stages": 2, "SWAP": swap, "MFAST": mfast}
    gemm_q(torch.from_numpy(x), torch.from_numpy(w.reshape(-1).copy()), t, n_out, n_in,
           out=buf[:, 4:4 + n_out], mode="fused", config=cfg)
    y = buf.numpy()
    assert np.isnan(y[:, :4]).all() and np.isnan(y[:, 4 + n_out:]).all(), "wrote outside out"
    y = y[:, 4:4 + n_out]
    assert not np.isnan(y).any(), "unwritten outputs"
    assert rel(y, bf16_ref(x, w, t, n_out, n_in)) < 1e-5


def test_fused_config_table(monkeypatch, tmp_path):
    """Large-M tiles come from TIGHTFIT_GEMM_CONFIGS (bench/gemm_sweep.py's JSON), then CONFIGS;
    small M keeps the small-M tile; "mode": "fused" routes large M to the fused kernel."""
    import json
    from tightfit.kernels import gemm_q as G
    small = G.fused_config(23, 16, 17408, 5120)
    assert small["BM"] == 16 and small["MFAST"] == 0
    assert G.shape_class(17408, 5120) == "wide" and G.shape_class(5120, 17408) == "down"
    assert G.shape_class(1024, 5120) == "small" and G.shape_class(248320, 5120) == "head"
    f = tmp_path / "best.json"
    f.write_text(json.dumps({"best": {"23": {"wide": {"BM": 128, "BN": 64, "num_warps": 8,
                                                      "num_stages": 2, "SWAP": 1, "MFAST": 1,
                                                      "mode": "fused"}}}}))
    monkeypatch.setenv("TIGHTFIT_GEMM_CONFIGS", str(f))
    monkeypatch.setattr(G, "_ENV_CONFIGS", None)
    c = G.fused_config(23, 1024, 17408, 5120)
    assert c["BM"] == 128 and c["SWAP"] == 1 and c["mode"] == "fused"
    base = {"num_stages": 2, "SWAP": 0, "MFAST": 1, "HALF": 0}
    assert G.fused_config(23, 1024, 5120, 17408) == {**base, **G.CONFIGS[(23, "*")]}
    assert G.fused_config(14, 1024, 17408, 5120) == {**base, **G.CONFIGS[("*", "*")]}
    assert G.fused_config(14, 1024, 5120, 17408)["mode"] == "fused"   # measured winner (down)
    cuda = torch.device("cuda")
    assert G.pick_mode(23, 1024, 5120, cuda, 17408) == "fused"
    assert G.pick_mode(23, 1024, 17408, cuda, 5120) == "dequant"
    assert G.pick_mode(23, 16, 17408, cuda, 5120) == "fused"
    # one scratch chunk holds the whole bf16 matrix: dequant + cuBLAS (measured faster)
    assert G.pick_mode(23, 1024, 5120, cuda, 6144) == "dequant"
    assert G.pick_mode(23, 1024, 5120, cuda, 6144, scratch_bytes=32 << 20) == "fused"


@interp
@pytest.mark.parametrize("t", [23, 12, 13])
@pytest.mark.parametrize("swap", [0, 1])
def test_fused_kernel_half_blocks(t, swap):
    """HALF: K steps of half a GGUF block (gemm_q_decode.decode_half, IQ4_XS / Q4_K / Q5_K):
    the same bf16 W values as the whole-block decoder, so the same bound."""
    rng = np.random.default_rng(500 + t + swap)
    n_out, n_in, M = 40, 768, 33
    w = rand_w(rng, t, n_out, n_in)
    x = rng.standard_normal((M, n_in)).astype(np.float32)
    out = torch.full((M, n_out), float("nan"))
    cfg = {"BM": 32, "BN": 32, "num_warps": 4, "num_stages": 2, "SWAP": swap, "MFAST": 1,
           "HALF": 1}
    y = gemm_q(torch.from_numpy(x), torch.from_numpy(w.reshape(-1).copy()), t, n_out, n_in,
               out=out, mode="fused", config=cfg).numpy()
    assert not np.isnan(y).any(), "unwritten outputs"
    assert rel(y, bf16_ref(x, w, t, n_out, n_in)) < 1e-5

