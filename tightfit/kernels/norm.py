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

Fused activation quantization (`quant_out=(q, d, s16)`, `quant_layout=`): each of the three
kernels can also write its output quantized for the dp4a GEMV exactly as
tightfit.kernels.quantize_act.quantize_act would from the float output it stores (int8 per 32
with d = amax/127, q = round half away from zero of y/d, s16 = sums of q per 16, q in the
layout's order), saving the separate quantize launch per GEMV input. The float output is still
written. The quantized view covers the output flattened per row ([rows, n] -> q [rows, n], d
[rows, n/32], s16 [rows, n/16]); n (for gated_rmsnorm S) must be a multiple of 32. The
references (`*_ref(..., quant_out=)`) are the unfused pair: the plain op, then quantize_act.

PDL (tightfit.kernels.pdl, TIGHTFIT_PDL=1): every kernel here takes `PDL: tl.constexpr`; with it
the kernel waits (griddepcontrol.wait) before its first load and, its grid being one wave at the
decode shapes (1 row, 17 or 48 programs), lets the next kernel launch right after the wait.

Packed output (`quant_layout=PACK_LAYOUT`, `quant_out=(pk,)`, pk bf16 of the output's size):
instead of int8, the output rounded to bf16 in pairs (x[i], x[i + 16]) per 32-block, the operand
of gemv_mmh's kind "foldp" (gemv_mmh.xpack is its reference).

Sums of squares are fp32 (the reference accumulates in float64; for rows of <= 17408 values
the difference is ~1e-7 relative).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import pdl


# ---- fused quantization of an output tile (quantize_act's arithmetic, op for op) ---------------
@triton.jit
def _quant_tile(y, b, bm, q_ptr, qd_ptr, qs_ptr, inv_ptr, LAYOUT: tl.constexpr):
    """y [R, 32] fp32: the elements of global 32-blocks b (rows where bm is False are skipped).
    Writes q (layout order), d and the two 16-sums per block like quantize_act._quant_kernel;
    with LAYOUT = PACK_LAYOUT (300) the bf16 pairs instead (q_ptr: the buffer as int16)."""
    e = tl.arange(0, 32)
    if LAYOUT == 300:      # bf16 pairs (x[i], x[i + 16]) per 32-block, no int8
        # round to nearest even by hand: Triton's interpreter truncates in .to(tl.bfloat16), and
        # the CPU tests must see the device's rounding
        u = y.to(tl.uint32, bitcast=True)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(tl.int32)
        # pair p = (element p, element p + 16) as one 32-bit word, words stored contiguously: the
        # element-wise 2-byte stores to permuted slots made the norm 5.0 -> 8.6 us (session 18)
        R: tl.constexpr = y.shape[0]
        lo, hi = tl.split(tl.permute(tl.reshape(r, (R, 2, 16)), (0, 2, 1)))
        w = (lo & 0xFFFF) | (hi << 16)
        p = tl.arange(0, 16)
        tl.store(q_ptr.to(tl.pointer_type(tl.int32)) + b[:, None] * 16 + p[None, :], w,
                 mask=bm[:, None])
    else:
        amax = tl.max(tl.abs(y), axis=1)
        d = amax / 127.0
        inv_d = tl.where(amax > 0, 127.0 / amax, 0.0)
        v = y * inv_d[:, None]
        q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(-v + 0.5))
        q = tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int32)
        if LAYOUT == 0:
            pos = e
        else:
            pos = tl.load(inv_ptr + LAYOUT * 32 + e)
        tl.store(q_ptr + b[:, None] * 32 + pos[None, :], q.to(tl.int8), mask=bm[:, None])
        tl.store(qd_ptr + b, d, mask=bm)
        lo = tl.sum(tl.where(e[None, :] < 16, q, 0), axis=1)
        hi = tl.sum(tl.where(e[None, :] >= 16, q, 0), axis=1)
        tl.store(qs_ptr + b * 2, lo, mask=bm)
        tl.store(qs_ptr + b * 2 + 1, hi, mask=bm)


PACK_LAYOUT = 300   # quant_out=(pk,): x as bf16 pairs for gemv_mmh kind "foldp" (its xpack)


