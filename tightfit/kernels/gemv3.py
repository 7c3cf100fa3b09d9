"""GEMV v3: N <= 2 dp4a GEMV on the planar layout, a warp's lanes coalesced along K.

Why: gemv2_small gives each thread a whole 256-weight block (lanes over (row, block)), so a warp
load instruction touches 32 different 128-byte pieces. The feasibility experiment
(shared/bench/triton-gemv-feasibility.md) reached 78 % of copy bandwidth with the opposite
mapping: the lanes of a warp read *contiguous* 16-byte chunks of one row's quant plane (512 B per
warp load instruction), packed-word SWAR decode, int8 activations and dp4a, one cross-lane
reduction at the very end.

Tile per program: [R rows, W lanes, 4 words]. Lane l of a row holds 16-B chunk number
k0 + l of that row's first quant plane (gemv2_layout.relayout puts block b of row r at
(r*NB + b) * plane_bytes, so a row's plane is contiguous). CPB chunks make one 256-element
block, so lane l always sees chunk u = l % CPB of its block (W is a multiple of CPB): which
sub-blocks / elements a lane's words hold is loop-invariant per lane (shifts by a per-lane
register, computed once), and the loop only advances the block number by BPI = W/CPB.
Per lane and row it decodes its 4 words to int8 lanes, multiplies them with dp4a against the
matching activation words ([1, W, 4] tile, shared by all R rows, one 16-B load per word group),
chains the dp4a through the addend, then applies the sub-block scales (loaded per (row, lane)
from the scale planes: lanes of one block read the same word, one sector) and accumulates
fp32 [R, W]. After the K loop: tl.sum over W (the only cross-lane work).

Per lane (chunk u of a block):
  IQ4_XS  qs 16 B = sub-block u (lookup words r0/r1 vs activation words 8u..8u+7, PERM 2)
  Q4_K/Q5_K  qs 16 B = half h=u%2 of chunk c=u//2: low nibbles = group 2c, high = 2c+1;
          Q5_K reads the matching 16 B of qh (bytes 16h..16h+15, bits 2c / 2c+1)
  Q6_K    ql 16 B = bytes 16u: half n=u//4, gl=(u%4)//2, l0=16(u%2); qh 16 B at 32n+l0
  Q3_K    qs 16 B (CPB=4) = half n=u//2, l0=16(u%2), 4 crumbs -> 64 weights; hm 16 B at l0
  Q8_0    qs 16 B (CPB=16 per 256) = half of 32-block u//2
Rows are clamped to n_out - 1, blocks past NB to NB - 1 with a zero scale (no masked loads).

Split-K (SPLIT > 1): program (tile, s) handles blocks s*BPI, s*BPI + SPLIT*BPI, ... and writes
its partial [N, n_out] into a workspace [SPLIT, N, n_out]; gemv2._reduce_kernel sums them into
`out` (a second tiny launch; no atomics, deterministic, no memset, CUDA-graph capturable).
Give `workspace` to avoid the allocation inside the call.

Activations: gemv2.prep_for(x, qtype, small=True) (= gemv2_act.prep_act2(..., with_b=False) with
IQ4_XS in PERM 2), i.e. the same prepared activations gemv2_small reads.
TRITON_INTERPRET=1 runs integer emulations of dp4a / prmt (EMU), see gemv_prims.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tightfit.kernels.gemv_prims import dp4a, i32
from tightfit.kernels.gemv2_decode import lo_f16, _signed, M4, M2, M1, C20, C04
from tightfit.kernels.gemv2_small import dp4a_us, lut_iq4_fast
from tightfit.kernels.gemv2_layout import MACRO, GROUP, field_args

V3_TYPES = frozenset((23, 12, 13, 14, 11, 8))
# 16-byte chunks of the first quant plane per 256-element block
CPB = {23: 8, 12: 8, 13: 8, 14: 8, 11: 4, 8: 16}
# weights per 16-byte chunk of the first quant plane (for per-weight SASS figures)
WPC = {23: 32, 12: 32, 13: 32, 14: 32, 11: 64, 8: 16}
SIG = {"w_ptr": "*u8", "q_ptr": "*i8", "xs_ptr": "*fp32", "xsum_ptr": "*fp32",
       "out_ptr": "*fp32", "N": "i32", "n_out": "i32", "NB": "i32", "P0": "i32", "P1": "i32",
       "P2": "i32", "P3": "i32"}
M3F = tl.constexpr(0x3F3F3F3F)
M30 = tl.constexpr(0x30303030)
MF0 = tl.constexpr(i32(0xF0F0F0F0))


@triton.jit
def _w4(t):
    """[RT, L, W, 4] -> its 4 words along the in-thread last axis, each [RT, L, W]."""
    a, b = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], t.shape[2], 2, 2)))
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    return a0, b0, a1, b1        # split takes the last axis: a = words {0, 2}, b = {1, 3}


@triton.jit
def _dot4(wq, x, acc, US: tl.constexpr, EMU: tl.constexpr):
    """acc + sum over the 4 words of dp4a(wq, x), chained through dp4a's addend (no IADD tree).
    US: wq bytes unsigned (dp4a.u32.s32)."""
    w0, w1, w2, w3 = _w4(wq)
    x0, x1, x2, x3 = _w4(x)
    if US:
        return dp4a_us(w3, x3, dp4a_us(w2, x2, dp4a_us(w1, x1, dp4a_us(w0, x0, acc, EMU), EMU),
                                       EMU), EMU)
    else:
        return dp4a(w3, x3, dp4a(w2, x2, dp4a(w1, x1, dp4a(w0, x0, acc, EMU), EMU), EMU), EMU)


@triton.jit
def _zi(blk):
    """int32 zeros shaped like the [RT, L, W] block tile (the dp4a chain's first addend)."""
    return tl.zeros([blk.shape[0], blk.shape[1], blk.shape[2]], tl.int32)


@triton.jit
def _plane32(w, P):
    """int32 pointer to a plane starting at 4*P bytes."""
    return (w + P.to(tl.int64) * 4).to(tl.pointer_type(tl.int32))


@triton.jit
def _xw(q32, n, KW, woff):
    """Activation words [1, L, W, 4] of column n at word offsets woff [1, L, W] (+0..3)."""
    return tl.load(q32 + n * KW + woff[:, :, :, None] + tl.arange(0, 4)[None, None, None, :])


@triton.jit
def _bytef(word, sh):
    """Unsigned byte of word at bit shift sh (tensor), as float32."""
    return ((word >> sh) & 255).to(tl.float32)


_KVW = [i32(sum((_KV & 255) << (8 * k) for k, _KV in enumerate(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113][4 * t:4 * t + 4])))
    for t in range(4)]
