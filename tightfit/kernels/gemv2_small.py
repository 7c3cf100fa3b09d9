"""GEMV v2, small-N path (N = 1, 2): dp4a on the coalesced word tiles, no tensor cores.

Same formats, block addressing (raw or planar, gemv2_layout) and prepared activations as the
tensor-core path (gemv2.py), but at N <= 2 the int8 dot pads N to 8-16 columns and the per-(row,
group, column) epilogue dominates (bench/NOTES.md, SASS counts). Here:
- tiles are [fields..., R rows, KB blocks, 4 words]: the lanes of a warp cover (row, block)
  pairs and each thread holds all the fields of its block in registers, read as 16-byte vectors
  (4 words); the field coordinates are then compile-time constants per register, so shifts,
  selects and byte extractions of the scale decode fold;
- each word is decoded to 4 int8 lanes with SWAR masks (IQ4_XS: the prmt lookup) and multiplied
  by the matching activation word with dp4a, chained through the accumulator operand (no
  separate adds); Q4_K/Q5_K high nibbles are masked in place (x16) and multiplied unsigned
  (dp4a.u32.s32), the 1/16 folded into the scale: one int32 per (row, block, group, 16/32);
- the epilogue is one FFMA per partial with (weight group scale x activation scale), plus one
  per 32 for the Q4_K/Q5_K min term; no block-diagonal B, no shared memory and no cross-thread
  reduction inside the loop.
Per-block operands that do not depend on the row (activation words, their scales) are [1, KB]
-shaped, small enough for Triton to re-load them in the word tile's layout instead of converting
the dot sums through shared memory. Rows are clamped to n_out - 1 and blocks to NB - 1 instead
of masking loads (a masked load zeroes its registers first); blocks past NB get a zero scale
(`ok`), clamped rows are never stored.
Activations: gemv2_act.prep_act2(..., with_b=False): q int8 [N, K] in the decode order (IQ4_XS:
perm 1), xs per scale group, xsum = d * sum(q) per 32. Offsets (Q6_K -32, Q3_K -4) are taken out
per byte (_signed), as in gemv2_decode.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels.gemv_prims import dp4a, i32
from tightfit.kernels.gemv2_decode import (fbase, lo_f16, lut_iq4, _signed,
                                           M4, M2, M1, C20, C04)

SIG = {"w_ptr": "*u8", "q_ptr": "*i8", "xs_ptr": "*fp32", "xsum_ptr": "*fp32",
       "out_ptr": "*fp32", "N": "i32", "n_out": "i32", "NB": "i32", "P0": "i32", "P1": "i32",
       "P2": "i32", "P3": "i32"}
M3F = tl.constexpr(0x3F3F3F3F)
M30 = tl.constexpr(0x30303030)
MF0 = tl.constexpr(i32(0xF0F0F0F0))


def _rows_first() -> bool:
    """Physical dim order of the tiles: [R, KB, fields..., words] (True) or [fields..., R, KB,
    words] (False, the default). Triton's coalescing pass orders the non-contiguous dims of a load
    by a version-dependent tie-break; offline under Triton 3.6 the rows-first order cut Q5_K from
    164 to 82 registers, but on the H200 it ran 1.2-2x SLOWER (session 3 call 1: Q8_0 planar 80 ->
    44 %, Q4_K 49 -> 40 %, e2e 83 -> 72 tok/s; bench/RESULTS.md): fewer registers, worse loads.
    So the measured-faster order is the default; TIGHTFIT_GEMV_RF=1 selects the other (tests run
    both orders under the interpreter)."""
    import os
    return os.environ.get("TIGHTFIT_GEMV_RF", "0") == "1"


RF = tl.constexpr(_rows_first())


@triton.jit
def _x5(v, D: tl.constexpr):
    """1-D v along logical dim D (0, 1: fields, 4: words) of a logical [F0, F1, R, KB, W] tile
    (physical [R, KB, F0, F1, W] when RF)."""
    if D == 4:
        return v[None, None, None, None, :]
    elif RF:
        if D == 0:
            return v[None, None, :, None, None]
        else:
            return v[None, None, None, :, None]
    else:
        if D == 0:
            return v[:, None, None, None, None]
        else:
            return v[None, :, None, None, None]


@triton.jit
def _b5(b):
    """[R, KB] (or [1, KB]) -> its place in a logical [F0, F1, R, KB, W] tile."""
    if RF:
        return b[:, :, None, None, None]
    else:
        return b[None, None, :, :, None]


@triton.jit
def _x4(v, D: tl.constexpr):
    """1-D v along logical field dim D (0, 1) of a logical [F0, F1, R, KB] tile."""
    if RF:
        if D == 0:
            return v[None, None, :, None]
        else:
            return v[None, None, None, :]
    else:
        if D == 0:
            return v[:, None, None, None]
        else:
            return v[None, :, None, None]


@triton.jit
def _b4(b):
    """[R, KB] (or [1, KB]) -> its place in a logical [F0, F1, R, KB] tile."""
    if RF:
        return b[:, :, None, None]
    else:
        return b[None, None, :, :]


@triton.jit
def _z4(F0: tl.constexpr, F1: tl.constexpr, R: tl.constexpr, KB: tl.constexpr):
    if RF:
        return tl.zeros([R, KB, F0, F1], tl.float32)
    else:
        return tl.zeros([F0, F1, R, KB], tl.float32)


@triton.jit
def dp4a_us(a, b, c, EMU: tl.constexpr):
    """c + sum_k ubyte(a, k) * sbyte(b, k) (PTX dp4a.u32.s32)."""
    if EMU:
        return (c + ((a >> 0) & 255) * ((b << 24) >> 24) + ((a >> 8) & 255) * ((b << 16) >> 24)
                + ((a >> 16) & 255) * ((b << 8) >> 24) + ((a >> 24) & 255) * (b >> 24))
    else:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [a, b, c], dtype=tl.int32, is_pure=True, pack=1)


_KV = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
_KVW = ["0x%08x" % sum((_KV[4 * t + k] & 255) << (8 * k) for k in range(4)) for t in range(4)]
# gemv2_decode.lut_iq4 as one asm block with the table words as immediates (as separate prmt
# calls ptxas re-materializes the 4 table registers before most of them: ~1 extra instruction
# per prmt in the SASS)
_LUT_ASM = tl.constexpr("{ .reg .b32 s, e, t, u;\n"
            "and.b32 s, $2, 0x77777777;\n"
            "shr.b32 e, $2, 1;\n"
            "and.b32 e, e, 0x44444444;\n"
            "or.b32 e, e, 0x32103210;\n"
            f"prmt.b32 t, {_KVW[0]}, {_KVW[1]}, s;\n"
            f"prmt.b32 u, {_KVW[2]}, {_KVW[3]}, s;\n"
            "prmt.b32 $0, t, u, e;\n"
            "shr.b32 s, s, 16;\n"
            "shr.b32 e, e, 16;\n"
            f"prmt.b32 t, {_KVW[0]}, {_KVW[1]}, s;\n"
            f"prmt.b32 u, {_KVW[2]}, {_KVW[3]}, s;\n"
            "prmt.b32 $1, t, u, e; }")


@triton.jit
def lut_iq4_fast(w, EMU: tl.constexpr):
    """gemv2_decode.lut_iq4 (8 IQ4 nibbles -> 2 words of kvalues bytes) in one asm block."""
    if EMU:
        return lut_iq4(w, EMU)
    else:
        return tl.inline_asm_elementwise(_LUT_ASM, "=r,=r,r", [w], dtype=(tl.int32, tl.int32),
                                         is_pure=True, pack=1)


@triton.jit
def _q4(t):
    """[..., 4] -> its 4 entries along the last (in-thread) axis."""
    if len(t.shape) == 5:
        t2 = tl.reshape(t, (t.shape[0], t.shape[1], t.shape[2], t.shape[3], 2, 2))
    else:
        t2 = tl.reshape(t, (t.shape[0], t.shape[1], t.shape[2], 2, 2))
    a, b = tl.split(t2)
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    return a0, a1, b0, b1


@triton.jit
def _chain4(wq, x, acc, US: tl.constexpr, EMU: tl.constexpr):
    """acc + sum over the last axis (4 words) of dp4a(wq, x), chained through dp4a's addend.
    acc = None starts from 0. US: wq bytes unsigned (dp4a.u32.s32)."""
    w0, w1, w2, w3 = _q4(wq)
    x0, x1, x2, x3 = _q4(x)
    if acc is None:
        acc = w0 * 0
    if US:
        acc = dp4a_us(w3, x3, dp4a_us(w2, x2, dp4a_us(w1, x1, dp4a_us(w0, x0, acc, EMU), EMU),
                                      EMU), EMU)
    else:
        acc = dp4a(w3, x3, dp4a(w2, x2, dp4a(w1, x1, dp4a(w0, x0, acc, EMU), EMU), EMU), EMU)
    return acc


@triton.jit
def _ld(p, wi, A4: tl.constexpr):
    """Unmasked ldw: little-endian int32 words wi after byte pointers p (4- or 2-aligned)."""
    if A4:
        return tl.load(p.to(tl.pointer_type(tl.int32)) + wi)
    else:
        q = p.to(tl.pointer_type(tl.uint16)) + 2 * wi
        return tl.load(q).to(tl.int32) | (tl.load(q + 1).to(tl.int32) << 16)


@triton.jit
def _f16(p):
    return tl.load(p.to(tl.pointer_type(tl.float16))).to(tl.float32)


@triton.jit
def _byte(word, k):
    """Unsigned byte k (tensor) of word, as float32."""
    return ((word >> (8 * k)) & 255).to(tl.float32)


@triton.jit
def body_q45k(w, blk, ok, kbc, q32, xs_ptr, xsum_ptr, KW, P0, P1, P2, P3, Q5: tl.constexpr,
              PLANAR: tl.constexpr, NC: tl.constexpr, EMU: tl.constexpr):
    """[4 chunks c, 2 halves h, R, KB, 4 words]: chunk c holds group 2c (low nibbles) and 2c+1
    (high nibbles); half h its elements 16h..16h+15."""
    BB: tl.constexpr = 176 if Q5 else 144
    c5 = _x5(tl.arange(0, 4), 0)
    h5 = _x5(tl.arange(0, 2), 1)
    w5 = _x5(tl.arange(0, 4), 4)
    b5 = _b5(blk)
    wi = 4 * h5 + w5
    qs = _ld(fbase(w, P0, 48 if Q5 else 16, PLANAR) + b5 * (128 if PLANAR else BB), 8 * c5 + wi,
             True)
    lo = qs & M4
    hi = qs & MF0                                            # 16 x high nibble
    if Q5:
        qh = _ld(fbase(w, P1, 16, PLANAR) + b5 * (32 if PLANAR else BB), wi + 0 * c5, True)
        lo = lo | (((qh >> (2 * c5)) & M1) << 4)
        hi = ((qs >> 4) & M4) | (((qh >> (2 * c5 + 1)) & M1) << 4)
        SCB = fbase(w, P2, 4, PLANAR) + blk * (12 if PLANAR else BB)
        DDB = fbase(w, P3, 0, PLANAR) + blk * (4 if PLANAR else BB)
    else:
        SCB = fbase(w, P1, 4, PLANAR) + blk * (12 if PLANAR else BB)
        DDB = fbase(w, P2, 0, PLANAR) + blk * (4 if PLANAR else BB)
    # 6-bit scales/mins, SWAR: bytes of S0/S1 & 63 for sub-blocks 0-3, of S2 nibbles | S0/S1
    # top bits for 4-7; chunk c takes bytes 2(c&1), 2(c&1)+1 of the word of its half
    S0 = _b4(_ld(SCB, 0, True))
    S1 = _b4(_ld(SCB, 1, True))
    S2 = _b4(_ld(SCB, 2, True))
    dd = _ld(DDB, 0, True)
    d = _b4(tl.where(ok, lo_f16(dd), 0.0))
    dmin = _b4(tl.where(ok, lo_f16(dd >> 16), 0.0))
    c4 = _x4(tl.arange(0, 4), 0)
    h4 = _x4(tl.arange(0, 2), 1)
    SC = tl.where(c4 < 2, S0 & M3F, (S2 & M4) | ((S0 >> 2) & M30))       # [4, 1, R, KB]
    MN = tl.where(c4 < 2, S1 & M3F, ((S2 >> 4) & M4) | ((S1 >> 2) & M30))
    k4 = 2 * (c4 & 1)
    ws0 = d * _byte(SC, k4)                                  # group 2c
    ws1 = d * _byte(SC, k4 + 1)                              # group 2c + 1
    if not Q5:
        ws1 = ws1 * 0.0625                                   # hi carries 16 x the nibble
    wm = dmin * _byte(MN, k4 + h4)                           # [4, 2, R, KB]: group 2c + h
    kb4 = _b4(kbc)
    p0 = _z4(4, 2, blk.shape[0], blk.shape[1])
    p1 = p0
    for n in tl.static_range(NC):
        xb = q32 + n * KW + (kb4 * 64 + 16 * c4)[:, :, :, :, None] + wi
        il = _chain4(lo, tl.load(xb), None, False, EMU)     # [4, 2, R, KB]: group 2c, half h
        ih = _chain4(hi, tl.load(xb + 8), None, not Q5, EMU)  # group 2c + 1, half h
        xs0 = tl.load(xs_ptr + (kb4 * 8 + 2 * c4) * NC + n)
        xs1 = tl.load(xs_ptr + (kb4 * 8 + 2 * c4 + 1) * NC + n)
        # the min term once per (row, group): half h carries group 2c + h's
        xm = tl.load(xsum_ptr + (kb4 * 8 + 2 * c4 + h4) * NC + n)
        p = il.to(tl.float32) * (ws0 * xs0) + ih.to(tl.float32) * (ws1 * xs1) - wm * xm
        if n == 0:
            p0 = p
        else:
            p1 = p
    return p0, p1


@triton.jit
def body_iq4xs(w, blk, ok, kbc, q32, xs_ptr, KW, P0, P1, P2, PLANAR: tl.constexpr,
               NC: tl.constexpr, EMU: tl.constexpr):
    """[8 sub-blocks g, 2 pairs p, R, KB, 2 words j] (raw blocks are 136 bytes: 8-byte vectors);
    word i = 2p + j of sub-block g -> activation words 8g+i, 8g+4+i (decode order PERM 2)."""
    BB: tl.constexpr = 136
    g5 = _x5(tl.arange(0, 8), 0)
    p5 = _x5(tl.arange(0, 2), 1)
    j5 = _x5(tl.arange(0, 2), 4)
    i5 = 2 * p5 + j5
    qs = _ld(fbase(w, P0, 8, PLANAR) + _b5(blk) * (128 if PLANAR else BB),
             4 * g5 + i5, True)
    r0, r1 = lut_iq4_fast(qs, EMU)
    sl = _b4(_ld(fbase(w, P1, 4, PLANAR) + blk * (4 if PLANAR else BB), 0, True))
    dsh = _ld(fbase(w, P2, 0, PLANAR) + blk * (4 if PLANAR else BB), 0, True)
    d = _b4(tl.where(ok, lo_f16(dsh), 0.0))
    g4 = _x4(tl.arange(0, 8), 0)
    ls = ((sl >> (4 * g4)) & 15) | ((((_b4(dsh) >> 16) >> (2 * g4)) & 3) << 4)
    ws = d * (ls - 32).to(tl.float32)                            # [8, 1, R, KB]
    kb4 = _b4(kbc)
    r0a, r0b = tl.split(r0)
    r1a, r1b = tl.split(r1)
    p0 = _z4(8, 2, blk.shape[0], blk.shape[1])
    p1 = p0
    for n in tl.static_range(NC):
        xb = q32 + n * KW + (kb4 * 64 + 8 * g4)[:, :, :, :, None] + i5
        x0a, x0b = tl.split(tl.load(xb))
        x1a, x1b = tl.split(tl.load(xb + 4))
        isum = dp4a(r1b, x1b, dp4a(r1a, x1a, dp4a(r0b, x0b, dp4a(r0a, x0a, r0a * 0, EMU), EMU),
                                   EMU), EMU)                    # [8, 2, R, KB]
        p = isum.to(tl.float32) * (ws * tl.load(xs_ptr + (kb4 * 8 + g4) * NC + n))
        if n == 0:
            p0 = p
        else:
            p1 = p
    return p0, p1


@triton.jit
def body_q6k(w, blk, ok, kbc, q32, xs_ptr, KW, P0, P1, P2, P3, PLANAR: tl.constexpr,
             NC: tl.constexpr, EMU: tl.constexpr):
    """[4 (half h, gl), 2 sixteens f, R, KB, 4 words]: ql word 16h+8gl+4f+w holds groups gl
    (low nibbles) and gl+2 (high) of half h."""
    BB: tl.constexpr = 210
    t5 = _x5(tl.arange(0, 4), 0)           # 2h + gl
    f5 = _x5(tl.arange(0, 2), 1)
    w5 = _x5(tl.arange(0, 4), 4)
    h5 = t5 // 2
    l5 = t5 % 2
    b5 = _b5(blk)
    ql = _ld(fbase(w, P0, 0, PLANAR) + b5 * (128 if PLANAR else BB), 8 * t5 + 4 * f5 + w5,
             PLANAR)
    qh = _ld(fbase(w, P1, 128, PLANAR) + b5 * (64 if PLANAR else BB), 8 * h5 + 4 * f5 + w5,
             PLANAR)
    qa = _signed((ql & M4) | (((qh >> (2 * l5)) & M2) << 4), C20)
    qb = _signed(((ql >> 4) & M4) | (((qh >> (2 * l5 + 4)) & M2) << 4), C20)
    t4 = _x4(tl.arange(0, 4), 0)
    f4 = _x4(tl.arange(0, 2), 1)
    sa = 8 * (t4 // 2) + 2 * (t4 % 2) + f4                    # scale of group gl, sixteen f
    b4 = _b4(blk)
    scp = (fbase(w, P2, 192, PLANAR) + b4 * (16 if PLANAR else BB)).to(tl.pointer_type(tl.int8))
    d = _b4(tl.where(ok, _f16(fbase(w, P3, 208, PLANAR) + blk * (2 if PLANAR else BB)),
                     0.0))
    wa = d * tl.load(scp + sa).to(tl.float32)
    wb = d * tl.load(scp + sa + 4).to(tl.float32)
    kb4 = _b4(kbc)
    p0 = tl.zeros(wa.shape, tl.float32)
    p1 = p0
    for n in tl.static_range(NC):
        xb = q32 + n * KW + (kb4 * 64)[:, :, :, :, None] + 32 * h5 + 8 * l5 + 4 * f5 + w5
        ia = _chain4(qa, tl.load(xb), None, False, EMU)
        ib = _chain4(qb, tl.load(xb + 16), None, False, EMU)
        xa = tl.load(xs_ptr + (kb4 * 16 + sa) * NC + n)
        xc = tl.load(xs_ptr + (kb4 * 16 + sa + 4) * NC + n)
        p = ia.to(tl.float32) * (wa * xa) + ib.to(tl.float32) * (wb * xc)
        if n == 0:
            p0 = p
        else:
            p1 = p
    return p0, p1


@triton.jit
def body_q3k(w, blk, ok, kbc, q32, xs_ptr, KW, P0, P1, P2, P3, PLANAR: tl.constexpr,
             NC: tl.constexpr, EMU: tl.constexpr):
    """[2 halves h, 2 sixteens f, R, KB, 4 words]: qs word 8h+4f+w holds the 4 groups g of half
    h as crumbs; hm word 4f+w their high bits (bit 4h+g)."""
    BB: tl.constexpr = 110
    h5 = _x5(tl.arange(0, 2), 0)
    f5 = _x5(tl.arange(0, 2), 1)
    w5 = _x5(tl.arange(0, 4), 4)
    b5 = _b5(blk)
    qs = _ld(fbase(w, P0, 32, PLANAR) + b5 * (64 if PLANAR else BB), 8 * h5 + 4 * f5 + w5,
             PLANAR)
    hm = _ld(fbase(w, P1, 0, PLANAR) + b5 * (32 if PLANAR else BB), 4 * f5 + w5 + 0 * h5,
             PLANAR)
    h4 = _x4(tl.arange(0, 2), 0)
    f4 = _x4(tl.arange(0, 2), 1)
    b4 = _b4(blk)
    SCB = fbase(w, P2, 96, PLANAR) + b4 * (12 if PLANAR else BB)
    d = _b4(tl.where(ok, _f16(fbase(w, P3, 108, PLANAR) + blk * (2 if PLANAR else BB)),
                     0.0))
    kb4 = _b4(kbc)
    p0 = _z4(2, 2, blk.shape[0], blk.shape[1])
    p1 = p0
    for g in tl.static_range(4):
        q = _signed(((qs >> (2 * g)) & M2) | (((hm >> (4 * h5 + g)) & M1) << 2), C04)
        s = 8 * h4 + 2 * g + f4                                  # scale index [2, 2, R, KB]
        lo = (tl.load(SCB + 2 * g + f4).to(tl.int32) >> (4 * h4)) & 15
        hi = (tl.load(SCB + 8 + (2 * g + f4) % 4).to(tl.int32) >> (2 * (s // 4))) & 3
        ws = d * ((lo | (hi << 4)) - 32).to(tl.float32)
        for n in tl.static_range(NC):
            x = tl.load(q32 + n * KW + (kb4 * 64)[:, :, :, :, None] + 32 * h5 + 8 * g + 4 * f5
                        + w5)
            p = _chain4(q, x, None, False, EMU).to(tl.float32) * (
                ws * tl.load(xs_ptr + (kb4 * 16 + s) * NC + n))
            if n == 0:
                p0 += p
            else:
                p1 += p
    return p0, p1


@triton.jit
def body_q8_0(w, blk, ok, kbc, q32, xs_ptr, KW, P0, P1, PLANAR: tl.constexpr,
              NC: tl.constexpr, EMU: tl.constexpr):
    """[8 blocks j, 2 sixteens f, R, KB, 4 words] of the 256-element macro-block."""
    j5 = _x5(tl.arange(0, 8), 0)
    f5 = _x5(tl.arange(0, 2), 1)
    w5 = _x5(tl.arange(0, 4), 4)
    b5 = _b5(blk)
    j4 = _x4(tl.arange(0, 8), 0)
    b4 = _b4(blk)
    if PLANAR:
        q = _ld(w + P0.to(tl.int64) * 4 + b5 * 256, 8 * j5 + 4 * f5 + w5, True)
        d = _f16(w + P1.to(tl.int64) * 4 + (b4 * 8 + j4) * 2)
    else:   # 34-byte blocks: qs only 2-aligned
        q = _ld(w + 2 + (b5 * 8 + j5) * 34, 4 * f5 + w5, False)
        d = _f16(w + (b4 * 8 + j4) * 34)
    d = tl.where(_b4(ok), d, 0.0)
    kb4 = _b4(kbc)
    p0 = _z4(8, 2, blk.shape[0], blk.shape[1])
    p1 = p0
    for n in tl.static_range(NC):
        # full-shape pointers: a [1, KB, ...] load got a lane-spread layout of its own and a
        # shared-memory conversion in the loop (Triton 3.6)
        x = tl.load(tl.broadcast_to(q32 + n * KW + (kb4 * 64)[:, :, :, :, None] + 8 * j5
                                    + 4 * f5 + w5, q.shape))
        p = _chain4(q, x, None, False, EMU).to(tl.float32) * (
            d * tl.load(xs_ptr + (kb4 * 8 + j4) * NC + n))
        if n == 0:
            p0 = p
        else:
            p1 = p
    return p0, p1


@triton.jit
def gemv2s_kernel(w_ptr, q_ptr, xs_ptr, xsum_ptr, out_ptr, N, n_out, NB, P0, P1, P2, P3,
                  FMT: tl.constexpr, PLANAR: tl.constexpr, NC: tl.constexpr, R: tl.constexpr,
                  KB: tl.constexpr, SPLIT: tl.constexpr, EMU: tl.constexpr, U: tl.constexpr = 1,
                  PDL: tl.constexpr = False):
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * R + tl.arange(0, R)
    rowb = (tl.minimum(rows, n_out - 1).to(tl.int64) * NB)[:, None]     # [R, 1]
    kb_i = tl.arange(0, KB)[None, :]
    KW = NB * 64                                # int32 words per activation row
    q32 = q_ptr.to(tl.pointer_type(tl.int32))
    if FMT == 11:
        acc0 = _z4(2, 2, R, KB)
    elif FMT == 8 or FMT == 23:
        acc0 = _z4(8, 2, R, KB)
    else:
        acc0 = _z4(4, 2, R, KB)
    acc1 = acc0
    if PDL:      # the activations (q, xs, xsum) and the split-K buffer come from earlier kernels
        gdc_wait()
    # U chunks of KB blocks per iteration, unrolled into one basic block: their loads are
    # independent, so ptxas can issue all of them before the first dp4a (more bytes in flight
    # per thread; measured one chunk per iteration latency-bound, bench/RESULTS.md)
    for kb00 in range(pid_k * KB * U, NB, KB * SPLIT * U):
        for u in tl.static_range(U):
            kb = kb00 + u * KB + kb_i
            ok = kb < NB                            # [1, KB]
            kbc = tl.minimum(kb, NB - 1)
            blk = rowb + kbc                        # [R, KB]
            if FMT == 23:
                p0, p1 = body_iq4xs(w_ptr, blk, ok, kbc, q32, xs_ptr, KW, P0, P1, P2, PLANAR, NC,
                                    EMU)
            elif FMT == 12:
                p0, p1 = body_q45k(w_ptr, blk, ok, kbc, q32, xs_ptr, xsum_ptr, KW, P0, P1, P2, P3,
                                   False, PLANAR, NC, EMU)
            elif FMT == 13:
                p0, p1 = body_q45k(w_ptr, blk, ok, kbc, q32, xs_ptr, xsum_ptr, KW, P0, P1, P2, P3,
                                   True, PLANAR, NC, EMU)
            elif FMT == 14:
                p0, p1 = body_q6k(w_ptr, blk, ok, kbc, q32, xs_ptr, KW, P0, P1, P2, P3, PLANAR, NC,
                                  EMU)
            elif FMT == 11:
                p0, p1 = body_q3k(w_ptr, blk, ok, kbc, q32, xs_ptr, KW, P0, P1, P2, P3, PLANAR, NC,
                                  EMU)
            else:
                p0, p1 = body_q8_0(w_ptr, blk, ok, kbc, q32, xs_ptr, KW, P0, P1, PLANAR, NC, EMU)
            acc0 += p0
            if NC == 2:
                acc1 += p1
    if PDL:      # up to ~2 waves of programs: signal once the main loop is done
        gdc_launch_dependents()
    omask = rows < n_out
    obase = out_ptr + pid_k * N * n_out + rows
    tl.store(obase, _rows(acc0, FMT), mask=omask)
    if NC == 2:
        tl.store(obase + n_out, _rows(acc1, FMT), mask=omask)


@triton.jit
def _rows(acc, FMT: tl.constexpr):
    """Sum an accumulator (logical [fields..., R, KB]) over everything but its row dim."""
    if RF:
        return tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1)
    else:
        return tl.sum(tl.sum(tl.sum(acc, axis=0), axis=0), axis=1)


def pick_config_small(qtype: int, n: int, n_out: int, nb: int) -> dict:
    """R rows x KB macro-blocks per program; R*KB = 32 * num_warps puts one whole block in each
    thread's registers (the SASS-counted optimum, bench/NOTES.md); split-K so that >= ~2
    programs per SM of a 132-SM H200 exist."""
    R, KB, warps = 64, 2, 4
    tiles = triton.cdiv(n_out, R)
    split = 1
    chunks = triton.cdiv(nb, KB)
    while tiles * split < 264 and split * 2 <= chunks and split < 16:
        split *= 2
    u = 1
    if qtype in (23, 14) and split == 1 and tiles < 528 and chunks >= 4:
        # measured on the H200 (bench/RESULTS.md, session 2 call 2), raw blocks, 5120->17408:
        # IQ4_XS 29.4 -> 26.7 us and Q6_K 56.2 -> 46.9 us with two K-halves of two chunks each
        # (U=2, SPLIT=2); Q4_K / Q5_K gain nothing, and the 5120-row shapes (already split) lose.
        # That was with Triton 3.6's lanes-on-fields layout (3 blocks/SM); with the tiles'
        # rows-first order U=2 doubles the registers (IQ4_XS 96 -> 136, Q6_K 51 -> 102 at N=1,
        # gemv_regs), so keep the split, one chunk per iteration (to be re-timed on the device)
        split = 2
    # maxnreg: optional register cap passed to the compile (None: ptxas decides)
    return {"R": R, "KB": KB, "SPLIT": split, "num_warps": warps, "U": u, "maxnreg": None}


def gemv2_small_prepared(act, w, qtype: int, n_out: int, planar: bool, out, config: dict,
                         interpret: bool, workspace=None):
    """Launch of the small-N path on prepared activations (gemv2.gemv2_prepared routes here)."""
    import torch
    from tightfit.kernels import pdl
    from tightfit.kernels.gemv2 import _reduce_kernel
    from tightfit.kernels.gemv2_layout import field_args
    n, n_in = act.n, act.k
    if n > 2:
        raise ValueError(f"gemv v2 small-N path: N={n}, at most 2")
    nb = n_in // 256
    cfg = dict(pick_config_small(qtype, n, n_out, nb))
    cfg.update({k: v for k, v in (config or {}).items() if k in cfg})
    split = cfg["SPLIT"]
    if split == 1:
        dst = out
    elif workspace is not None:
        if workspace.numel() < split * n * n_out or workspace.dtype != torch.float32:
            raise ValueError(f"gemv v2 small-N: workspace of {workspace.numel()} elements, "
                             f"need {split * n * n_out} fp32")
        dst = workspace[:split * n * n_out].view(split, n, n_out)
    else:
        dst = torch.empty((split, n, n_out), dtype=torch.float32, device=w.device)
    P = field_args(qtype, w.numel(), planar)
    grid = (triton.cdiv(n_out, cfg["R"]), split)
    extra = {"maxnreg": int(cfg["maxnreg"])} if cfg.get("maxnreg") and not interpret else {}
    on = pdl.enabled(w.device)
    gemv2s_kernel[grid](w, act.q, act.xs, act.xsum, dst, n, n_out, nb, P[0], P[1], P[2], P[3],
                        FMT=qtype, PLANAR=bool(planar), NC=n, R=cfg["R"], KB=cfg["KB"],
                        SPLIT=split, EMU=interpret, U=cfg["U"], PDL=on, launch_pdl=on,
                        num_warps=cfg["num_warps"], **extra)
    if split > 1:
        total = n * n_out
        _reduce_kernel[(triton.cdiv(total, 1024),)](dst, out, total, SPLIT=split, BLOCK=1024,
                                                    PDL=on, launch_pdl=on)
    return out
