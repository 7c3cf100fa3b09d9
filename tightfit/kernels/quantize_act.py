"""Activation quantization for the dp4a GEMV: x[N, K] float -> int8 per 32 with one fp32 scale.

Per 32 consecutive elements: d = amax/127, q = round(x/d) (half away from zero), as llama.cpp's
q8_1 does. Besides q and d we keep the integer sums of q over each 16 elements: formats whose
stored codes carry an offset or a min (Q4_0 -8, Q6_K -32, Q4_K/Q2_K mins, ...) take it out
through these sums instead of subtracting per byte.

`layout` reorders the 32 int8 values of each block so that a format's cheapest decoded words
line up with consecutive activation words (LAYOUTS below, position -> element). Sums are
always over natural 16-element groups.

Error: each activation carries at most d/2 = amax/254 rounding error, so a dot product over
weights w gets |err| <= sum|w| * amax/254 per block; with random data the relative error of a
row is about 0.3-0.5 %, and test bounds of 2 % leave room for unlucky rows.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import pdl


def _layouts() -> np.ndarray:
    p = np.arange(32)
    lay = np.zeros((4, 32), np.int32)
    lay[0] = p
    # 1: IQ4 nibble pairs: activation word 2i+h, byte k = element 4i+2h+(k//2)+16*(k%2)
    w, k = p // 4, p % 4
    lay[1] = 4 * (w // 2) + 2 * (w % 2) + k // 2 + 16 * (k % 2)
    # 2: Q2_0 crumb planes, a 4x4 transpose inside each 16: position 4g+k = element 4k+g
    q = p % 16
    lay[2] = (p // 16) * 16 + 4 * (q % 4) + q // 4
    # 3: Q1_0 bit planes, a 8x4 transpose inside each 32: position 4b+k = element 8k+b
    lay[3] = 8 * (p % 4) + p // 4
    return lay


LAYOUTS = _layouts()


@lru_cache(maxsize=None)
def _inv_layouts(device: str) -> torch.Tensor:
    inv = np.argsort(LAYOUTS, axis=1).astype(np.int32)   # element -> position
    return torch.from_numpy(inv).to(device)


@triton.jit
def _quant_kernel(x_ptr, q_ptr, d_ptr, s_ptr, inv_ptr, K, NBLK,
                  LAYOUT: tl.constexpr, BLK: tl.constexpr, PDL: tl.constexpr = False):
    n = tl.program_id(0)
    b = tl.program_id(1) * BLK + tl.arange(0, BLK)
    bm = b < NBLK
    e = tl.arange(0, 32)
    offs = b[:, None] * 32 + e[None, :]
    if PDL:      # N x K/1024 programs: one wave at decode (N = 1)
        gdc_wait()
        gdc_launch_dependents()
    x = tl.load(x_ptr + n * K + offs, mask=bm[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    d = amax / 127.0
    inv_d = tl.where(amax > 0, 127.0 / amax, 0.0)
    v = x * inv_d[:, None]
    q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(-v + 0.5))
    q = tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int32)
    pos = tl.load(inv_ptr + LAYOUT * 32 + e)
    tl.store(q_ptr + n * K + b[:, None] * 32 + pos[None, :], q.to(tl.int8), mask=bm[:, None])
    tl.store(d_ptr + n * NBLK + b, d, mask=bm)
    s = tl.sum(tl.reshape(q, (BLK, 2, 16)), axis=2)
    tl.store(s_ptr + n * NBLK * 2 + b[:, None] * 2 + tl.arange(0, 2)[None, :], s,
             mask=bm[:, None])


class QuantAct:
    """Quantized activations: q int8 [N, K] (layout order), d fp32 [N, K/32], s16 int32 [N, K/16]."""
    __slots__ = ("q", "d", "s16", "layout", "n", "k")

    def __init__(self, q, d, s16, layout, n, k):
        self.q, self.d, self.s16, self.layout, self.n, self.k = q, d, s16, layout, n, k


def quantize_act(x: torch.Tensor, layout: int = 0, out: QuantAct | None = None) -> QuantAct:
    """Quantize x [N, K] (K a multiple of 32) per 32 elements; see the module docstring."""
    x = x.contiguous()
    n, k = x.shape
    if k % 32:
        raise ValueError(f"activation length {k} is not a multiple of 32")
    nblk = k // 32
    if out is None:
        out = QuantAct(torch.empty((n, k), dtype=torch.int8, device=x.device),
                       torch.empty((n, nblk), dtype=torch.float32, device=x.device),
                       torch.empty((n, 2 * nblk), dtype=torch.int32, device=x.device),
                       layout, n, k)
    out.layout = layout
    BLK = 32
    on = pdl.enabled(x.device)
    _quant_kernel[(n, triton.cdiv(nblk, BLK))](x, out.q, out.d, out.s16,
                                                _inv_layouts(str(x.device)), k, nblk,
                                                LAYOUT=layout, BLK=BLK, PDL=on, launch_pdl=on)
    return out


def quantize_act_ref(x: np.ndarray, layout: int = 0):
    """NumPy reference of quantize_act (natural-order q, d, s16), for tests."""
    x = np.asarray(x, np.float64).reshape(x.shape[0], -1, 32)
    amax = np.abs(x).max(axis=2)
    d = amax / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(amax[..., None] > 0, x / d[..., None], 0.0)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -127, 127)
    s16 = q.reshape(q.shape[0], -1, 16).sum(axis=2)
    return q, d, s16