def _quant_args(quant_out, quant_layout: int, out: torch.Tensor, k: int):
    """Kernel arguments (q, d, s16, inv table, QUANT, LAYOUT) for an optional quant_out."""
    if quant_out is None:
        return out, out, out, out, False, 0
    from tightfit.kernels.quantize_act import LAYOUTS, _inv_layouts
    lay = int(quant_layout)
    if lay == PACK_LAYOUT:
        pk = quant_out[0]
        if k % 32:
            raise ValueError(f"quant_out: rows of {k} values are not whole 32-blocks")
        if pk.dtype != torch.bfloat16 or pk.numel() != out.numel() or not pk.is_contiguous():
            raise ValueError("quant_out (packed): a contiguous bf16 buffer of the output's size")
        return pk.view(torch.int16), out, out, out, True, lay
    q, qd, qs = quant_out
    if not 0 <= lay < len(LAYOUTS):
        raise ValueError(f"quant_out: unknown activation layout {quant_layout}")
    if k % 32:
        raise ValueError(f"quant_out: rows of {k} values are not whole 32-blocks")
    nq = out.numel()
    if q.numel() != nq or qd.numel() != nq // 32 or qs.numel() != nq // 16 \
            or q.dtype != torch.int8 or qd.dtype != torch.float32 or qs.dtype != torch.int32:
        raise ValueError("quant_out: (q int8, d fp32, s16 int32) do not match the output")
    if not (q.is_contiguous() and qd.is_contiguous() and qs.is_contiguous()):
        raise ValueError("quant_out buffers must be contiguous")
    return q, qd, qs, _inv_layouts(str(out.device)), True, lay


