"""Bounded prefill attention (tightfit/kernels/attn_prefill_flash.py) under TRITON_INTERPRET=1 (or
on a GPU) against float64 oracles on fresh random inputs at tiny shapes: attn_prefill_ref for an
f16 cache, and for quantized caches the float64 dequantize-then-attend oracle (everything back in
the ORIGINAL basis, so the rotated-domain shortcut is checked too) plus attention_quant.

Tolerance: K/V are exact fp16 values in both kernel and oracle (the cache / the fp16 tile; a
quantized row's code x scale is rounded once to fp16 in the tile, <= 2^-11 relative); the kernel
rounds q * log2(e)/sqrt(D) and the probabilities to fp16 for its two products (2^-11 relative
each) and accumulates in fp32. With |q|, |k|, |v| ~ N(0, 1) at D <= 64 the scores are O(1), so
the output's absolute error is a few 2^-11 ~ 5e-4: 3e-3 absolute leaves margin; against a
quantized cache the tile rounding adds one more fp16 rounding of each value (same order).
"""
from __future__ import annotations

import pytest
import torch

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()


from tightfit.kernels import attn_prefill as AP  # noqa: E402
from tightfit.kernels import attn_prefill_flash as AF  # noqa: E402
from tightfit.kvquant.formats import split_kv_type  # noqa: E402
from tightfit.kvquant.reference import (alloc_cache, attention_quant, dequantize,  # noqa: E402
                                        write_rows)