KV0 = tl.constexpr(_KVW[0])
KV1 = tl.constexpr(_KVW[1])
KV2 = tl.constexpr(_KVW[2])
KV3 = tl.constexpr(_KVW[3])
# gemv2_small's lookup asm with the 4 table words as register operands $3..$6 instead of
# immediates: SASS PRMT takes one table word as an immediate but the other from a register,
# and with constant tables ptxas re-materializes that register (IMAD.U32 R, RZ, RZ, UR) before
# about every second PRMT. Fed runtime values it keeps the 4 words in registers.
_LUT_REG = tl.constexpr("{ .reg .b32 s, e, t, u;\n"
            "and.b32 s, $2, 0x77777777;\n"
            "shr.b32 e, $2, 1;\n"
            "and.b32 e, e, 0x44444444;\n"
            "or.b32 e, e, 0x32103210;\n"
            "prmt.b32 t, $3, $4, s;\n"
            "prmt.b32 u, $5, $6, s;\n"
            "prmt.b32 $0, t, u, e;\n"
            "shr.b32 s, s, 16;\n"
            "shr.b32 e, e, 16;\n"
            "prmt.b32 t, $3, $4, s;\n"
            "prmt.b32 u, $5, $6, s;\n"
            "prmt.b32 $1, t, u, e; }")