def _quant_ref(out: torch.Tensor, quant_out, quant_layout: int, k: int) -> None:
    """The unfused second half: quantize_act of the float output into quant_out."""
    if quant_out is None:
        return
    if int(quant_layout) == PACK_LAYOUT:   # gemv_mmh.xpack's layout, as bf16 halves
        from tightfit.kernels.gemv_mmh import xpack
        rows = out.numel() // k
        quant_out[0].view(torch.int32).view(-1).copy_(xpack(out.reshape(rows, k).float()).view(-1))
        return
    from tightfit.kernels.quantize_act import QuantAct, quantize_act
    q, qd, qs = quant_out
    rows = out.numel() // k
    qa = QuantAct(q.view(rows, k), qd.view(rows, k // 32), qs.view(rows, k // 16),
                  int(quant_layout), rows, k)
    quantize_act(out.reshape(rows, k), int(quant_layout), out=qa)


# ---- RMSNorm with residual add ----------------------------------------------------------------
@triton.jit
def _add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, out_ptr, q_ptr, qd_ptr, qs_ptr, inv_ptr, pk_ptr, n,
                        eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, QUANT: tl.constexpr,
                        LAYOUT: tl.constexpr, PACK: tl.constexpr = False,
                        PDL: tl.constexpr = False):
    row = tl.program_id(0)
    if PDL:          # x / delta come from the previous kernels
        gdc_wait()
        gdc_launch_dependents()
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
    if QUANT:
        # pass 2 on [BLOCK/32, 32] tiles: the float output and its int8 quantization
        nblk = n // 32
        e = tl.arange(0, 32)
        for s in range(0, n, BLOCK):
            lb = s // 32 + tl.arange(0, BLOCK // 32)
            bm = lb < nblk
            offs = lb[:, None] * 32 + e[None, :]
            x = tl.load(x_ptr + base + offs, mask=bm[:, None], other=0.0)
            w = tl.load(w_ptr + offs, mask=bm[:, None], other=0.0)
            y = x * r * w
            tl.store(out_ptr + base + offs, y, mask=bm[:, None])
            _quant_tile(y, row * nblk + lb, bm, q_ptr, qd_ptr, qs_ptr, inv_ptr, LAYOUT)
            if PACK:     # pack_out: the bf16 pairs too, beside the int8 copy
                _quant_tile(y, row * nblk + lb, bm, pk_ptr, qd_ptr, qs_ptr, inv_ptr, 300)
    else:
        for s in range(0, n, BLOCK):
            offs = s + tl.arange(0, BLOCK)
            m = offs < n
            x = tl.load(x_ptr + base + offs, mask=m, other=0.0)
            w = tl.load(w_ptr + offs, mask=m, other=0.0)
            tl.store(out_ptr + base + offs, x * r * w, mask=m)


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float,
                out: torch.Tensor, quant_out=None, quant_layout: int = 0,
                pack_out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, n] fp32 (updated in place when delta is given), w [n] fp32 -> out [rows, n];
    with quant_out=(q, d, s16) also out quantized as quantize_act(out, quant_layout) would; with
    pack_out (bf16 of out's size) also out as bf16 pairs (PACK_LAYOUT's), alone or beside q."""
    n = x.shape[-1]
    rows = x.numel() // n
    if pack_out is not None and quant_out is None:
        quant_out, quant_layout, pack_out = (pack_out,), PACK_LAYOUT, None
    q, qd, qs, inv, quant, lay = _quant_args(quant_out, quant_layout, out, n)
    pk = out
    if pack_out is not None:
        pk = _quant_args((pack_out,), PACK_LAYOUT, out, n)[0]
    # a 5120-wide row in ONE tile (8 warps, 32 floats per thread): each pass is one round trip
    # to memory instead of three (the H200 step profile measured 5.9 us per call with 2048-wide
    # tiles, 129 calls per token)
    BLOCK = min(8192, triton.next_power_of_2(n))
    on = pdl.enabled(x.device)
    _add_rmsnorm_kernel[(rows,)](x, delta if delta is not None else x, w, out, q, qd, qs, inv,
                                 pk, n, float(eps), HAS_DELTA=delta is not None, BLOCK=BLOCK,
                                 QUANT=quant, LAYOUT=lay, PACK=pack_out is not None, PDL=on,
                                 launch_pdl=on,
                                 num_warps=8 if BLOCK >= 4096 else 4)
    return out


def add_rmsnorm_ref(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float,
                    out: torch.Tensor, quant_out=None, quant_layout: int = 0,
                    pack_out: torch.Tensor | None = None) -> torch.Tensor:
    if delta is not None:
        x.add_(delta)
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    out.copy_(x * torch.rsqrt(ms + eps).to(x.dtype) * w.to(x.dtype))
    _quant_ref(out, quant_out, quant_layout, x.shape[-1])
    if pack_out is not None:
        _quant_ref(out, (pack_out,), PACK_LAYOUT, x.shape[-1])
    return out


# ---- SwiGLU -------------------------------------------------------------------------------------
@triton.jit
def _swiglu_in(offs, W, gs, STRIDED: tl.constexpr):
    """Offset in g / u of flat output index offs: the same, or (row, column) of rows of W values
    at a row stride of gs (g and u as the column halves of one merged product's rows)."""
    if STRIDED:
        r = offs // W
        return r * gs + (offs - r * W)
    return offs


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, out_ptr, q_ptr, qd_ptr, qs_ptr, inv_ptr, n, W, gs,
                   BLOCK: tl.constexpr, QUANT: tl.constexpr, LAYOUT: tl.constexpr,
                   STRIDED: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    if QUANT:
        # [BLOCK/32, 32] tiles of whole 32-blocks: the float output and its quantization
        b = tl.program_id(0) * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
        bm = b < n // 32
        offs = b[:, None] * 32 + tl.arange(0, 32)[None, :]
        io = _swiglu_in(offs, W, gs, STRIDED)
        g = tl.load(g_ptr + io, mask=bm[:, None], other=0.0)
        u = tl.load(u_ptr + io, mask=bm[:, None], other=0.0)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + offs, y, mask=bm[:, None])
        _quant_tile(y, b, bm, q_ptr, qd_ptr, qs_ptr, inv_ptr, LAYOUT)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        io = _swiglu_in(offs, W, gs, STRIDED)
        g = tl.load(g_ptr + io, mask=m, other=0.0)
        u = tl.load(u_ptr + io, mask=m, other=0.0)
        tl.store(out_ptr + offs, g / (1.0 + tl.exp(-g)) * u, mask=m)