# the device follows how the kernels were built (possibly by an earlier test module), not the
# environment now: interpreted kernels take CPU tensors, compiled ones CUDA tensors
INTERP = _interp.interpreted(AF)
pytestmark = pytest.mark.skipif(not INTERP and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")
DEV = "cpu" if INTERP else "cuda"
TOL = 3e-3


def _f16(T, Hkv, D, g):
    return (torch.randn(T + 3, Hkv, D, generator=g).half().to(DEV),
            torch.randn(T + 3, Hkv, D, generator=g).half().to(DEV))


@pytest.mark.parametrize("D", [32, 64])
@pytest.mark.parametrize("n,p0", [(1, 0), (5, 3), (17, 40), (17, 0), (1, 40)])
def test_f16_cache_in_place(n, p0, D):
    g = torch.Generator().manual_seed(1000 * n + p0 + D)
    H, Hkv = 4, 2
    q = torch.randn(n, H, D, generator=g).to(DEV)
    kc, vc = _f16(p0 + n, Hkv, D, g)
    o = AF.flash_attn_prefill(q, kc, vc, p0)
    ref = AP.attn_prefill_ref(q.cpu(), kc.cpu(), vc.cpu(), p0)
    assert o.shape == (n, H, D) and o.dtype == torch.float32
    assert (o.cpu().double() - ref).abs().max() <= TOL


@pytest.mark.parametrize("n,p0", [(5, 3), (17, 40)])
def test_resume_over_key_ranges(n, p0):
    """The same f16 cache walked in key ranges from separate fp16 buffers (first launch stores
    m/l/acc, middle ones load + store, the last normalises) equals the one-launch result."""
    g = torch.Generator().manual_seed(7 + n)
    H, Hkv, D = 4, 2, 32
    T = p0 + n
    q = torch.randn(n, H, D, generator=g).to(DEV)
    kc, vc = _f16(T, Hkv, D, g)
    whole = AF.flash_attn_prefill(q, kc, vc, p0)
    o = torch.empty_like(whole)
    m = torch.empty(n, H, device=DEV)
    l = torch.empty_like(m)
    bounds = [0, 7, 23, T] if T > 23 else [0, 2, T]
    for a, b in zip(bounds, bounds[1:]):
        AF.flash_fwd(q, kc[a:b].clone(), vc[a:b].clone(), o, m, l, p0, a, b, kv_row0=a,
                     load=a > 0, final=b == T)
    ref = AP.attn_prefill_ref(q.cpu(), kc.cpu(), vc.cpu(), p0)
    assert (o.cpu().double() - ref).abs().max() <= TOL
    # the fp16 probabilities are relative to a different running max per range: ~2^-11 apart
    assert (o - whole).abs().max() <= 5e-4


@pytest.mark.parametrize("kv", ["q8_0", "tq3", "tq4+tq2", "q8_0+tq3"])
@pytest.mark.parametrize("n,p0", [(1, 0), (5, 3), (17, 40)])
def test_quantized_cache_tiles(kv, n, p0):
    g = torch.Generator().manual_seed(31 * n + p0 + len(kv))
    H, Hkv, D = 4, 2, 64 if kv == "tq3" else 32
    T = p0 + n
    kn, vn = split_kv_type(kv)
    kc, vc = alloc_cache(T + 2, Hkv, D, kn), alloc_cache(T + 2, Hkv, D, vn)
    write_rows(kc, vc, 0, torch.randn(T, Hkv, D, generator=g), torch.randn(T, Hkv, D, generator=g),
               kv)
    q = torch.randn(n, H, D, generator=g)
    o = AF.flash_attn_prefill(q.to(DEV), kc.to(DEV), vc.to(DEV), p0, kv, tile=16).cpu().double()
    # oracle 1: dequantize to float64 in the original basis, then the causal float64 attention
    K = dequantize(kc[:T], kn, D).to(torch.float64)
    V = dequantize(vc[:T], vn, D).to(torch.float64)
    ref = AP.attn_prefill_ref(q, K, V, p0)
    assert (o - ref).abs().max() <= TOL
    # oracle 2: the torch twin the CPU runtime uses (rotated domain, tiles of 1024 rows)
    assert (o - attention_quant(q.double(), kc, vc, p0, kv)).abs().max() <= TOL


def test_decode_rows_matches_reference():
    """The Triton tile decode equals kvquant's code x scale (fp32) rounded once to fp16."""
    from tightfit.kvquant.formats import get_format
    from tightfit.kvquant.reference import _tile_values
    g = torch.Generator().manual_seed(3)
    for name in ("q8_0", "tq4", "tq3", "tq2", "tq3_128"):
        fmt = get_format(name)
        D = 128
        rows = alloc_cache(9, 2, D, fmt)
        write_rows(rows, rows.clone(), 0, torch.randn(9, 2, D, generator=g),
                   torch.randn(9, 2, D, generator=g), name)
        out = torch.empty(9, 2, D, dtype=torch.float16, device=DEV)
        AF.decode_rows(rows.to(DEV), fmt, D, out)
        want = _tile_values(rows, fmt, D, torch.float32).half()
        assert torch.equal(out.cpu(), want), name


def test_workspace_independent_of_depth():
    a = AF.flash_workspace_bytes(24, 4, 256, 1024, 4096, "tq3")
    assert a == AF.flash_workspace_bytes(24, 4, 256, 1024, 130_000, "tq3")
    assert a["attn_tiles"] == 2 * AF.TILE_ROWS * 4 * 256 * 2
    assert AF.flash_workspace_bytes(24, 4, 256, 1024, 130_000) == {"attn_out": 1024 * 24 * 256 * 4}


def test_plan_constants_match_runtime():
    """The planner prices BatchForward with its own copies of these constants (it must not
    import torch): they cannot drift."""
    from tightfit.kernels import gdn_chunk as GC
    from tightfit.kernels.gemm_q import DEFAULT_SCRATCH
    from tightfit.model import batch as B
    from tightfit.plan import budget as PB
    assert PB.PREFILL_GEMM_SCRATCH == DEFAULT_SCRATCH
    assert PB.PREFILL_ATTN_TILE == AF.TILE_ROWS
    assert PB.GDN_PREFILL_CHUNK == GC.DEFAULT_CHUNK
    assert PB.RING_SLOT == B.RING_SLOT_BYTES and PB.RING_MIN_M == B.RING_MIN_M


def test_mode_selection(monkeypatch):
    monkeypatch.delenv("TIGHTFIT_PREFILL_ATTN", raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert AP.prefill_attn_mode(cuda, 0, None) == "sdpa"
    assert AP.prefill_attn_mode(cuda, 5, None) == "flash"
    assert AP.prefill_attn_mode(cuda, 0, "tq3") == "flash"
    assert AP.prefill_attn_mode(cpu, 5, None) == "sdpa"
    assert AP.prefill_attn_mode(cpu, 5, "tq3") == "quant_torch"
    monkeypatch.setenv("TIGHTFIT_PREFILL_ATTN", "sdpa")
    assert AP.prefill_attn_mode(cuda, 5, "q8_0") == "quant_torch"
    monkeypatch.setenv("TIGHTFIT_PREFILL_ATTN", "flash")
    assert AP.prefill_attn_mode(cuda, 0, None) == "flash"


def test_batch_forward_through_flash(monkeypatch, tmp_path):
    """BatchForward with the flash path forced (interpreted on the CPU): 3 chunks of a prompt
    (prefix path) on an f16 and a tq3 cache equal the torch paths."""
    import numpy as np
    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.model.generate import make_model
    p = tmp_path / "tiny.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=5)
    mf = open_model(p)
    try:
        prompt = np.random.default_rng(2).integers(0, mf.config.n_vocab, 12).tolist()
        for kv in (None, "tq3"):
            outs = []
            for mode in ("sdpa", "flash"):
                monkeypatch.setenv("TIGHTFIT_PREFILL_ATTN", mode)
                exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=32, prefill_chunk=5,
                                               use_triton=False, **({"kv_type": kv} if kv else {}))
                st = exe.new_state(32)
                outs.append(exe.forward(prompt, st, logits="last").double())
            err = (outs[0] - outs[1]).abs().max() / outs[0].abs().max()
            assert err < 2e-2, (kv, float(err))
    finally:
        mf.close()
