"""Embedding row lookup on the device (tightfit/kernels/embed.py) against tightfit.quant's NumPy
dequantization, bit for bit (fp32), under TRITON_INTERPRET=1.

Fresh random tables (valid fp16 scales written into random bytes), random ids with 0, n_vocab-1
and repeats, outputs poisoned with NaN first (an unwritten element fails the equality).
"""
from __future__ import annotations

import numpy as np
import pytest

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tightfit.kernels import embed  # noqa: E402
from tightfit.kernels.embed import DEVICE_TYPES, embed_rows  # noqa: E402
from tightfit.quant.dequant import dequantize  # noqa: E402
from tightfit.quant.traits import traits  # noqa: E402

# CPU tensors: only where the kernels were built for the interpreter
interp = pytest.mark.skipif(not _interp.interpreted(embed),
                            reason="CPU tests of the Triton kernels need TRITON_INTERPRET=1")

# byte offsets of the fp16 fields inside one block (spec/quant-formats.md §2)
F16_FIELDS = {8: [0], 20: [0], 10: [80, 82], 11: [108], 12: [0, 2], 13: [0, 2], 14: [208],
              23: [0], 16: [0], 17: [0], 22: [0], 18: [0], 21: [0], 2: [0], 6: [0], 41: [0],
              42: [0], 35: [64], 34: [52]}
QUANT = [23, 12, 13, 14, 11, 8, 10, 16, 17, 22, 21, 18, 20,   # every tile decoder's format
         2, 6, 41, 42, 35, 34]
#: issue 6: every type the engine must look embeddings up in on the device
ISSUE6 = ["Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
          "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "F16", "BF16", "F32", "TQ1_0",
          "TQ2_0", "Q1_0", "Q2_0"]
FLOATS = {0: np.float32, 1: np.float16}
N_VOCAB = 37