def swiglu(g: torch.Tensor, u: torch.Tensor, out: torch.Tensor, quant_out=None,
           quant_layout: int = 0) -> torch.Tensor:
    """out = silu(g) * u (out contiguous); with quant_out=(q, d, s16) also out quantized as
    quantize_act(out, quant_layout) would, over out's last axis. g and u are contiguous, or
    [rows, W] views with unit columns and one row stride (the halves of a merged gate + up
    product's [rows, 2W] output)."""
    n = out.numel()
    BLOCK = 1024
    W = out.shape[-1]
    strided = not (g.is_contiguous() and u.is_contiguous())
    if g.shape != out.shape or u.shape != out.shape or not out.is_contiguous():
        raise ValueError("swiglu: g, u and out need one shape, out contiguous")
    if strided and (g.dim() != 2 or g.stride(1) != 1 or u.stride() != g.stride() or W % 32):
        raise ValueError("swiglu: strided g / u must be [rows, W] with unit columns, one row "
                         "stride and W a multiple of 32")
    gs = g.stride(0) if strided else W
    q, qd, qs, inv, quant, lay = _quant_args(quant_out, quant_layout, out, W)
    on = pdl.enabled(g.device)
    _swiglu_kernel[(triton.cdiv(n, BLOCK),)](g, u, out, q, qd, qs, inv, n, W, gs, BLOCK=BLOCK,
                                             QUANT=quant, LAYOUT=lay, STRIDED=strided,
                                             PDL=on, launch_pdl=on, num_warps=4)
    return out


def swiglu_ref(g: torch.Tensor, u: torch.Tensor, out: torch.Tensor, quant_out=None,
               quant_layout: int = 0) -> torch.Tensor:
    out.copy_(F.silu(g) * u)
    _quant_ref(out, quant_out, quant_layout, out.shape[-1])
    return out


