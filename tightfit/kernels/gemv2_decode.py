"""Per-format block decoders of GEMV v2 (SWAR on int32 words -> int8 tile for the tensor cores).

Contract of every `dec_*`: `w` is the weight byte pointer, `blk` an [RK, 1] int64 tensor of
block numbers (row * blocks_per_row + block), `m` its mask, P0..P3 the planar plane starts (in
4-byte units, see gemv2_layout), PLANAR the layout. Each returns
  A     int8  [RK, 256]  the 256 weights of each block, in natural element order (IQ4_XS: the
                         lookup order gemv2_act.perm_table(1) inside each 32), as integers whose
                         offsets are already removed (Q6_K q-32, Q3_K q-4 are signed int8 here);
  ws    fp32  [RK, 256/S] the full weight scale of each group (d * sub-scale);
  mins  fp32  [RK, 8]    Q4_K/Q5_K only: dmin * m of each 32 (subtracted times sum(x)).
Loads are [RK, words] tiles whose last dim is contiguous, so a warp reads whole 16-byte vectors
of one row's quant plane (raw IQ4_XS: 8 bytes; raw Q6_K/Q3_K: two 16-bit halves per word,
their blocks being 2-aligned).
"""
from __future__ import annotations

import triton
import triton.language as tl

from tightfit.kernels.gemv_prims import prmt, i32

M4 = tl.constexpr(0x0F0F0F0F)
M2 = tl.constexpr(0x03030303)
M1 = tl.constexpr(0x01010101)
H80 = tl.constexpr(i32(0x80808080))
C20 = tl.constexpr(0x20202020)
C04 = tl.constexpr(0x04040404)
# kvalues_iq4nl as four little-endian words: the prmt lookup table
_KV = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
_KVW = [i32(sum((_KV[4 * t + k] & 255) << (8 * k) for k in range(4))) for t in range(4)]
KV0 = tl.constexpr(_KVW[0])
KV1 = tl.constexpr(_KVW[1])
KV2 = tl.constexpr(_KVW[2])
KV3 = tl.constexpr(_KVW[3])
M7 = tl.constexpr(0x77777777)
M44 = tl.constexpr(0x44444444)
SEL = tl.constexpr(0x32103210)


@triton.jit
def fbase(w, P, RAWOFF: tl.constexpr, PLANAR: tl.constexpr):
    """Byte pointer of a field of block 0: the plane start, or the offset inside a raw block."""
    if PLANAR:
        return w + P.to(tl.int64) * 4
    else:
        return w + RAWOFF


@triton.jit
def ldw(p, wi, m, A4: tl.constexpr):
    """Little-endian int32 words wi (word index tensor) after byte pointers p (4-aligned when A4,
    else 2-aligned: two 16-bit loads). Indexing the typed pointer by the word index keeps the
    contiguity visible to Triton's vectorizer (16-byte loads)."""
    if A4:
        return tl.load(p.to(tl.pointer_type(tl.int32)) + wi, mask=m, other=0)
    else:
        q = p.to(tl.pointer_type(tl.uint16)) + 2 * wi
        lo = tl.load(q, mask=m, other=0).to(tl.int32)
        hi = tl.load(q + 1, mask=m, other=0).to(tl.int32)
        return lo | (hi << 16)


@triton.jit
def ldf16(p, m):
    return tl.load(p.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)


