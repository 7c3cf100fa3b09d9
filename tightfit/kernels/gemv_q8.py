"""GEMV bodies for the small-block formats: Q8_0, Q4_0, Q5_0, IQ4_NL (32), Q2_0 (64), Q1_0 (128),
and the base-3 ternary TQ1_0 (256, kept here with the other off-mix bit-plane formats).

The kernel always walks 256-element macro-blocks, so one body call covers 8, 4 or 2 GGUF blocks
(the block byte size is a multiple of 2, so words are read as two u16: ld_w32(..., False)).
Contract as in gemv_k.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tightfit.kernels.gemv_prims import dp4a, ld_w32, ld_f16, spread4
from tightfit.kernels.gemv_k import act_w, act_d, act_s16, lut_iq4, M4, M2, M1


@triton.jit
def blk_q8_0(base, m, xa, dab, s16b, km, acc, KW, EMU: tl.constexpr):
    for b in tl.static_range(8):
        d = ld_f16(base + 34 * b, m)
        isum = tl.zeros(acc.shape, tl.int32)
        for i in tl.static_range(8):
            w = ld_w32(base + 34 * b + 2 + 4 * i, m, False)
            isum = dp4a(w[None, :, :], act_w(xa, km, KW, 8 * b + i), isum, EMU)
        acc += act_d(dab, km, b) * isum.to(tl.float32) * d[None, :, :]
    return acc


@triton.jit
def blk_q4_0_q5_0(base, m, xa, dab, s16b, km, acc, KW, Q5: tl.constexpr, EMU: tl.constexpr):
    BB: tl.constexpr = 22 if Q5 else 18
    QS: tl.constexpr = 6 if Q5 else 2
    # offset of the codes; a constexpr assigned inside the unrolled loop below would be
    # "reassigned" on every iteration (a compile error)
    OFF: tl.constexpr = 16.0 if Q5 else 8.0
    for b in tl.static_range(8):
        d = ld_f16(base + BB * b, m)
        if Q5:
            qh = ld_w32(base + BB * b + 2, m, False)
        isum = tl.zeros(acc.shape, tl.int32)
        for i in tl.static_range(4):
            w = ld_w32(base + BB * b + QS + 4 * i, m, False)
            lo = w & M4
            hi = (w >> 4) & M4
            if Q5:
                lo = lo | (spread4(qh >> (4 * i)) << 4)
                hi = hi | (spread4(qh >> (16 + 4 * i)) << 4)
            isum = dp4a(lo[None, :, :], act_w(xa, km, KW, 8 * b + i), isum, EMU)
            isum = dp4a(hi[None, :, :], act_w(xa, km, KW, 8 * b + 4 + i), isum, EMU)
        s32 = act_s16(s16b, km, 2 * b) + act_s16(s16b, km, 2 * b + 1)
        acc += act_d(dab, km, b) * (isum.to(tl.float32) - OFF * s32) * d[None, :, :]
    return acc


@triton.jit
def blk_iq4nl(base, m, xa, dab, s16b, km, acc, KW, EMU: tl.constexpr):
    for b in tl.static_range(8):
        d = ld_f16(base + 18 * b, m)
        isum = tl.zeros(acc.shape, tl.int32)
        for i in tl.static_range(4):
            r0, r1 = lut_iq4(ld_w32(base + 18 * b + 2 + 4 * i, m, False), EMU)
            isum = dp4a(r0[None, :, :], act_w(xa, km, KW, 8 * b + 2 * i), isum, EMU)
            isum = dp4a(r1[None, :, :], act_w(xa, km, KW, 8 * b + 2 * i + 1), isum, EMU)
        acc += act_d(dab, km, b) * isum.to(tl.float32) * d[None, :, :]
    return acc


@triton.jit
def blk_q2_0(base, m, xa, dab, s16b, km, acc, KW, EMU: tl.constexpr):
    """Q2_0: codes c in 0..3 mean (c-1)*d, 4 consecutive crumbs per byte. Crumb plane g of
    word i holds elements 16i+4k+g (k = byte), matched by activation layout 2."""
    for b in tl.static_range(4):
        d = ld_f16(base + 18 * b, m)
        for i in tl.static_range(4):
            w = ld_w32(base + 18 * b + 2 + 4 * i, m, False)
            isum = tl.zeros(acc.shape, tl.int32)
            for g in tl.static_range(4):
                q = (w >> (2 * g)) & M2
                isum = dp4a(q[None, :, :], act_w(xa, km, KW, 16 * b + 4 * i + g), isum, EMU)
            acc += act_d(dab, km, 2 * b + i // 2) * (
                isum.to(tl.float32) - act_s16(s16b, km, 4 * b + i)) * d[None, :, :]
    return acc


@triton.jit
def blk_q1_0(base, m, xa, dab, s16b, km, acc, KW, EMU: tl.constexpr):
    """Q1_0: bit set = +d, clear = -d; value = d*(2*bit - 1). Bit plane p of word i holds
    elements 32i+8k+p (k = byte), matched by activation layout 3."""
    for b in tl.static_range(2):
        d = ld_f16(base + 18 * b, m)
        for i in tl.static_range(4):
            w = ld_w32(base + 18 * b + 2 + 4 * i, m, False)
            isum = tl.zeros(acc.shape, tl.int32)
            for p in tl.static_range(8):
                q = (w >> p) & M1
                isum = dp4a(q[None, :, :], act_w(xa, km, KW, 32 * b + 8 * i + p), isum, EMU)
            s32 = act_s16(s16b, km, 8 * b + 2 * i) + act_s16(s16b, km, 8 * b + 2 * i + 1)
            acc += act_d(dab, km, 4 * b + i) * (2.0 * isum.to(tl.float32) - s32) * d[None, :, :]
    return acc


@triton.jit
def _trit(w, n: tl.constexpr):
    """Trit n (0 = most significant) of each byte b of the word w, as bytes 0..2:
    (((b * 3^n) mod 256) * 3) >> 8 (spec TQ1_0). Even and odd bytes are worked on in 16-bit
    lanes (b * 81 * 3 < 2^16 and the upper lane stays below 2^31: no carries, no overflow)."""
    e = w & 0x00FF00FF
    o = (w >> 8) & 0x00FF00FF
    for _ in tl.static_range(n):
        e = (e * 3) & 0x00FF00FF
        o = (o * 3) & 0x00FF00FF
    return (((e * 3) >> 8) & 0x00030003) | ((((o * 3) >> 8) & 0x00030003) << 8)


@triton.jit
def blk_tq1_0(base, m, xa, dab, s16b, km, acc, KW, EMU: tl.constexpr):
    """TQ1_0: value d*(t-1), t in 0..2. Inside a stage 4 consecutive bytes hold trit n of 4
    consecutive elements, so each trit plane is a word of codes for natural-order activations
    (layout 0): stage 1 bytes 0..31, trit n -> elements 32n + byte; stage 2 bytes 32..47 ->
    160 + 16n + (byte - 32); qh bytes 48..51 -> 240 + 4n + (byte - 48). d at 52."""
    d = ld_f16(base + 52, m)
    for n in tl.static_range(5):
        isum = tl.zeros(acc.shape, tl.int32)
        for i in tl.static_range(8):
            q = _trit(ld_w32(base + 4 * i, m, False), n)
            isum = dp4a(q[None, :, :], act_w(xa, km, KW, 8 * n + i), isum, EMU)
        s32 = act_s16(s16b, km, 2 * n) + act_s16(s16b, km, 2 * n + 1)
        acc += act_d(dab, km, n) * (isum.to(tl.float32) - s32) * d[None, :, :]
    for n in tl.static_range(5):
        isum = tl.zeros(acc.shape, tl.int32)
        for i in tl.static_range(4):
            q = _trit(ld_w32(base + 32 + 4 * i, m, False), n)
            isum = dp4a(q[None, :, :], act_w(xa, km, KW, 40 + 4 * n + i), isum, EMU)
        acc += act_d(dab, km, 5 + n // 2) * (
            isum.to(tl.float32) - act_s16(s16b, km, 10 + n)) * d[None, :, :]
    wh = ld_w32(base + 48, m, False)
    isum = tl.zeros(acc.shape, tl.int32)
    for n in tl.static_range(4):
        isum = dp4a(_trit(wh, n)[None, :, :], act_w(xa, km, KW, 60 + n), isum, EMU)
    acc += act_d(dab, km, 7) * (isum.to(tl.float32) - act_s16(s16b, km, 15)) * d[None, :, :]
    return acc
