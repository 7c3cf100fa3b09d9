"""GEMV on tightfit's repacked base-3 ternary blocks (T3, tightfit/tools/repack.py), read as stored.

    y[r] = sum over blocks b of row r:  d_b * sum_e (t_e - 1) * x[b*G + e]

Block of G elements: F = G//5 full bytes (byte m holds elements m + F*n, n = 0..4, first most
significant), one tail byte with R = G%5 trits when R > 0, then the fp16 scale d. Trit n of a
byte b is (((b*3^n) mod 256)*3) >> 8: the kernel keeps p = b*3^n mod 256 and steps p <- 3p mod 256,
so each trit costs a multiply, a mask and a shift; one trit plane is F consecutive bytes matching
F consecutive activations (coalesced loads, no gather).

Activations stay float32 (the ternary weights make the products exact; only the sums round).
`gemv_t3_ref` is the slow reference: NumPy dequantization of the blocks, float64 matmul.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from tightfit.tools.repack import T3_TYPES, dequantize_t3


@triton.jit
def _gemv_t3_kernel(w_ptr, x_ptr, y_ptr, n_rows, n_blocks, row_bytes,
                    G: tl.constexpr, F: tl.constexpr, R: tl.constexpr, TS: tl.constexpr,
                    FP: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n_rows
    m = tl.arange(0, FP)
    mmask = m < F
    row_base = w_ptr + rows.to(tl.int64) * row_bytes
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for kb in range(n_blocks):
        blk = row_base + kb * TS
        p = tl.load(blk[:, None] + m[None, :], mask=rmask[:, None] & mmask[None, :], other=0).to(tl.int32)
        part = tl.zeros([BLOCK_R], dtype=tl.float32)
        for n in tl.static_range(5):
            t = (p * 3) >> 8                                      # trit n, 0..2
            xv = tl.load(x_ptr + kb * G + n * F + m, mask=mmask, other=0.0)
            part += tl.sum((t - 1).to(tl.float32) * xv[None, :], axis=1)
            p = (p * 3) & 255
        if R > 0:
            q = tl.load(blk + F, mask=rmask, other=0).to(tl.int32)
            for n in tl.static_range(R):
                t = (q * 3) >> 8
                xv = tl.load(x_ptr + kb * G + 5 * F + n)
                part += (t - 1).to(tl.float32) * xv
                q = (q * 3) & 255
        lo = tl.load(blk + (TS - 2), mask=rmask, other=0).to(tl.int32)
        hi = tl.load(blk + (TS - 1), mask=rmask, other=0).to(tl.int32)
        d = (lo | (hi << 8)).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        acc += part * d
    tl.store(y_ptr + rows, acc, mask=rmask)


def gemv_t3(w: torch.Tensor, type_id: int, x: torch.Tensor, block_r: int = 16) -> torch.Tensor:
    """y = W x for a T3 matrix `w` (uint8, [n_rows, row_bytes], the tensor's stored bytes) and a
    float32 vector `x` [n_cols]. Returns float32 [n_rows]."""
    t = T3_TYPES[int(type_id)]
    if w.dtype != torch.uint8 or w.dim() != 2:
        raise ValueError("gemv_t3: w must be a 2-D uint8 tensor of raw T3 rows")
    n_rows, row_bytes = w.shape
    if row_bytes % t.type_size:
        raise ValueError(f"gemv_t3: row of {row_bytes} bytes is not whole {t.name} blocks")
    n_blocks = row_bytes // t.type_size
    if x.numel() != n_blocks * t.block_size:
        raise ValueError(f"gemv_t3: x has {x.numel()} elements, rows hold {n_blocks * t.block_size}")
    x = x.reshape(-1).to(torch.float32).contiguous()
    w = w.contiguous()
    y = torch.empty(n_rows, dtype=torch.float32, device=w.device)
    grid = (triton.cdiv(n_rows, block_r),)
    _gemv_t3_kernel[grid](w, x, y, n_rows, n_blocks, row_bytes, G=t.block_size, F=t.n_full,
                          R=t.n_tail, TS=t.type_size, FP=triton.next_power_of_2(t.n_full),
                          BLOCK_R=block_r)
    return y


def gemv_t3_ref(w_raw: np.ndarray, type_id: int, x: np.ndarray) -> np.ndarray:
    """Reference: dequantize every block (NumPy), float64 matmul, float32 result."""
    w_raw = np.asarray(w_raw, dtype=np.uint8)
    n_rows = w_raw.shape[0]
    wf = dequantize_t3(w_raw, type_id).reshape(n_rows, -1).astype(np.float64)
    return (wf @ np.asarray(x, dtype=np.float64).reshape(-1)).astype(np.float32)