@triton.jit
def lo_f16(wd):
    """fp32 value of the fp16 held in the low 16 bits of an int32 word."""
    return (wd & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def to_bytes(words):
    """[RK, W] int32 -> [RK, 4W] int8, byte k of word i at position 4i+k (little-endian)."""
    b0 = words.to(tl.int8)
    b1 = (words >> 8).to(tl.int8)
    b2 = (words >> 16).to(tl.int8)
    b3 = (words >> 24).to(tl.int8)
    t = tl.join(tl.join(b0, b2), tl.join(b1, b3))         # [.., W, i, j] = byte 2i+j
    return tl.reshape(t, (words.shape[0], 4 * words.shape[1]))


@triton.jit
def _signed(q, OFF: tl.constexpr):
    """Bytes 0..127 minus OFF per byte, as int8 lanes, without borrows between bytes."""
    return ((q | H80) - OFF) ^ H80


@triton.jit
def lut_iq4(w, EMU: tl.constexpr):
    """8 nibbles -> 2 words of kvalues bytes: word 0 = (lo b0, hi b0, lo b1, hi b1), word 1 the
    same for bytes 2, 3. prmt indexes 8 table bytes (selector bit 3 = sign mode), so two
    8-entry lookups and a third prmt choosing per byte by nibble bit 3."""
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
def dec_iq4xs(w, blk, m, P0, P1, P2, PLANAR: tl.constexpr, EMU: tl.constexpr):
    RK: tl.constexpr = blk.shape[0]
    BB: tl.constexpr = 136
    wi = tl.arange(0, 32)[None, :]
    qs = ldw(fbase(w, P0, 8, PLANAR) + blk * (128 if PLANAR else BB), wi, m, True)
    r0, r1 = lut_iq4(qs, EMU)
    A = to_bytes(tl.reshape(tl.join(r0, r1), (RK, 64)))
    sl = ldw(fbase(w, P1, 4, PLANAR) + blk * (4 if PLANAR else BB), 0, m, True)
    dsh = ldw(fbase(w, P2, 0, PLANAR) + blk * (4 if PLANAR else BB), 0, m, True)
    d = lo_f16(dsh)
    sh = (dsh >> 16) & 0xFFFF
    j = tl.arange(0, 8)[None, :]
    ls = ((sl >> (4 * j)) & 15) | (((sh >> (2 * j)) & 3) << 4)
    return A, d * (ls - 32).to(tl.float32)


@triton.jit
def dec_q45k(w, blk, m, P0, P1, P2, P3, Q5: tl.constexpr, PLANAR: tl.constexpr):
    RK: tl.constexpr = blk.shape[0]
    BB: tl.constexpr = 176 if Q5 else 144
    c3 = tl.arange(0, 4)[None, :, None]
    w3 = tl.arange(0, 8)[None, None, :]
    b3 = blk[:, :, None]
    m3 = m[:, :, None]
    qs = ldw(fbase(w, P0, 48 if Q5 else 16, PLANAR) + b3 * (128 if PLANAR else BB),
             8 * c3 + w3, m3, True)                              # [RK, chunk, word]
    L = tl.permute(tl.join(qs & M4, (qs >> 4) & M4), (0, 1, 3, 2))      # [RK, c, half, word]
    if Q5:
        w4 = tl.arange(0, 8)[None, None, None, :]
        qh = ldw(fbase(w, P1, 16, PLANAR) + blk[:, :, None, None] * (32 if PLANAR else BB),
                 w4, m[:, :, None, None], True)                  # [RK, 1, 1, word]
        jt = (2 * tl.arange(0, 4)[:, None] + tl.arange(0, 2)[None, :])[None, :, :, None]
        L = L | (((qh >> jt) & M1) << 4)
    A = to_bytes(tl.reshape(L, (RK, 64)))
    if Q5:
        SCB = fbase(w, P2, 4, PLANAR) + blk * (12 if PLANAR else BB)
        DDB = fbase(w, P3, 0, PLANAR) + blk * (4 if PLANAR else BB)
    else:
        SCB = fbase(w, P1, 4, PLANAR) + blk * (12 if PLANAR else BB)
        DDB = fbase(w, P2, 0, PLANAR) + blk * (4 if PLANAR else BB)
    S0 = ldw(SCB, 0, m, True)
    S1 = ldw(SCB, 1, m, True)
    S2 = ldw(SCB, 2, m, True)
    dd = ldw(DDB, 0, m, True)
    d = lo_f16(dd)
    dmin = lo_f16(dd >> 16)
    j = tl.arange(0, 8)[None, :]
    jj = 8 * (j & 3)
    b8 = (S2 >> jj) & 255
    sc = tl.where(j < 4, (S0 >> jj) & 63, (b8 & 15) | (((S0 >> (jj + 6)) & 3) << 4))
    mn = tl.where(j < 4, (S1 >> jj) & 63, (b8 >> 4) | (((S1 >> (jj + 6)) & 3) << 4))
    return A, d * sc.to(tl.float32), dmin * mn.to(tl.float32)


@triton.jit
def dec_q6k(w, blk, m, P0, P1, P2, P3, PLANAR: tl.constexpr):
    RK: tl.constexpr = blk.shape[0]
    BB: tl.constexpr = 210
    b4 = blk[:, :, None, None]
    m4 = m[:, :, None, None]
    h4 = tl.arange(0, 2)[None, :, None, None]
    gl4 = tl.arange(0, 2)[None, None, :, None]
    w4 = tl.arange(0, 8)[None, None, None, :]
    ql = ldw(fbase(w, P0, 0, PLANAR) + b4 * (128 if PLANAR else BB), 16 * h4 + 8 * gl4 + w4,
             m4, PLANAR)                                      # [RK, h, gl, word]
    # ql byte t+32*gl of half h: low nibble = group gl, high nibble = group gl + 2
    L = tl.permute(tl.join(ql & M4, (ql >> 4) & M4), (0, 1, 4, 2, 3))   # [RK, h, gh, gl, word]
    L = tl.reshape(L, (RK, 2, 4, 8))                                    # [RK, h, g, word]
    qh = ldw(fbase(w, P1, 128, PLANAR) + b4 * (64 if PLANAR else BB), 8 * h4 + w4,
             m4, PLANAR)                                      # [RK, h, 1, word]
    g4 = tl.arange(0, 4)[None, None, :, None]
    q = _signed(L | (((qh >> (2 * g4)) & M2) << 4), C20)
    A = to_bytes(tl.reshape(q, (RK, 64)))
    s = tl.arange(0, 16)[None, :]
    sc = tl.load(fbase(w, P2, 192, PLANAR).to(tl.pointer_type(tl.int8))
                 + blk * (16 if PLANAR else BB) + s, mask=m, other=0)
    d = ldf16(fbase(w, P3, 208, PLANAR) + blk * (2 if PLANAR else BB), m)
    return A, d * sc.to(tl.float32)


@triton.jit
def dec_q3k(w, blk, m, P0, P1, P2, P3, PLANAR: tl.constexpr):
    RK: tl.constexpr = blk.shape[0]
    BB: tl.constexpr = 110
    b4 = blk[:, :, None, None]
    m4 = m[:, :, None, None]
    h4 = tl.arange(0, 2)[None, :, None, None]
    g4 = tl.arange(0, 4)[None, None, :, None]
    w4 = tl.arange(0, 8)[None, None, None, :]
    qs = ldw(fbase(w, P0, 32, PLANAR) + b4 * (64 if PLANAR else BB), 8 * h4 + w4,
             m4, PLANAR)                                      # [RK, h, 1, word]
    hm = ldw(fbase(w, P1, 0, PLANAR) + b4 * (32 if PLANAR else BB), w4,
             m4, PLANAR)                                      # [RK, 1, 1, word]
    # element 128h + 32g + t: low crumb g of qs[32h + t], high bit 4h+g of hm[t] (set = no -4)
    q = ((qs >> (2 * g4)) & M2) | (((hm >> (4 * h4 + g4)) & M1) << 2)
    A = to_bytes(tl.reshape(_signed(q, C04), (RK, 64)))
    s = tl.arange(0, 16)[None, :]
    SCB = fbase(w, P2, 96, PLANAR) + blk * (12 if PLANAR else BB)
    lo = (tl.load(SCB + (s % 8), mask=m, other=0).to(tl.int32) >> (4 * (s // 8))) & 15
    hi = (tl.load(SCB + 8 + (s % 4), mask=m, other=0).to(tl.int32) >> (2 * (s // 4))) & 3
    d = ldf16(fbase(w, P3, 108, PLANAR) + blk * (2 if PLANAR else BB), m)
    return A, d * ((lo | (hi << 4)) - 32).to(tl.float32)


@triton.jit
def dec_q8_0(w, blk, m, P0, P1, PLANAR: tl.constexpr):
    e = tl.arange(0, 256)[None, :]
    j = tl.arange(0, 8)[None, :]
    if PLANAR:
        A = tl.load((w + P0.to(tl.int64) * 4).to(tl.pointer_type(tl.int8)) + blk * 256 + e,
                    mask=m, other=0)
        d = ldf16(w + P1.to(tl.int64) * 4 + (blk * 8 + j) * 2, m)
    else:   # 34-byte blocks: qs only 2-aligned, read as 16-bit halves of words
        j3 = tl.arange(0, 8)[None, :, None]
        w3 = tl.arange(0, 8)[None, None, :]
        q = ldw(w + 2 + (blk[:, :, None] * 8 + j3) * 34, w3, m[:, :, None], False)
        A = to_bytes(tl.reshape(q, (blk.shape[0], 64)))
        d = ldf16(w + (blk * 8 + j) * 34, m)
    return A, d