def rand_table(rng, t, n_vocab, n_embd) -> np.ndarray:
    """[n_vocab * row_bytes] uint8."""
    if t in FLOATS:
        return rng.standard_normal((n_vocab, n_embd)).astype(FLOATS[t]).view(np.uint8).reshape(-1)
    if t == 30:
        x = torch.from_numpy(rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
        return x.bfloat16().view(torch.uint8).numpy().reshape(-1).copy()
    tr = traits(t)
    raw = rng.integers(0, 256, size=(n_vocab * n_embd // tr.block_size, tr.type_size),
                       dtype=np.uint8)
    for off in F16_FIELDS[t]:
        sc = rng.uniform(0.001, 0.01, raw.shape[0]).astype(np.float16)
        raw[:, off:off + 2] = sc.view(np.uint8).reshape(-1, 2)
    return raw.reshape(-1)


def rand_ids(rng, n_vocab, n=9) -> np.ndarray:
    ids = rng.integers(0, n_vocab, size=n)
    ids[:4] = [0, n_vocab - 1, 5, 0]
    ids[-2:] = [n_vocab - 1, 5]            # repeats: both ends and an inner id
    return rng.permutation(ids)


def check(t, n_embd, seed, id_dtype=torch.int64):
    rng = np.random.default_rng(seed)
    raw = rand_table(rng, t, N_VOCAB, n_embd)
    ids = rand_ids(rng, N_VOCAB)
    out = torch.full((len(ids), n_embd), float("nan"))
    got = embed_rows(torch.from_numpy(ids).to(id_dtype), torch.from_numpy(raw.copy()), t, n_embd,
                     out=out)
    assert got is out
    want = dequantize(raw, t, (N_VOCAB, n_embd))[ids]
    assert np.array_equal(got.numpy(), want), f"type {t}: rows differ from dequantize"


def test_device_types():
    """Every tile decoder's format and the three float types have a device kernel, and so
    does every type of issue 6."""
    from tightfit.kernels.gemv import type_id
    assert set(QUANT) | {0, 1, 30} == set(DEVICE_TYPES)
    assert {type_id(n) for n in ISSUE6} <= set(DEVICE_TYPES)


def _name(t):
    from tightfit.kernels.gemv import type_name
    return type_name(t)


@interp
@pytest.mark.parametrize("t", QUANT + [0, 1, 30], ids=_name)
def test_rows_bit_exact(t):
    check(t, 512, 300 + t)


@interp
@pytest.mark.parametrize("t", [0, 1, 30])
def test_float_partial_chunk(t):
    """F32/F16/BF16 with n_embd % 256 != 0: the last chunk is masked."""
    check(t, 320, 400 + t, id_dtype=torch.int32)


@interp
def test_int32_ids_default_out():
    rng = np.random.default_rng(5)
    raw = rand_table(rng, 14, N_VOCAB, 256)
    ids = np.array([N_VOCAB - 1, 0, 0])
    got = embed_rows(torch.from_numpy(ids).int(), torch.from_numpy(raw.copy()), "Q6_K", 256)
    assert got.dtype == torch.float32 and got.shape == (3, 256)
    assert np.array_equal(got.numpy(), dequantize(raw, 14, (N_VOCAB, 256))[ids])


@interp
def test_out_of_range_ids_zero():
    """No host check (it would sync): an id outside the table reads nothing and gives zeros."""
    rng = np.random.default_rng(6)
    for t in (12, 0):
        raw = rand_table(rng, t, N_VOCAB, 256)
        out = torch.full((3, 256), float("nan"))
        embed_rows(torch.tensor([-1, N_VOCAB, 2]), torch.from_numpy(raw.copy()), t, 256, out=out)
        assert (out[:2] == 0).all()
        assert np.array_equal(out[2].numpy(), dequantize(raw, t, (N_VOCAB, 256))[2])


@pytest.mark.parametrize("t,n_embd", [(8, 96), (20, 96), (2, 96), (6, 160)])
def test_fallback_bit_exact(t, n_embd):
    """Rows of 32-element formats (Q8_0, IQ4_NL, Q4_0, Q5_0) that are not whole 256-element
    chunks: gemm_q_torch / NumPy decode of the gathered rows."""
    check(t, n_embd, 500 + t)


def test_fallback_refuses_graph_capture(monkeypatch):
    monkeypatch.setattr(embed, "_capturing", lambda dev: True)
    with pytest.raises(RuntimeError, match="graph capture"):      # Q4_0, n_embd % 256 != 0
        embed_rows(torch.tensor([1]), torch.zeros(N_VOCAB * 54, dtype=torch.uint8), 2, 96)
    with pytest.raises(RuntimeError, match="graph capture"):      # Q8_0, n_embd % 256 != 0
        embed_rows(torch.tensor([1]), torch.zeros(N_VOCAB * 136, dtype=torch.uint8), 8, 128)


@interp
def test_kernel_path_allowed_during_capture(monkeypatch):
    """The kernel path does nothing on the host that capture forbids (tables cached first)."""
    rng = np.random.default_rng(7)
    raw = torch.from_numpy(rand_table(rng, 17, N_VOCAB, 256).copy())
    embed_rows(torch.tensor([0]), raw, 17, 256)               # caches the grid table
    monkeypatch.setattr(embed, "_capturing", lambda dev: True)
    got = embed_rows(torch.tensor([3]), raw, 17, 256)
    assert np.array_equal(got.numpy(), dequantize(raw.numpy(), 17, (N_VOCAB, 256))[[3]])


def test_errors():
    with pytest.raises(ValueError):
        embed_rows(torch.tensor([0]), torch.zeros(1000, dtype=torch.uint8), 12, 256)   # not rows
    with pytest.raises(ValueError):
        embed_rows(torch.tensor([0, 1]), torch.zeros(4 * 144, dtype=torch.uint8), 12, 256,
                   out=torch.empty(2, 256, dtype=torch.float16))
