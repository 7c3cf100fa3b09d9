"""Fused row-wise elementwise kernels of the decode step: RMSNorm (with the residual add folded
in), SwiGLU and the gated RMSNorm of the Gated DeltaNet output (spec/qwen35.md §3.2, §3.4, §3.8).

Each kernel writes into a caller-given output (the executor preallocates every buffer so the
step can be captured as a CUDA graph) and has a torch reference `*_ref` beside it that computes
the same thing the slow way; tests compare the two on fresh random inputs (TRITON_INTERPRET=1
on CPU). The references are also the executor's CPU path.

* `add_rmsnorm(x, delta, w, eps, out)`: x += delta (in place, the residual stream), then
  out = x * rsqrt(mean(x^2) + eps) * w over the last axis. `delta=None` skips the add.
* `swiglu(g, u, out)`: out = silu(g) * u.
* `gated_rmsnorm(o, z, w, eps, out)`: per row of S (one V head): rmsnorm(o) * w * silu(z).

Sums of squares are fp32 (the reference accumulates in float64; for rows of <= 17408 values
the difference is ~1e-7 relative).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


# ---- RMSNorm with residual add ----------------------------------------------------------------
@triton.jit
def _add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, out_ptr, n, eps,
                        HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * n
    ss = tl.zeros([BLOCK], tl.float32)
    # pass 1: residual add (written back) and the sum of squares
    for s in range(0, n, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + base + offs, mask=m, other=0.0)
        if HAS_DELTA:
            x = x + tl.load(d_ptr + base + offs, mask=m, other=0.0)
            tl.store(x_ptr + base + offs, x, mask=m)
        ss += x * x
    r = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / n + eps)
    for s in range(0, n, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + base + offs, mask=m, other=0.0)
        w = tl.load(w_ptr + offs, mask=m, other=0.0)
        tl.store(out_ptr + base + offs, x * r * w, mask=m)


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float,
                out: torch.Tensor) -> torch.Tensor:
    """x [rows, n] fp32 (updated in place when delta is given), w [n] fp32 -> out [rows, n]."""
    n = x.shape[-1]
    rows = x.numel() // n
    # a 5120-wide row in ONE tile (8 warps, 32 floats per thread): each pass is one round trip
    # to memory instead of three (the H200 step profile measured 5.9 us per call with 2048-wide
    # tiles, 129 calls per token)
    BLOCK = min(8192, triton.next_power_of_2(n))
    _add_rmsnorm_kernel[(rows,)](x, delta if delta is not None else x, w, out, n, float(eps),
                                 HAS_DELTA=delta is not None, BLOCK=BLOCK,
                                 num_warps=8 if BLOCK >= 4096 else 4)
    return out


def add_rmsnorm_ref(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float,
                    out: torch.Tensor) -> torch.Tensor:
    if delta is not None:
        x.add_(delta)
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    out.copy_(x * torch.rsqrt(ms + eps).to(x.dtype) * w.to(x.dtype))
    return out


# ---- SwiGLU -------------------------------------------------------------------------------------
@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m, other=0.0)
    u = tl.load(u_ptr + offs, mask=m, other=0.0)
    tl.store(out_ptr + offs, g / (1.0 + tl.exp(-g)) * u, mask=m)


def swiglu(g: torch.Tensor, u: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    n = g.numel()
    BLOCK = 1024
    _swiglu_kernel[(triton.cdiv(n, BLOCK),)](g, u, out, n, BLOCK=BLOCK, num_warps=4)
    return out


def swiglu_ref(g: torch.Tensor, u: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    out.copy_(F.silu(g) * u)
    return out


# ---- gated RMSNorm (GDN output) -----------------------------------------------------------------
@triton.jit
def _gated_rmsnorm_kernel(o_ptr, z_ptr, w_ptr, out_ptr, S, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < S
    base = row.to(tl.int64) * S
    o = tl.load(o_ptr + base + offs, mask=m, other=0.0)
    z = tl.load(z_ptr + base + offs, mask=m, other=0.0)
    w = tl.load(w_ptr + offs, mask=m, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(o * o, axis=0) / S + eps)
    tl.store(out_ptr + base + offs, o * r * w * (z / (1.0 + tl.exp(-z))), mask=m)


def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float,
                  out: torch.Tensor) -> torch.Tensor:
    """o, z [..., S] fp32 (rows = heads), w [S] -> out = rmsnorm(o) * w * silu(z)."""
    S = o.shape[-1]
    rows = o.numel() // S
    _gated_rmsnorm_kernel[(rows,)](o, z, w, out, S, float(eps),
                                   BLOCK=triton.next_power_of_2(S), num_warps=1)
    return out


def gated_rmsnorm_ref(o: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float,
                      out: torch.Tensor) -> torch.Tensor:
    ms = o.to(torch.float64).pow(2).mean(-1, keepdim=True)
    out.copy_(o * torch.rsqrt(ms + eps).to(o.dtype) * w * F.silu(z))
    return out


# ---- finiteness check + bank commit (the step's last kernel) ------------------------------------
@triton.jit
def _commit_kernel(a_ptr, na, b_ptr, nb, status_ptr, n_tok, BLOCK: tl.constexpr):
    """One program: scans a[na] and b[nb] for NaN/Inf; if all finite (and no earlier step failed),
    flips the active bank and advances the device position by n_tok; otherwise sets the sticky
    non-finite flag, which the host reads lazily (GPUState.sync) and clears."""
    bad = tl.zeros([BLOCK], tl.int32)
    for s in range(0, na, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        v = tl.load(a_ptr + offs, mask=offs < na, other=0.0)
        bad += (tl.abs(v) == float("inf")).to(tl.int32) | (v != v).to(tl.int32)
    for s in range(0, nb, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        v = tl.load(b_ptr + offs, mask=offs < nb, other=0.0)
        bad += (tl.abs(v) == float("inf")).to(tl.int32) | (v != v).to(tl.int32)
    nbad = tl.sum(bad, axis=0)
    active = tl.load(status_ptr + 0)
    pos = tl.load(status_ptr + 2)
    flag = tl.load(status_ptr + 1)
    ok = (nbad == 0) & (flag == 0)          # the flag is sticky: after a failure nothing commits
    tl.store(status_ptr + 0, tl.where(ok, 1 - active, active))
    tl.store(status_ptr + 2, tl.where(ok, pos + n_tok, pos))
    tl.store(status_ptr + 1, tl.where(ok, flag, 1))


def commit(a: torch.Tensor, b: torch.Tensor, status: torch.Tensor, n_tok: int = 1) -> None:
    """status int32 [4] = (active bank, non-finite flag, device pos, spare)."""
    _commit_kernel[(1,)](a, a.numel(), b, b.numel(), status, n_tok, BLOCK=4096, num_warps=8)


def commit_ref(a: torch.Tensor, b: torch.Tensor, status: torch.Tensor, n_tok: int = 1) -> None:
    ok = bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()) and int(status[1]) == 0
    if ok:
        status[0] = 1 - status[0]
        status[2] += n_tok
    else:
        status[1] = 1
