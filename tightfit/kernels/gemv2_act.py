"""Activation operand of GEMV v2: x[N, K] -> int8 per 32, laid out as the B operand of the
int8 tensor-core dot, so the GEMV loads it as one dense contiguous tile per K step.

Quantization (as v1 / llama.cpp q8_1): per 32 consecutive elements d = amax/127,
q = round-half-away(x/d), clipped to ±127.

The GEMV multiplies a decoded weight tile A[r, k] (int8) by B[k, col] per *slice* of KDOT
elements. Weight scales differ per group of S = 16 or 32 elements, so B is block-diagonal: a
slice holds GPD groups, column col = gi*NP + n carries column n of x restricted to group gi of
the slice (zeros elsewhere). One dot then yields, for GPD groups at once, the per-group integer
sums P[r, gi, n] that the epilogue scales by (weight scale of group) x (x scale of group).
GPD is chosen so GPD*NP ~ 16 columns: at small N one dot covers several groups, which keeps
the per-(row, column, group) scaling work ~ constant per weight whatever N is.

Buffers per 256-element macro-block kb (nkb = K/256):
  b    int8  [nkb, 256/KDOT, COLS, KDOT]  B^T of each slice (K contiguous, as the tensor cores
                                read it); position p = slice*KDOT + k inside the macro-block,
                                in the weight decode order (PERM: 0 natural; 1 IQ4 lookup order)
  xs   fp32  [nkb, 256/S, NP]   x scale of each weight group (0 for padded columns)
  xsum fp32  [nkb, 8, NP]       d * sum(q) per 32 (for the Q4_K/Q5_K min term)
  q    int8  [N, K]             the int8 activations, each 32 in the decode order (PERM), as the
                                dp4a small-N path (gemv2_small) reads them as words
`with_b=False` skips b (the small-N path does not read it).
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import pdl


def geometry(S: int, n: int) -> dict:
    """NP (columns padded to a power of two), GPD (groups per dot), KDOT, COLS."""
    if not 1 <= n <= 16:
        raise ValueError(f"gemv v2: N={n} columns, 1..16 supported")
    NP = triton.next_power_of_2(n)
    GPD = max(32 // S, min(256 // S, 16 // NP))
    return {"NP": NP, "GPD": GPD, "KDOT": GPD * S, "COLS": GPD * NP, "S": S}


def perm_table(perm: int) -> np.ndarray:
    """position (0..31) inside a 32-group -> element. 1: IQ4 lookup order, decoded word 2i+h of
    a sub-block holds (lo, hi, lo, hi) nibbles of bytes 2h, 2h+1 of qs word i. 2: the same
    lookup words, those of bytes 0, 1 of every qs word first (word i), then bytes 2, 3 (4 + i)
    (the dp4a small-N path reads each half as one 16-byte vector)."""
    r = np.arange(32)
    if perm == 0:
        return r
    w, k = r // 4, r % 4
    if perm == 2:
        return 4 * (w % 4) + 2 * (w // 4) + k // 2 + 16 * (k % 2)
    return 4 * (w // 2) + 2 * (w % 2) + k // 2 + 16 * (k % 2)


@triton.jit
def _perm(r, PERM: tl.constexpr):
    if PERM == 0:
        return r
    elif PERM == 2:
        w = r // 4
        k = r % 4
        return 4 * (w % 4) + 2 * (w // 4) + k // 2 + 16 * (k % 2)
    else:
        w = r // 4
        k = r % 4
        return 4 * (w // 2) + 2 * (w % 2) + k // 2 + 16 * (k % 2)


@triton.jit
def _iperm(e, PERM: tl.constexpr):
    """Inverse of _perm: element (0..31) -> its position in the decode order."""
    if PERM == 0:
        return e
    elif PERM == 2:
        ep = e % 16
        return 4 * (4 * ((ep % 4) // 2) + ep // 4) + 2 * (ep % 2) + e // 16
    else:
        ep = e % 16
        return 4 * (2 * (ep // 4) + (ep % 4) // 2) + 2 * (ep % 2) + e // 16


@triton.jit
def _prep_kernel(x_ptr, q_ptr, b_ptr, xs_ptr, xsum_ptr, N, K,
                 NP: tl.constexpr, S: tl.constexpr, GPD: tl.constexpr, KDOT: tl.constexpr,
                 PERM: tl.constexpr, WITHB: tl.constexpr, PDL: tl.constexpr = False):
    kb = tl.program_id(0)
    if PDL:      # K/256 programs: one wave
        gdc_wait()
        gdc_launch_dependents()
    COLS: tl.constexpr = GPD * NP
    # phase 1: quantize the macro-block for all columns, write q (decode order) to q_ptr
    n3 = tl.arange(0, NP)[:, None, None]
    j3 = tl.arange(0, 8)[None, :, None]
    e3 = tl.arange(0, 32)[None, None, :]
    off3 = n3 * K + kb * 256 + j3 * 32 + e3
    x = tl.load(x_ptr + off3, mask=n3 < N, other=0.0).to(tl.float32)
    qoff3 = n3 * K + kb * 256 + j3 * 32 + _iperm(e3, PERM)
    amax = tl.max(tl.abs(x), axis=2)                              # [NP, 8]
    d = amax / 127.0
    inv = tl.where(amax > 0, 127.0 / tl.where(amax > 0, amax, 1.0), 0.0)
    v = x * inv[:, :, None]
    q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(-v + 0.5))
    q = tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int32)
    tl.store(q_ptr + qoff3, q.to(tl.int8), mask=n3 < N)
    s32 = tl.sum(q, axis=2).to(tl.float32)                        # [NP, 8]
    n2 = tl.arange(0, NP)[:, None]
    j2 = tl.arange(0, 8)[None, :]
    tl.store(xsum_ptr + kb * 8 * NP + j2 * NP + n2, d * s32)
    if S == 32:
        tl.store(xs_ptr + kb * 8 * NP + j2 * NP + n2, d)
    else:
        tl.store(xs_ptr + kb * 16 * NP + (2 * j2) * NP + n2, d)
        tl.store(xs_ptr + kb * 16 * NP + (2 * j2 + 1) * NP + n2, d)
    if WITHB:
        tl.debug_barrier()    # phase 2 reads q written by other threads of this program
        # phase 2: block-diagonal B rows of this macro-block (q is already in decode order p)
        p = tl.arange(0, 256)[:, None]
        col = tl.arange(0, COLS)[None, :]
        gi = col // NP
        n = col % NP
        elem = 32 * (p // 32) + _perm(p % 32, PERM)
        cond = ((elem // S) == (p // KDOT) * GPD + gi) & (n < N)
        val = tl.load(q_ptr + n * K + kb * 256 + p, mask=cond, other=0)
        tl.store(b_ptr + kb * 256 * COLS + (p // KDOT) * (KDOT * COLS) + col * KDOT + p % KDOT,
                 val)


class Act2:
    """Prepared activations for GEMV v2 (see module docstring)."""
    __slots__ = ("b", "xs", "xsum", "q", "n", "k", "geo", "perm")

    @property
    def has_b(self) -> bool:
        return self.b.numel() > 1     # a 1-byte placeholder when prepared without b

    def __init__(self, b, xs, xsum, q, n, k, geo, perm):
        self.b, self.xs, self.xsum, self.q = b, xs, xsum, q
        self.n, self.k, self.geo, self.perm = n, k, geo, perm

    def fits(self, S: int, perm: int) -> bool:
        return self.geo["S"] == S and self.perm == perm


def prep_act2(x: torch.Tensor, S: int, perm: int, out: Act2 | None = None,
              with_b: bool = True) -> Act2:
    """Quantize x [N, K] (K a multiple of 256, N <= 16) into the B operand for scale-group size
    S and decode order perm (`with_b=False`: q, xs, xsum only, for the dp4a small-N path)."""
    if x.dim() == 1:
        x = x[None, :]
    x = x.contiguous()
    n, k = x.shape
    if k % 256:
        raise ValueError(f"gemv v2: K={k} is not a multiple of 256")
    geo = geometry(S, n)
    nkb = k // 256
    NP, COLS = geo["NP"], geo["COLS"]
    if (out is None or out.n != n or out.k != k or not out.fits(S, perm)
            or (with_b and not out.has_b)):
        dev = x.device
        bshape = (nkb, 256 // geo["KDOT"], COLS, geo["KDOT"]) if with_b else (1,)
        out = Act2(torch.empty(bshape, dtype=torch.int8, device=dev),
                   torch.empty((nkb, 256 // S, NP), dtype=torch.float32, device=dev),
                   torch.empty((nkb, 8, NP), dtype=torch.float32, device=dev),
                   torch.empty((n, k), dtype=torch.int8, device=dev), n, k, geo, perm)
    on = pdl.enabled(x.device)
    _prep_kernel[(nkb,)](x, out.q, out.b, out.xs, out.xsum, n, k,
                         NP=NP, S=S, GPD=geo["GPD"], KDOT=geo["KDOT"], PERM=perm,
                         WITHB=bool(with_b), PDL=on, launch_pdl=on, num_warps=4)
    return out


def prep_act2_ref(x: np.ndarray, S: int, perm: int):
    """NumPy reference of prep_act2 (b, xs, xsum), built from the v1 quantizer reference."""
    from tightfit.kernels.quantize_act import quantize_act_ref
    x = np.asarray(x, np.float32)
    n, k = x.shape
    geo = geometry(S, n)
    NP, GPD, KDOT, COLS = geo["NP"], geo["GPD"], geo["KDOT"], geo["COLS"]
    q, d, _ = quantize_act_ref(x)
    q = q.reshape(n, k)                                # q [n, k], d [n, k/32]
    nkb = k // 256
    qp = np.zeros((NP, k)); qp[:n] = q
    dp = np.zeros((NP, k // 32)); dp[:n] = d
    pt = perm_table(perm)
    b = np.zeros((nkb, 256, COLS), np.int8)
    for p in range(256):
        elem = 32 * (p // 32) + pt[p % 32]
        for col in range(COLS):
            gi, nn = divmod(col, NP)
            if elem // S == (p // KDOT) * GPD + gi and nn < n:
                b[:, p, col] = qp[nn, elem::256][:nkb]
    b = b.reshape(nkb, 256 // KDOT, KDOT, COLS).transpose(0, 1, 3, 2).copy()
    xs = np.repeat(dp.T.reshape(nkb, 8, NP), 32 // S, axis=1)
    s32 = qp.reshape(NP, nkb, 8, 32).sum(axis=3)
    xsum = (dp.reshape(NP, nkb, 8) * s32).transpose(1, 2, 0)
    return b, xs, xsum
