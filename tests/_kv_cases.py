"""A quantized-KV attention case shared by the kernel tests (CUDA emulator, Triton extras, PDL):
random K/V with outlier channels (as real K has), written into the byte caches in two slices (so
a write at a nonzero position is covered), rows past T poisoned, and the float64 oracle over the
SAME quantized bytes (kvquant.reference.attention_quant_f64)."""
from __future__ import annotations

import torch

from tightfit.kvquant.formats import split_kv_type
from tightfit.kvquant.reference import alloc_cache, attention_quant_f64, write_rows

TOL = 2e-3      # of max |out|: ~4 fp16 unit roundoffs (tests/test_kvquant_kernel.py says why)


def quant_kv_case(kv_type: str, H: int, Hkv: int, D: int, T: int, seed: int):
    """(q [H, D], kcache, vcache [T + 3, Hkv, row bytes], qg [H, 2D], float64 reference out) on
    the CPU."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, Hkv, D, generator=g)
    v = torch.randn(T, Hkv, D, generator=g)
    k[..., 3] = k[..., 3] * 15 + 8
    v[..., 5] *= 6
    q = torch.randn(H, D, generator=g) * 0.5
    qg = torch.randn(H, 2 * D, generator=g)
    kn, vn = split_kv_type(kv_type)
    kc, vc = alloc_cache(T + 3, Hkv, D, kn), alloc_cache(T + 3, Hkv, D, vn)
    write_rows(kc, vc, 0, k[: T // 2], v[: T // 2], kv_type)
    write_rows(kc, vc, T // 2, k[T // 2:], v[T // 2:], kv_type)
    kc[T:] = 255                                  # rows past T are never read
    vc[T:] = 255
    ref = attention_quant_f64(q, kc, vc, T, kv_type, gate=qg[:, D:])
    return q, kc, vc, qg, ref


def check_close(out: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> float:
    """Max |out - ref| within tol of max |ref|; returns the relative error."""
    out = out.double().cpu()
    err = (out - ref).abs().max().item()
    assert err <= tol * ref.abs().max().item(), f"max err {err:.3e} vs {ref.abs().max().item():.3e}"
    return err / ref.abs().max().item()
