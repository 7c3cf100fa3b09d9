"""Per-macro-block GEMV bodies for the 256-element K-quants and IQ4_XS / TQ2_0.

Every body has the same contract (see gemv_kernel.py): `base` is a [R, KB] uint8 pointer tensor
to one 256-element weight block per (row, block) pair, `m` its mask; `A` is a tuple of activation
pointers/strides built by the kernel; the body adds this block's share of y[n, row] for all
n at once into `acc` [NP, R, KB]. Weights are decoded as 32-bit words (4 int8 lanes, SWAR) and
multiplied against int8 activations with dp4a; scales are applied once per 16 or 32 elements
(spec/quant-formats.md §2.3, "GEMV form"). Offsets such as Q6_K's -32 are taken out through the
activation sums instead of being subtracted per byte.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tightfit.kernels.gemv_prims import dp4a, prmt, ld_u8, ld_w32, ld_f16, i32

M4 = tl.constexpr(0x0F0F0F0F)
M2 = tl.constexpr(0x03030303)
M1 = tl.constexpr(0x01010101)


@triton.jit
def act_w(xa, km, KW, j: tl.constexpr):
    """Activation int8x4 word j of the current 256-block, all columns: [NP, R, KB]."""
    return tl.load(xa + j, mask=km, other=0)


@triton.jit
def act_d(dab, km, sb: tl.constexpr):
    """Activation scale of 32-element sub-block sb: [NP, R, KB] float32."""
    return tl.load(dab + sb, mask=km, other=0.0)


@triton.jit
def act_s16(s16b, km, g: tl.constexpr):
    """Sum of the quantized activations over 16-element group g, as float32."""
    return tl.load(s16b + g, mask=km, other=0).to(tl.float32)


@triton.jit
def _scale_k4(S0, S1, S2, j: tl.constexpr):
    """(scale, min) of sub-block j from the 12 K4 scale bytes held as 3 words (spec Q4_K)."""
    if j < 4:
        sc = (S0 >> (8 * j)) & 63
        mn = (S1 >> (8 * j)) & 63
    else:
        b8 = (S2 >> (8 * (j - 4))) & 255
        sc = (b8 & 15) | (((S0 >> (8 * (j - 4) + 6)) & 3) << 4)
        mn = ((b8 >> 4) & 15) | (((S1 >> (8 * (j - 4) + 6)) & 3) << 4)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def blk_q4k_q5k(base, m, xa, dab, s16b, km, acc, KW, Q5: tl.constexpr, EMU: tl.constexpr):
    d = ld_f16(base, m)
    dmin = ld_f16(base + 2, m)
    S0 = ld_w32(base + 4, m, True)
    S1 = ld_w32(base + 8, m, True)
    S2 = ld_w32(base + 12, m, True)
    QS: tl.constexpr = 48 if Q5 else 16
    for c in tl.static_range(4):
        il = tl.zeros(acc.shape, tl.int32)
        ih = tl.zeros(acc.shape, tl.int32)
        for i in tl.static_range(8):
            w = ld_w32(base + QS + 32 * c + 4 * i, m, True)
            lo = w & M4
            hi = (w >> 4) & M4
            if Q5:
                qh = ld_w32(base + 16 + 4 * i, m, True)
                lo = lo | (((qh >> (2 * c)) & M1) << 4)
                hi = hi | (((qh >> (2 * c + 1)) & M1) << 4)
            il = dp4a(lo[None, :, :], act_w(xa, km, KW, 16 * c + i), il, EMU)
            ih = dp4a(hi[None, :, :], act_w(xa, km, KW, 16 * c + 8 + i), ih, EMU)
        sc0, mn0 = _scale_k4(S0, S1, S2, 2 * c)
        sc1, mn1 = _scale_k4(S0, S1, S2, 2 * c + 1)
        s0 = act_s16(s16b, km, 4 * c) + act_s16(s16b, km, 4 * c + 1)
        s1 = act_s16(s16b, km, 4 * c + 2) + act_s16(s16b, km, 4 * c + 3)
        acc += act_d(dab, km, 2 * c) * (il.to(tl.float32) * (d * sc0)[None, :, :]
                                         - (dmin * mn0)[None, :, :] * s0)
        acc += act_d(dab, km, 2 * c + 1) * (ih.to(tl.float32) * (d * sc1)[None, :, :]
                                             - (dmin * mn1)[None, :, :] * s1)
    return acc


@triton.jit
def blk_q6k(base, m, xa, dab, s16b, km, acc, KW, EMU: tl.constexpr):
    d = ld_f16(base + 208, m)
    for h in tl.static_range(2):
        for g in tl.static_range(4):
            ia = tl.zeros(acc.shape, tl.int32)
            ib = tl.zeros(acc.shape, tl.int32)
            for i in tl.static_range(8):
                ql = ld_w32(base + 64 * h + 32 * (g % 2) + 4 * i, m, False)
                qh = ld_w32(base + 128 + 32 * h + 4 * i, m, False)
                q = ((ql >> (4 * (g // 2))) & M4) | (((qh >> (2 * g)) & M2) << 4)
                a = act_w(xa, km, KW, 32 * h + 8 * g + i)
                if i < 4:
                    ia = dp4a(q[None, :, :], a, ia, EMU)
                else:
                    ib = dp4a(q[None, :, :], a, ib, EMU)
            s = 8 * h + 2 * g
            sa = ((ld_u8(base + 192 + s, m) << 24) >> 24).to(tl.float32) * d
            sb = ((ld_u8(base + 193 + s, m) << 24) >> 24).to(tl.float32) * d
            # stored q is 0..63; the value is q - 32: subtract 32 * sum(activation) per 16
            acc += act_d(dab, km, 4 * h + g) * (
                (ia.to(tl.float32) - 32.0 * act_s16(s16b, km, s)) * sa[None, :, :]
                + (ib.to(tl.float32) - 32.0 * act_s16(s16b, km, s + 1)) * sb[None, :, :])
    return acc


@triton.jit
def _scale_q3k(base, m, s: tl.constexpr):
    lo = (ld_u8(base + 96 + (s % 8), m) >> (4 * (s // 8))) & 15
    hi = (ld_u8(base + 104 + (s % 4), m) >> (2 * (s // 4))) & 3
    return ((lo | (hi << 4)) - 32).to(tl.float32)


@triton.jit
def blk_q3k(base, m, xa, dab, s16b, km, acc, KW, EMU: tl.constexpr):
    d = ld_f16(base + 108, m)
    for h in tl.static_range(2):
        for g in tl.static_range(4):
            ia = tl.zeros(acc.shape, tl.int32)
            ib = tl.zeros(acc.shape, tl.int32)
            for i in tl.static_range(8):
                qs = ld_w32(base + 32 + 32 * h + 4 * i, m, False)
                hm = ld_w32(base + 4 * i, m, False)
                # low 2 bits | set high bit at bit 2: stored 0..7, value = stored - 4
                q = ((qs >> (2 * g)) & M2) | (((hm >> (4 * h + g)) & M1) << 2)
                a = act_w(xa, km, KW, 32 * h + 8 * g + i)
                if i < 4:
                    ia = dp4a(q[None, :, :], a, ia, EMU)
                else:
                    ib = dp4a(q[None, :, :], a, ib, EMU)
            s = 8 * h + 2 * g
            sa = _scale_q3k(base, m, s) * d
            sb = _scale_q3k(base, m, s + 1) * d
            acc += act_d(dab, km, 4 * h + g) * (
                (ia.to(tl.float32) - 4.0 * act_s16(s16b, km, s)) * sa[None, :, :]
                + (ib.to(tl.float32) - 4.0 * act_s16(s16b, km, s + 1)) * sb[None, :, :])
    return acc


@triton.jit
def blk_q2k_tq2(base, m, xa, dab, s16b, km, acc, KW, TQ2: tl.constexpr, EMU: tl.constexpr):
    """Q2_K (d*sc*q - dmin*m per 16) and TQ2_0 (d*(q-1)); both store crumb planes."""
    if TQ2:
        d = ld_f16(base + 64, m)
        QS: tl.constexpr = 0
    else:
        d = ld_f16(base + 80, m)
        dmin = ld_f16(base + 82, m)
        QS: tl.constexpr = 16
    for h in tl.static_range(2):
        for g in tl.static_range(4):
            ia = tl.zeros(acc.shape, tl.int32)
            ib = tl.zeros(acc.shape, tl.int32)
            for i in tl.static_range(8):
                q = (ld_w32(base + QS + 32 * h + 4 * i, m, not TQ2) >> (2 * g)) & M2
                a = act_w(xa, km, KW, 32 * h + 8 * g + i)
                if i < 4:
                    ia = dp4a(q[None, :, :], a, ia, EMU)
                else:
                    ib = dp4a(q[None, :, :], a, ib, EMU)
            s = 8 * h + 2 * g
            s0 = act_s16(s16b, km, s)
            s1 = act_s16(s16b, km, s + 1)
            if TQ2:
                acc += act_d(dab, km, 4 * h + g) * d[None, :, :] * (
                    ia.to(tl.float32) + ib.to(tl.float32) - s0 - s1)
            else:
                ba = ld_u8(base + s, m)
                bb = ld_u8(base + s + 1, m)
                acc += act_d(dab, km, 4 * h + g) * (
                    ia.to(tl.float32) * (d * (ba & 15).to(tl.float32))[None, :, :]
                    + ib.to(tl.float32) * (d * (bb & 15).to(tl.float32))[None, :, :]
                    - (dmin * (ba >> 4).to(tl.float32))[None, :, :] * s0
                    - (dmin * (bb >> 4).to(tl.float32))[None, :, :] * s1)
    return acc


# kvalues_iq4nl as four little-endian words, the operands of the prmt table lookup
_KV = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
KV_T = [i32(sum((_KV[4 * t + k] & 255) << (8 * k) for k in range(4))) for t in range(4)]
KV0 = tl.constexpr(KV_T[0])
KV1 = tl.constexpr(KV_T[1])
KV2 = tl.constexpr(KV_T[2])
KV3 = tl.constexpr(KV_T[3])
M7 = tl.constexpr(0x77777777)
M44 = tl.constexpr(0x44444444)
SEL = tl.constexpr(0x32103210)


@triton.jit
def lut_iq4(w, EMU: tl.constexpr):
    """8 nibbles -> two words of kvalues_iq4nl bytes. Word 0 holds the values of nibbles
    (lo b0, hi b0, lo b1, hi b1), word 1 those of bytes 2 and 3; the activations are stored in
    that order (quantize_act layout 1), so no byte shuffling is needed here.
    prmt only indexes 8 table bytes and treats selector bit 3 as 'replicate sign', so bit 3 is
    masked off for two 8-entry lookups and a third prmt picks lower or upper result per byte."""
    z = w * 0
    s7 = w & M7
    sel = ((w >> 1) & M44) | SEL
    t0 = z + KV0
    t1 = z + KV1
    t2 = z + KV2
    t3 = z + KV3
    r0 = prmt(prmt(t0, t1, s7, EMU), prmt(t2, t3, s7, EMU), sel, EMU)
    s7h = (s7 >> 16) & 0xFFFF
    selh = (sel >> 16) & 0xFFFF
    r1 = prmt(prmt(t0, t1, s7h, EMU), prmt(t2, t3, s7h, EMU), selh, EMU)
    return r0, r1


@triton.jit
def blk_iq4xs(base, m, xa, dab, s16b, km, acc, KW, EMU: tl.constexpr):
    d = ld_f16(base, m)
    sh = ld_w32(base, m, True) >> 16
    sl = ld_w32(base + 4, m, True)
    for ib in tl.static_range(8):
        isum = tl.zeros(acc.shape, tl.int32)
        for i in tl.static_range(4):
            r0, r1 = lut_iq4(ld_w32(base + 8 + 16 * ib + 4 * i, m, True), EMU)
            isum = dp4a(r0[None, :, :], act_w(xa, km, KW, 8 * ib + 2 * i), isum, EMU)
            isum = dp4a(r1[None, :, :], act_w(xa, km, KW, 8 * ib + 2 * i + 1), isum, EMU)
        ls = ((sl >> (4 * ib)) & 15) | (((sh >> (2 * ib)) & 3) << 4)
        acc += act_d(dab, km, ib) * isum.to(tl.float32) * (d * (ls - 32).to(tl.float32))[None, :, :]
    return acc