@triton.jit
def lut_iq4_reg(w, t0, t1, t2, t3, EMU: tl.constexpr):
    """8 IQ4 nibbles -> 2 words of kvalues (gemv2_decode.lut_iq4), table words t0..t3 (the
    KV0..KV3 values, passed opaque; see _LUT_REG)."""
    if EMU:
        return lut_iq4_fast(w, EMU)
    else:
        return tl.inline_asm_elementwise(_LUT_REG, "=r,=r,r,r,r,r,r", [w, t0, t1, t2, t3],
                                         dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def body_iq4xs(w, blk, ok, bc, u, q32, xs_ptr, KW, P0, P1, P2, NC_ARG, NC: tl.constexpr,
               EMU: tl.constexpr):
    j3 = tl.arange(0, 4)[None, None, None, :]
    qs = tl.load(_plane32(w, P0) + (blk * 32 + 4 * u)[:, :, :, None] + j3)       # [R, W, 4]
    # table words made opaque to ptxas through N (N >> 8 == 0 for N <= 2), see _LUT_REG
    z = qs * 0 + (NC_ARG >> 8)
    r0, r1 = lut_iq4_reg(qs, z + KV0, z + KV1, z + KV2, z + KV3, EMU)  # bytes 0,1 / 2,3
    sl = tl.load(_plane32(w, P1) + blk)                                       # [R, W]
    dsh = tl.load(_plane32(w, P2) + blk)
    ls = ((sl >> (4 * u)) & 15) | (((dsh >> (16 + 2 * u)) & 3) << 4)
    ws = tl.where(ok, lo_f16(dsh), 0.0) * (ls - 32).to(tl.float32)
    p0 = ws * 0.0
    p1 = p0
    for n in tl.static_range(NC):
        isum = _dot4(r0, _xw(q32, n, KW, bc * 64 + 8 * u), _zi(blk), False, EMU)
        isum = _dot4(r1, _xw(q32, n, KW, bc * 64 + 8 * u + 4), isum, False, EMU)
        p = isum.to(tl.float32) * (ws * tl.load(xs_ptr + (bc * 8 + u) * NC + n))
        if n == 0:
            p0 = p
        else:
            p1 = p
    return p0, p1


@triton.jit
def body_q45k(w, blk, ok, bc, u, q32, xs_ptr, xsum_ptr, KW, P0, P1, P2, P3, Q5: tl.constexpr,
              NC: tl.constexpr, EMU: tl.constexpr):
    j3 = tl.arange(0, 4)[None, None, None, :]
    c = u // 2                      # 32-byte chunk: groups 2c (low nibbles), 2c+1 (high)
    h = u % 2                       # which 16 of its 32 elements
    qs = tl.load(_plane32(w, P0) + (blk * 32 + 4 * u)[:, :, :, None] + j3)
    if Q5:
        qh = tl.load(_plane32(w, P1) + (blk * 8 + 4 * h)[:, :, :, None] + j3)
        c3 = c[:, :, :, None]
        lo = (qs & M4) | (((qh >> (2 * c3)) & M1) << 4)
        hi = ((qs >> 4) & M4) | (((qh >> (2 * c3 + 1)) & M1) << 4)
        scp = _plane32(w, P2) + blk * 3
        dd = tl.load(_plane32(w, P3) + blk)
    else:
        lo = qs & M4
        hi = qs & MF0               # 16 x the high nibble, multiplied unsigned; 1/16 in scale
        scp = _plane32(w, P1) + blk * 3
        dd = tl.load(_plane32(w, P2) + blk)
    S0 = tl.load(scp)
    S1 = tl.load(scp + 1)
    S2 = tl.load(scp + 2)
    # 6-bit scales/mins: groups 0-3 in bytes of S0/S1 (& 63); 4-7 = S2 nibbles | S0/S1 top bits
    lowc = c < 2
    SC = tl.where(lowc, S0 & M3F, (S2 & M4) | ((S0 >> 2) & M30))
    MN = tl.where(lowc, S1 & M3F, ((S2 >> 4) & M4) | ((S1 >> 2) & M30))
    sh = 16 * (c & 1)               # byte 2(c&1) = group 2c, the next byte group 2c+1
    d = tl.where(ok, lo_f16(dd), 0.0)
    dmin = tl.where(ok, lo_f16(dd >> 16), 0.0)
    ws0 = d * _bytef(SC, sh)
    ws1 = d * _bytef(SC, sh + 8)
    if not Q5:
        ws1 = ws1 * 0.0625
    wm = dmin * _bytef(MN, sh + 8 * h)     # lane h takes group 2c+h's whole min term
    g0 = bc * 8 + 2 * c
    p0 = ws0 * 0.0
    p1 = p0
    for n in tl.static_range(NC):
        xo = bc * 64 + 16 * c + 4 * h
        il = _dot4(lo, _xw(q32, n, KW, xo), _zi(blk), False, EMU)
        ih = _dot4(hi, _xw(q32, n, KW, xo + 8), _zi(blk), not Q5, EMU)
        xs0 = tl.load(xs_ptr + g0 * NC + n)
        xs1 = tl.load(xs_ptr + (g0 + 1) * NC + n)
        xm = tl.load(xsum_ptr + (g0 + h) * NC + n)
        p = il.to(tl.float32) * (ws0 * xs0) + ih.to(tl.float32) * (ws1 * xs1) - wm * xm
        if n == 0:
            p0 = p
        else:
            p1 = p
    return p0, p1


@triton.jit
def body_q6k(w, blk, ok, bc, u, q32, xs_ptr, KW, P0, P1, P2, P3, NC: tl.constexpr,
             EMU: tl.constexpr):
    j3 = tl.arange(0, 4)[None, None, None, :]
    hn = u // 4                     # 128-element half
    gl = (u % 4) // 2               # ql low nibble = group gl, high = gl + 2 (32-groups)
    l0 = 4 * (u % 2)                # word offset of the lane's 16 bytes inside the 32
    ql = tl.load(_plane32(w, P0) + (blk * 32 + 4 * u)[:, :, :, None] + j3)
    qh = tl.load(_plane32(w, P1) + (blk * 16 + 8 * hn + l0)[:, :, :, None] + j3)
    s3 = (2 * gl)[:, :, :, None]
    qa = _signed((ql & M4) | (((qh >> s3) & M2) << 4), C20)
    qb = _signed(((ql >> 4) & M4) | (((qh >> (s3 + 4)) & M2) << 4), C20)
    sa = 8 * hn + 2 * gl + u % 2    # 16-group of qa; qb's is sa + 4
    scp = (w + P2.to(tl.int64) * 4).to(tl.pointer_type(tl.int8)) + blk * 16 + sa
    dp = (w + P3.to(tl.int64) * 4).to(tl.pointer_type(tl.float16)) + blk
    d = tl.where(ok, tl.load(dp).to(tl.float32), 0.0)
    wa = d * tl.load(scp).to(tl.float32)
    wb = d * tl.load(scp + 4).to(tl.float32)
    p0 = wa * 0.0
    p1 = p0
    for n in tl.static_range(NC):
        xo = bc * 64 + 32 * hn + 8 * gl + l0
        ia = _dot4(qa, _xw(q32, n, KW, xo), _zi(blk), False, EMU)
        ib = _dot4(qb, _xw(q32, n, KW, xo + 16), _zi(blk), False, EMU)
        xa = tl.load(xs_ptr + (bc * 16 + sa) * NC + n)
        xb = tl.load(xs_ptr + (bc * 16 + sa + 4) * NC + n)
        p = ia.to(tl.float32) * (wa * xa) + ib.to(tl.float32) * (wb * xb)
        if n == 0:
            p0 = p
        else:
            p1 = p
    return p0, p1


@triton.jit
def body_q3k(w, blk, ok, bc, u, q32, xs_ptr, KW, P0, P1, P2, P3, NC: tl.constexpr,
             EMU: tl.constexpr):
    j3 = tl.arange(0, 4)[None, None, None, :]
    hn = u // 2                     # 128-element half
    pp = u % 2                      # which 16 of each 32
    qs = tl.load(_plane32(w, P0) + (blk * 16 + 4 * u)[:, :, :, None] + j3)
    hm = tl.load(_plane32(w, P1) + (blk * 8 + 4 * pp)[:, :, :, None] + j3)
    scp = _plane32(w, P2) + blk * 3
    S0 = tl.load(scp)
    S1 = tl.load(scp + 1)
    S2 = tl.load(scp + 2)
    d = tl.where(ok, tl.load((w + P3.to(tl.int64) * 4).to(tl.pointer_type(tl.float16))
                             + blk).to(tl.float32), 0.0)
    hb3 = (4 * hn)[:, :, :, None]
    p0 = d * 0.0
    p1 = p0
    for s in tl.static_range(4):
        # crumb s = elements 128hn + 32s + 16pp + (0..15), 16-group j = 8hn + 2s + pp
        q = _signed(((qs >> (2 * s)) & M2) | (((hm >> (hb3 + s)) & M1) << 2), C04)
        bsh = 8 * (2 * (s % 2) + pp)            # byte 2s+pp (mod 4) of S0/S1, byte j%4 of S2
        if s < 2:
            lo = (S0 >> (bsh + 4 * hn)) & 15
        else:
            lo = (S1 >> (bsh + 4 * hn)) & 15
        hi = (S2 >> (bsh + 2 * (2 * hn + s // 2))) & 3
        ws = d * ((lo | (hi << 4)) - 32).to(tl.float32)
        gj = bc * 16 + 8 * hn + 2 * s + pp
        for n in tl.static_range(NC):
            x = _xw(q32, n, KW, bc * 64 + 32 * hn + 8 * s + 4 * pp)
            p = _dot4(q, x, _zi(blk), False, EMU).to(tl.float32) * (
                ws * tl.load(xs_ptr + gj * NC + n))
            if n == 0:
                p0 += p
            else:
                p1 += p
    return p0, p1


@triton.jit
def body_q8_0(w, blk, ok, bc, u, q32, xs_ptr, KW, P0, P1, NC: tl.constexpr, EMU: tl.constexpr):
    j3 = tl.arange(0, 4)[None, None, None, :]
    q = tl.load(_plane32(w, P0) + (blk * 64 + 4 * u)[:, :, :, None] + j3)
    dp = (w + P1.to(tl.int64) * 4).to(tl.pointer_type(tl.float16)) + blk * 8 + u // 2
    d = tl.where(ok, tl.load(dp).to(tl.float32), 0.0)
    p0 = d * 0.0
    p1 = p0
    for n in tl.static_range(NC):
        isum = _dot4(q, _xw(q32, n, KW, bc * 64 + 4 * u), _zi(blk), False, EMU)
        p = isum.to(tl.float32) * (d * tl.load(xs_ptr + (bc * 8 + u // 2) * NC + n))
        if n == 0:
            p0 = p
        else:
            p1 = p
    return p0, p1


@triton.jit
def gemv3_kernel(w_ptr, q_ptr, xs_ptr, xsum_ptr, out_ptr, N, n_out, NB, P0, P1, P2, P3,
                 FMT: tl.constexpr, NC: tl.constexpr, RT: tl.constexpr, L: tl.constexpr,
                 W: tl.constexpr, CPB_: tl.constexpr, SPLIT: tl.constexpr, EVEN: tl.constexpr,
                 EMU: tl.constexpr):
    """Tiles are [RT, L, W(, 4)]: L = 32*num_warps/W rows side by side (one per lane group /
    warp), RT rows after each other in every thread's registers. Row-independent operands
    (activation words, x scales, block numbers) are [1, L, W]: broadcast along L by a zero
    term, so that they have exactly one element (one 16-byte vector) per thread and Triton
    gives them the weight tile's layout instead of converting them through shared memory.
    EVEN: NB is a multiple of the blocks per iteration (no clamping / zero scales)."""
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    BPI: tl.constexpr = W // CPB_                 # blocks of a row per iteration
    R: tl.constexpr = RT * L
    rows = pid_r * R + tl.arange(0, RT)[:, None] * L + tl.arange(0, L)[None, :]    # [RT, L]
    rowb = (tl.minimum(rows, n_out - 1).to(tl.int64) * NB)[:, :, None]            # [RT, L, 1]
    zl = tl.arange(0, L)[None, :, None] * 0
    lane = tl.arange(0, W)[None, None, :] + zl                                     # [1, L, W]
    u = lane % CPB_                               # chunk inside the block: loop-invariant
    lb = lane // CPB_
    KW = NB * 64                                  # int32 activation words per column
    q32 = q_ptr.to(tl.pointer_type(tl.int32))
    acc0 = tl.zeros([RT, L, W], tl.float32)
    acc1 = acc0
    for b0 in range(pid_k * BPI, NB, BPI * SPLIT):
        b = b0 + lb
        if EVEN:
            ok = lb >= 0
            bc = b
        else:
            ok = b < NB                           # [1, L, W]
            bc = tl.minimum(b, NB - 1)
        blk = rowb + bc                           # [RT, L, W] block numbers (int64)
        if FMT == 23:
            p0, p1 = body_iq4xs(w_ptr, blk, ok, bc, u, q32, xs_ptr, KW, P0, P1, P2, N, NC,
                                EMU)
        elif FMT == 12:
            p0, p1 = body_q45k(w_ptr, blk, ok, bc, u, q32, xs_ptr, xsum_ptr, KW, P0, P1, P2,
                               P3, False, NC, EMU)
        elif FMT == 13:
            p0, p1 = body_q45k(w_ptr, blk, ok, bc, u, q32, xs_ptr, xsum_ptr, KW, P0, P1, P2,
                               P3, True, NC, EMU)
        elif FMT == 14:
            p0, p1 = body_q6k(w_ptr, blk, ok, bc, u, q32, xs_ptr, KW, P0, P1, P2, P3, NC, EMU)
        elif FMT == 11:
            p0, p1 = body_q3k(w_ptr, blk, ok, bc, u, q32, xs_ptr, KW, P0, P1, P2, P3, NC, EMU)
        else:
            p0, p1 = body_q8_0(w_ptr, blk, ok, bc, u, q32, xs_ptr, KW, P0, P1, NC, EMU)
        acc0 += p0
        if NC == 2:
            acc1 += p1
    omask = rows < n_out
    obase = out_ptr + pid_k * N * n_out + rows
    tl.store(obase, tl.sum(acc0, axis=2), mask=omask)
    if NC == 2:
        tl.store(obase + n_out, tl.sum(acc1, axis=2), mask=omask)


N_SM = 132          # H200


def pick_config3(qtype: int, n: int, n_out: int, nb: int) -> dict:
    """W lanes along K (32 = one 512-B warp load per row; smaller when NB is not a multiple of
    the blocks an iteration covers), 4 warps, RT rows per thread (R = RT x 32*warps/W).
    Prefer no split-K (the reduce is a second launch): RT = 4, else 2, when that gives >= 4
    programs per SM (4-warp programs of 48-64 registers: 8-10 fit per SM, each thread keeping
    RT x 16 B of weights plus 16-32 B of activations in flight); otherwise RT = 1 and split-K
    up to ~4 programs per SM while every split keeps >= 2 iterations."""
    cpb = CPB[qtype]
    W = 32
    while W > cpb and nb % (W // cpb):
        W //= 2
    W = max(W, cpb)
    warps = 4
    L = 32 * warps // W
    for rt in (4, 2):
        if triton.cdiv(n_out, rt * L) >= 4 * N_SM:
            return {"R": rt * L, "W": W, "SPLIT": 1, "num_warps": warps}
    tiles = triton.cdiv(n_out, L)
    iters = triton.cdiv(nb, W // cpb)
    split = 1
    while tiles * split < 4 * N_SM and iters // (split * 2) >= 2:
        split *= 2
    return {"R": L, "W": W, "SPLIT": split, "num_warps": warps}


def kernel_args(qtype: int, n: int, nb: int, cfg: dict) -> dict:
    """The kernel's constexprs for a config: R rows = RT x L, L = 32*num_warps/W rows side by
    side (W <= 32: a warp spans 32/W rows; W > 32: warps share a row's W lanes)."""
    W, warps = cfg["W"], cfg["num_warps"]
    cpb = CPB[qtype]
    if W % cpb or W & (W - 1) or (32 * warps) % W:
        raise ValueError(f"gemv v3: W={W} must be a power of two, a multiple of {cpb} and "
                         f"divide 32*num_warps={32 * warps}")
    L = 32 * warps // W
    if cfg["R"] % L:
        raise ValueError(f"gemv v3: R={cfg['R']} is not a multiple of 32*num_warps/W={L}")
    return dict(FMT=qtype, NC=n, RT=cfg["R"] // L, L=L, W=W, CPB_=cpb, SPLIT=cfg["SPLIT"],
                EVEN=nb % (W // cpb) == 0)


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def gemv3_prepared(act, w_planar: torch.Tensor, qtype: int, n_out: int, out: torch.Tensor,
                   config: dict | None = None, interpret: bool = False,
                   workspace: torch.Tensor | None = None) -> torch.Tensor:
    """out[N, n_out] (fp32) = act . W^T on the planar layout. act: gemv2.prep_for(x, qtype,
    small=True). config keys: R, W, SPLIT, num_warps (missing ones from pick_config3).
    workspace: fp32 with >= SPLIT*N*n_out elements, used when SPLIT > 1 (else allocated)."""
    from tightfit.kernels.gemv2 import _reduce_kernel, PERM_SMALL
    qtype = int(qtype)
    if qtype not in V3_TYPES:
        raise ValueError(f"gemv v3: type {qtype} not supported")
    n, n_in = act.n, act.k
    if n > 2:
        raise ValueError(f"gemv v3: N={n}, at most 2")
    if not act.fits(GROUP[qtype], PERM_SMALL.get(qtype, 0)) or act.has_b:
        raise ValueError("gemv v3: activations must come from gemv2.prep_for(x, t, small=True)")
    nb = n_in // 256
    if w_planar.numel() != n_out * nb * MACRO[qtype]:
        raise ValueError(f"gemv v3: w has {w_planar.numel()} bytes, expected "
                         f"{n_out}x{nb * MACRO[qtype]}")
    cfg = dict(pick_config3(qtype, n, n_out, nb))
    cfg.update({k: v for k, v in (config or {}).items() if k in cfg})
    split = cfg["SPLIT"]
    if split == 1:
        dst = out
    elif workspace is not None:
        dst = workspace.reshape(-1)[:split * n * n_out]
    else:
        dst = torch.empty((split, n, n_out), dtype=torch.float32, device=w_planar.device)
    P = field_args(qtype, w_planar.numel(), True)
    k = kernel_args(qtype, n, nb, cfg)
    grid = (triton.cdiv(n_out, cfg["R"]), split)
    emu = bool(interpret) or _interpret() or w_planar.device.type != "cuda"
    gemv3_kernel[grid](w_planar, act.q, act.xs, act.xsum, dst, n, n_out, nb,
                       P[0], P[1], P[2], P[3], EMU=emu, num_warps=cfg["num_warps"], **k)
    if split > 1:
        total = n * n_out
        _reduce_kernel[(triton.cdiv(total, 1024),)](dst, out, total, SPLIT=split, BLOCK=1024)
    return out


def gemv3(x: torch.Tensor, w_planar: torch.Tensor, qtype: int, n_out: int, n_in: int,
          out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """y[N, n_out] fp32 = x[N, n_in] . W^T, N <= 2, W in gemv2_layout.relayout's planar layout."""
    from tightfit.kernels.gemv2 import prep_for
    if x.dim() == 1:
        x = x[None, :]
    if x.shape[1] != n_in:
        raise ValueError(f"gemv v3: x has {x.shape[1]} columns, expected {n_in}")
    act = prep_for(x, int(qtype), small=True)
    if out is None:
        out = torch.empty((x.shape[0], n_out), dtype=torch.float32, device=w_planar.device)
    return gemv3_prepared(act, w_planar, qtype, n_out, out, config=config)


__all__ = ["gemv3", "gemv3_prepared", "pick_config3", "V3_TYPES"]