# ---- gated RMSNorm (GDN output) -----------------------------------------------------------------
@triton.jit
def _gated_rmsnorm_kernel(o_ptr, z_ptr, w_ptr, out_ptr, q_ptr, qd_ptr, qs_ptr, inv_ptr, S, eps,
                          HV, ZT, BLOCK: tl.constexpr, QUANT: tl.constexpr,
                          LAYOUT: tl.constexpr, PDL: tl.constexpr = False):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < S
    base = row.to(tl.int64) * S
    # z's row: head row % HV of token row // HV, tokens ZT apart (= HV * S when contiguous)
    zbase = (row // HV).to(tl.int64) * ZT + (row % HV) * S
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    o = tl.load(o_ptr + base + offs, mask=m, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(o * o, axis=0) / S + eps)
    if QUANT:
        # the same r (same 1-D reduction), then [BLOCK/32, 32] tiles of the row's 32-blocks
        nblk = S // 32
        lb = tl.arange(0, BLOCK // 32)
        bm = lb < nblk
        offs2 = lb[:, None] * 32 + tl.arange(0, 32)[None, :]
        o2 = tl.load(o_ptr + base + offs2, mask=bm[:, None], other=0.0)
        z2 = tl.load(z_ptr + zbase + offs2, mask=bm[:, None], other=0.0)
        w2 = tl.load(w_ptr + offs2, mask=bm[:, None], other=0.0)
        y = o2 * r * w2 * (z2 / (1.0 + tl.exp(-z2)))
        tl.store(out_ptr + base + offs2, y, mask=bm[:, None])
        _quant_tile(y, row * nblk + lb, bm, q_ptr, qd_ptr, qs_ptr, inv_ptr, LAYOUT)
    else:
        z = tl.load(z_ptr + zbase + offs, mask=m, other=0.0)
        w = tl.load(w_ptr + offs, mask=m, other=0.0)
        tl.store(out_ptr + base + offs, o * r * w * (z / (1.0 + tl.exp(-z))), mask=m)


def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float,
                  out: torch.Tensor, quant_out=None, quant_layout: int = 0) -> torch.Tensor:
    """o, z [..., S] fp32 (rows = heads), w [S] -> out = rmsnorm(o) * w * silu(z); with
    quant_out=(q, d, s16) also out (all rows as one vector) quantized as quantize_act would
    (S a multiple of 32, so no 32-block straddles two heads). o and out contiguous; z of o's
    shape, contiguous or [tokens, Hv, S] with contiguous heads and any token stride (the last
    columns of a merged qkv + gate product's rows, verify block)."""
    S = o.shape[-1]
    rows = o.numel() // S
    if z.numel() != o.numel() or not (o.is_contiguous() and out.is_contiguous()):
        raise ValueError("gated_rmsnorm: z needs o's size, o and out contiguous")
    if z.is_contiguous():
        hv, zt = rows, rows * S
    elif z.dim() == 3 and z.stride(2) == 1 and z.stride(1) == S:
        hv, zt = z.shape[1], z.stride(0)
    else:
        raise ValueError("gated_rmsnorm: z must be contiguous or [tokens, Hv, S] with "
                         "contiguous heads")
    q, qd, qs, inv, quant, lay = _quant_args(quant_out, quant_layout, out, S)
    on = pdl.enabled(o.device)
    _gated_rmsnorm_kernel[(rows,)](o, z, w, out, q, qd, qs, inv, S, float(eps), hv, zt,
                                   BLOCK=triton.next_power_of_2(S), QUANT=quant, LAYOUT=lay,
                                   PDL=on, launch_pdl=on, num_warps=1)
    return out


def gated_rmsnorm_ref(o: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float,
                      out: torch.Tensor, quant_out=None, quant_layout: int = 0) -> torch.Tensor:
    ms = o.to(torch.float64).pow(2).mean(-1, keepdim=True)
    out.copy_(o * torch.rsqrt(ms + eps).to(o.dtype) * w * F.silu(z))
    _quant_ref(out, quant_out, quant_layout, o.shape[-1])
    return out


# ---- finiteness check + bank commit (the step's last kernel) ------------------------------------
@triton.jit
def _commit_kernel(a_ptr, na, b_ptr, nb, status_ptr, n_tok, BLOCK: tl.constexpr,
                   PDL: tl.constexpr = False):
    """P programs scan a[na] and b[nb] for NaN/Inf, program p the BLOCKs p, p + P, ...; each adds
    one ticket (and, if it saw a bad value, 1 << 16) to the counter status[3]. The program that
    draws the last ticket sees every other program's count (the atomics are acq_rel): if all were
    finite (and no earlier step failed) it flips the active bank and advances the device position
    by n_tok, otherwise it sets the sticky non-finite flag, which the host reads lazily
    (GPUState.sync) and clears; then it puts the counter back to 0 for the next step.
    (One program used to scan everything: 59 us per decode step for the 248K logits, 290 us for a
    5-token verify block; session 8's profiles.)"""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    p = tl.program_id(0)
    P = tl.num_programs(0)
    bad = tl.zeros([BLOCK], tl.int32)
    for s in range(p * BLOCK, na, P * BLOCK):
        offs = s + tl.arange(0, BLOCK)
        v = tl.load(a_ptr + offs, mask=offs < na, other=0.0)
        bad += (tl.abs(v) == float("inf")).to(tl.int32) | (v != v).to(tl.int32)
    for s in range(p * BLOCK, nb, P * BLOCK):
        offs = s + tl.arange(0, BLOCK)
        v = tl.load(b_ptr + offs, mask=offs < nb, other=0.0)
        bad += (tl.abs(v) == float("inf")).to(tl.int32) | (v != v).to(tl.int32)
    seen = (tl.sum(bad, axis=0) > 0).to(tl.int32)
    old = tl.atomic_add(status_ptr + 3, 1 + seen * 65536)
    if (old & 65535) == P - 1:                      # the last program to finish
        nbad = (old >> 16) + seen
        active = tl.load(status_ptr + 0)
        pos = tl.load(status_ptr + 2)
        flag = tl.load(status_ptr + 1)
        ok = (nbad == 0) & (flag == 0)      # the flag is sticky: after a failure nothing commits
        tl.store(status_ptr + 0, tl.where(ok, 1 - active, active))
        tl.store(status_ptr + 2, tl.where(ok, pos + n_tok, pos))
        tl.store(status_ptr + 1, tl.where(ok, flag, 1))
        tl.store(status_ptr + 3, 0)


COMMIT_BLOCK = 2048          # elements per program step of the finiteness scan
COMMIT_PROGRAMS = 264        # at most (2 per SM on an H200): one wave, a few steps each


def commit(a: torch.Tensor, b: torch.Tensor, status: torch.Tensor, n_tok: int = 1) -> None:
    """status int32 [4] = (active bank, non-finite flag, device pos, scan counter: 0 between
    launches)."""
    on = pdl.enabled(a.device)
    n = triton.cdiv(a.numel(), COMMIT_BLOCK) + triton.cdiv(b.numel(), COMMIT_BLOCK)
    _commit_kernel[(max(1, min(n, COMMIT_PROGRAMS)),)](
        a, a.numel(), b, b.numel(), status, n_tok, BLOCK=COMMIT_BLOCK, PDL=on, launch_pdl=on,
        num_warps=4)


def commit_ref(a: torch.Tensor, b: torch.Tensor, status: torch.Tensor, n_tok: int = 1) -> None:
    ok = bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()) and int(status[1]) == 0
    if ok:
        status[0] = 1 - status[0]
        status[2] += n_tok
    else:
        status[1] = 1
