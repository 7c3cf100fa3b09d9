"""numba kernels behind tightfit.kernels.cpu_gemv: integer dot products on raw GGUF blocks.

Form (spec/quant-formats.md §2.3 "GEMV form", §3.8): the activations are quantized once per call
to int8 with one fp32 scale per 256 elements (`xq`, `xd`) plus int32 sums of every 16 codes
(`xs`, for the mins of Q2_K/Q4_K/Q5_K). Each 256-element weight block is decoded into 256 int16
"scaled codes" (sub-block scale times code, always |v| < 2^15) and one fp32 block factor; the
block's contribution to output b is then

    xd[b, blk] * (factor * sum_t code[t] * xq[b, t]  -  dmin * sum_s min[s] * xs[b, s])

with an exact int32 sum. The 32-element types (Q8_0, Q4_0, IQ4_NL) take a float path instead:
256 elements are decoded to fp32 with the block scale folded in and dotted with the fp32
activations (no activation quantization at all).

Speed rules learnt on numba 0.68 / LLVM (keep them when editing):
- every index into an array must be provably >= 0 to LLVM (range loop variables, literals,
  products of them), else numba's negative-index wraparound blocks vectorization (3-20x slower);
  block sizes are therefore literals in each decoder and the weight row index comes in as uint64;
- shifts by literals; narrow integer casts (numba widens int arithmetic to int64: re-narrow with
  np.int32(...) around the running sum so that LLVM emits 16-bit multiply-adds);
- one long loop (256 trips) per reduction; short reductions stay scalar.
"""
from __future__ import annotations

import os

import numpy as np
import numba
from numba import njit, prange

Q4_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 2, 8, 10, 11, 12, 13, 14
IQ2_XS, IQ3_XXS, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = 17, 18, 20, 21, 22, 23

#: types with an integer kernel (256-element blocks) and with the float kernel (32-element blocks)
INT_TYPES = (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS)
F32_TYPES = (Q8_0, Q4_0, IQ4_NL)
_HAS_MINS = (Q2_K, Q4_K, Q5_K)


@njit(inline="always")
def _f16(w, o, tab):
    return tab[np.int32(w[o]) | (np.int32(w[o + 1]) << 8)]


@njit(inline="always")
def _k4(w, s, j):
    """6-bit scale and min j of the 12-byte K4 packing at byte s (Q4_K, Q5_K)."""
    if j < 4:
        sc = np.int32(w[s + j]) & 63
        m = np.int32(w[s + j + 4]) & 63
    else:
        sc = (np.int32(w[s + j + 4]) & 15) | ((np.int32(w[s + j - 4]) >> 6) << 4)
        m = (np.int32(w[s + j + 4]) >> 4) | ((np.int32(w[s + j]) >> 6) << 4)
    return sc, m


# ---- 256-element decoders: buf[0:256] = int16 scaled codes, mins[0:16] = per-16 mins --------
# Each returns (factor, dmin); value = factor * code - dmin * min.

@njit(inline="always")
def _dec_q4_k(w, buf, mins, tab):
    for jj in range(4):
        sc0, m0 = _k4(w, 4, 2 * jj)
        sc1, m1 = _k4(w, 4, 2 * jj + 1)
        mins[4 * jj] = m0
        mins[4 * jj + 1] = m0
        mins[4 * jj + 2] = m1
        mins[4 * jj + 3] = m1
        s0 = np.int16(sc0)
        s1 = np.int16(sc1)
        for t in range(32):
            v = w[16 + 32 * jj + t]
            buf[64 * jj + t] = s0 * np.int16(v & 15)
            buf[64 * jj + 32 + t] = s1 * np.int16(v >> 4)
    return _f16(w, 0, tab), _f16(w, 2, tab)


@njit(inline="always")
def _dec_q5_k(w, buf, mins, tab):
    for jj in range(4):
        sc0, m0 = _k4(w, 4, 2 * jj)
        sc1, m1 = _k4(w, 4, 2 * jj + 1)
        mins[4 * jj] = m0
        mins[4 * jj + 1] = m0
        mins[4 * jj + 2] = m1
        mins[4 * jj + 3] = m1
        s0 = np.int16(sc0)
        s1 = np.int16(sc1)
        for t in range(32):
            v = np.int16(w[48 + 32 * jj + t])
            h = np.int16(w[16 + t]) >> (2 * jj)
            buf[64 * jj + t] = s0 * ((v & 15) | ((h & 1) << 4))
            buf[64 * jj + 32 + t] = s1 * ((v >> 4) | ((h & 2) << 3))
    return _f16(w, 0, tab), _f16(w, 2, tab)


@njit(inline="always")
def _dec_q6_k(w, buf, mins, tab):
    for h in range(2):
        for half in range(2):
            s = 8 * h + half
            sc0 = np.int16(np.int8(w[192 + s]))
            sc1 = np.int16(np.int8(w[194 + s]))
            sc2 = np.int16(np.int8(w[196 + s]))
            sc3 = np.int16(np.int8(w[198 + s]))
            for u in range(16):
                t = 16 * half + u
                l0 = np.int16(w[64 * h + t])
                l1 = np.int16(w[64 * h + 32 + t])
                hb = np.int16(w[128 + 32 * h + t])
                e = 128 * h + t
                buf[e] = sc0 * (((l0 & 15) | ((hb & 3) << 4)) - 32)
                buf[e + 32] = sc1 * (((l1 & 15) | ((hb & 12) << 2)) - 32)
                buf[e + 64] = sc2 * (((l0 >> 4) | (hb & 48)) - 32)
                buf[e + 96] = sc3 * (((l1 >> 4) | ((hb >> 2) & 48)) - 32)
    return _f16(w, 208, tab), np.float32(0.0)


@njit(inline="always")
def _q3_scale(w, s):
    lo = (np.int32(w[96 + s % 8]) >> (4 * (s // 8))) & 15
    hi = (np.int32(w[104 + s % 4]) >> (2 * (s // 4))) & 3
    return np.int16((lo | (hi << 4)) - 32)


@njit(inline="always")
def _dec_q3_k(w, buf, mins, tab):
    # one 32-trip loop per 128-half, per-16 scales chosen by select: 16-trip loops stay scalar
    for h in range(2):
        a0 = _q3_scale(w, 8 * h)
        a1 = _q3_scale(w, 8 * h + 2)
        a2 = _q3_scale(w, 8 * h + 4)
        a3 = _q3_scale(w, 8 * h + 6)
        b0 = _q3_scale(w, 8 * h + 1)
        b1 = _q3_scale(w, 8 * h + 3)
        b2 = _q3_scale(w, 8 * h + 5)
        b3 = _q3_scale(w, 8 * h + 7)
        for m in range(32):
            lo = m < 16
            q = np.int16(w[32 + 32 * h + m])
            hm = np.int16(w[m]) >> (4 * h)   # high bit clear = subtract 4
            e = 128 * h + m
            buf[e] = (a0 if lo else b0) * ((q & 3) - ((~hm & 1) << 2))
            buf[e + 32] = (a1 if lo else b1) * (((q >> 2) & 3) - ((~hm & 2) << 1))
            buf[e + 64] = (a2 if lo else b2) * (((q >> 4) & 3) - (~hm & 4))
            buf[e + 96] = (a3 if lo else b3) * (((q >> 6) & 3) - ((~hm & 8) >> 1))
    return _f16(w, 108, tab), np.float32(0.0)


@njit(inline="always")
def _dec_q2_k(w, buf, mins, tab):
    for s in range(16):
        mins[s] = np.int16(w[s]) >> 4
    for h in range(2):
        a0 = np.int16(w[8 * h]) & 15
        a1 = np.int16(w[8 * h + 2]) & 15
        a2 = np.int16(w[8 * h + 4]) & 15
        a3 = np.int16(w[8 * h + 6]) & 15
        b0 = np.int16(w[8 * h + 1]) & 15
        b1 = np.int16(w[8 * h + 3]) & 15
        b2 = np.int16(w[8 * h + 5]) & 15
        b3 = np.int16(w[8 * h + 7]) & 15
        for m in range(32):
            lo = m < 16
            q = np.int16(w[16 + 32 * h + m])
            e = 128 * h + m
            buf[e] = (a0 if lo else b0) * (q & 3)
            buf[e + 32] = (a1 if lo else b1) * ((q >> 2) & 3)
            buf[e + 64] = (a2 if lo else b2) * ((q >> 4) & 3)
            buf[e + 96] = (a3 if lo else b3) * (q >> 6)
    return _f16(w, 80, tab), _f16(w, 82, tab)


@njit(inline="always")
def _decode(qt, w, buf, mins, tab):
    # the IQ types run in gemv_iq (and IQ4_XS also in gemv_simd): gemv_int is the K-quants only
    if qt == Q4_K:
        return _dec_q4_k(w, buf, mins, tab)
    if qt == Q5_K:
        return _dec_q5_k(w, buf, mins, tab)
    if qt == Q6_K:
        return _dec_q6_k(w, buf, mins, tab)
    if qt == Q3_K:
        return _dec_q3_k(w, buf, mins, tab)
    return _dec_q2_k(w, buf, mins, tab)


def make_row_int(decode):
    """The row body of gemv_int over the K-quant decoder dispatch `decode` (cpu_gemv_lowbit builds
    it over Q2_K/Q3_K only: less to compile, the same code per type, the same bits)."""
    @njit(inline="always")
    def row_int(qt, wr, ts, xq, xd, xs, tab, buf, mins, acc):
        """acc[0:B] = raw K-quant row wr (nb blocks of ts bytes) times each activation row."""
        B = xq.shape[0]
        nb = xq.shape[1] // 256
        mins_used = qt == Q2_K or qt == Q4_K or qt == Q5_K
        for b in range(B):
            acc[b] = 0.0
        for ib in range(nb):
            # a view of the block: its indices are then literals + loop counters, provably >= 0
            f, dmin = decode(qt, wr[ib * ts:ib * ts + ts], buf, mins, tab)
            for b in range(B):
                isum = np.int32(0)
                for t in range(256):
                    isum = np.int32(isum + np.int32(buf[t]) * np.int32(xq[b, 256 * ib + t]))
                v = f * np.float32(isum)
                if mins_used:
                    msum = np.int32(0)
                    for s in range(16):
                        msum = np.int32(msum + np.int32(mins[s]) * xs[b, 16 * ib + s])
                    v -= dmin * np.float32(msum)
                acc[b] += xd[b, ib] * v
    return row_int


row_int = make_row_int(_decode)


@njit(parallel=True, fastmath=True, cache=True)
def gemv_int(qt, w, xq, xd, xs, y, tab, sbuf, smin, sacc):
    """y[b, r] = row r of the raw 256-block K-quant matrix w (M, row_bytes) times activation b.

    xq (B, K) int8, xd (B, K/256) fp32, xs (B, K/16) int32: see the module docstring.
    sbuf (T, 256) int16, smin (T, 16) int16, sacc (T, B) fp32: per-thread scratch (T = pool size).
    """
    M = w.shape[0]
    B = xq.shape[0]
    ts = w.shape[1] // (xq.shape[1] // 256)
    for r in prange(M):
        tid = numba.get_thread_id()
        acc = sacc[tid]
        row_int(qt, w[r], ts, xq, xd, xs, tab, sbuf[tid], smin[tid], acc)
        for b in range(B):
            y[b, r] = acc[b]


# ---- 32-element types: fp32 decode of up to 256 elements, fp32 dot ---------------------------

@njit(inline="always")
def _dec32x8(qt, w, fbuf, dsc, tab, kv):
    """Decode the 8 32-blocks at the start of w (bytes) into fbuf[0:256] (block scale folded in). One
    32-trip loop with all 8 blocks in its body: a thin 32-trip loop is fully unrolled by LLVM and
    then left scalar (the SLP vectorizer cannot prove fbuf and w apart)."""
    if qt == Q8_0:
        for i in range(8):
            dsc[i] = _f16(w, 34 * i, tab)
        for t in range(32):
            for i in range(8):
                fbuf[32 * i + t] = dsc[i] * np.float32(np.int8(w[34 * i + 2 + t]))
    elif qt == Q4_0:
        for i in range(8):
            dsc[i] = _f16(w, 18 * i, tab)
        for t in range(16):
            for i in range(8):
                v = np.int32(w[18 * i + 2 + t])
                fbuf[32 * i + t] = dsc[i] * np.float32((v & 15) - 8)
                fbuf[32 * i + 16 + t] = dsc[i] * np.float32((v >> 4) - 8)
    else:  # IQ4_NL
        for i in range(8):
            dsc[i] = _f16(w, 18 * i, tab)
        for t in range(16):
            for i in range(8):
                v = w[18 * i + 2 + t]
                fbuf[32 * i + t] = dsc[i] * np.float32(kv[v & 15])
                fbuf[32 * i + 16 + t] = dsc[i] * np.float32(kv[v >> 4])


@njit(inline="always")
def _dec32(qt, w, fbuf, tab, kv):
    """Decode the one 32-block at the start of w into fbuf[0:32] (the < 8-block tail of a row)."""
    d = _f16(w, 0, tab)
    if qt == Q8_0:
        for t in range(32):
            fbuf[t] = d * np.float32(np.int8(w[2 + t]))
    else:
        for t in range(16):
            v = np.int32(w[2 + t])
            if qt == Q4_0:
                fbuf[t] = d * np.float32((v & 15) - 8)
                fbuf[16 + t] = d * np.float32((v >> 4) - 8)
            else:
                fbuf[t] = d * np.float32(kv[v & 15])
                fbuf[16 + t] = d * np.float32(kv[v >> 4])


@njit(parallel=True, fastmath=True, cache=True)
def gemv_f32(qt, w, x, y, tab, kv, sfbuf, sdsc, sacc):
    """y[b, r] = row r of the raw 32-block matrix w times x[b] (fp32). sfbuf (T, 256) and
    sdsc (T, 8) fp32 scratch (whole rows by thread id: a sliced row would lose its 'C' layout)."""
    M = w.shape[0]
    B = x.shape[0]
    nblk = x.shape[1] // 32
    nc = nblk // 8
    ts = w.shape[1] // nblk
    for r in prange(M):
        tid = numba.get_thread_id()
        fbuf = sfbuf[tid]
        dsc = sdsc[tid]
        acc = sacc[tid]
        for b in range(B):
            acc[b] = 0.0
        wr = w[r]
        for c in range(nc):
            _dec32x8(qt, wr[8 * ts * c:8 * ts * (c + 1)], fbuf, dsc, tab, kv)
            for b in range(B):
                s = np.float32(0.0)
                for t in range(256):
                    s += fbuf[t] * x[b, 256 * c + t]
                acc[b] += s
        for blk in range(8 * nc, nblk):
            _dec32(qt, wr[ts * blk:ts * (blk + 1)], fbuf, tab, kv)
            for b in range(B):
                s = np.float32(0.0)
                for t in range(32):
                    s += fbuf[t] * x[b, 32 * blk + t]
                acc[b] += s
        for b in range(B):
            y[b, r] = acc[b]


@njit(fastmath=True, cache=True)
def quantize_act(x, xq, xd, xs):
    """x (B, K) fp32 -> xq int8 codes, xd fp32 scale per 256 (amax/127), xs int32 sum per 16."""
    B, K = x.shape
    for b in range(B):
        for ib in range(K // 256):
            amax = np.float32(0.0)
            for t in range(256):
                amax = max(amax, abs(x[b, 256 * ib + t]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if amax > 0 else np.float32(0.0)
            xd[b, ib] = d
            for t in range(256):
                xq[b, 256 * ib + t] = np.int8(np.rint(x[b, 256 * ib + t] * inv))
            for s in range(16):
                acc = np.int32(0)
                for t in range(16):
                    acc += np.int32(xq[b, 256 * ib + 16 * s + t])
                xs[b, 16 * ib + s] = acc


# ---- IQ types: table decode into int8 codes + per-element int16 scales ------------------------
# A decode of one int16 per element from the 2-D grid/sign tables (two table reads per element) is
# left scalar by LLVM: 0.3-1 GB/s (that was gemv_int's IQ path, since removed). Here each block
# is decoded 8 codes at a time with 64-bit words:
#   * IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S: the grid row (8 bytes, or two 4-byte rows for IQ3) is one
#     uint64 load from `g64`; the signs are one uint64 byte mask from `m64` (0xFF = negative), and
#     (g ^ m) + (m & 0x01..01) negates the masked bytes. Grid bytes are never 0, so no byte
#     carries into the next one (checked when the tables are built).
#   * IQ4_XS: one uint16 load per weight byte from `p16` = (kv[lo], kv[hi]) as two int8; the
#     activations are permuted once per call so that code pair t of a 32-group meets
#     (x[t], x[16 + t]) (`permute_iq4`).
# The sub-block scales go to `sc` (256 int16, filled by short broadcast loops) and the dot
# sum_t int16(code[t]) * sc[t] * xq[t] is one long vectorizable int32 reduction.
_LOW = np.uint64(0x0101010101010101)
IQ_TYPES = (IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS)


def iq_tables(grids: dict, kv: np.ndarray) -> dict:
    """Per type (g64, m64, p16) for gemv_iq. grids: type -> (grid (n, 8|4) uint8 magnitudes,
    sign rows (128|256, 8) int16 +-1), as cpu_gemv builds them; kv the 16 IQ4 values."""
    out = {}
    for qt, (grid, sgn) in grids.items():
        g = np.ascontiguousarray(grid, dtype=np.uint8)
        if (g == 0).any():
            raise ValueError("an IQ grid byte is 0: the sign trick needs nonzero magnitudes")
        g64 = np.zeros(len(g), np.uint64)
        for i in range(g.shape[1]):
            g64 |= g[:, i].astype(np.uint64) << np.uint64(8 * i)
        neg = (np.asarray(sgn) < 0).astype(np.uint64) * np.uint64(0xFF)
        m64 = np.zeros(len(neg), np.uint64)
        for i in range(8):
            m64 |= neg[:, i] << np.uint64(8 * i)
        out[qt] = (g64, m64, np.zeros(1, np.uint64))
    b = np.arange(256)
    kv8 = np.asarray(kv, dtype=np.int64).astype(np.int8).view(np.uint8).astype(np.uint64)
    p16 = kv8[b & 15] | (kv8[b >> 4] << np.uint64(8))
    out[IQ4_XS] = (np.zeros(1, np.uint64), np.zeros(1, np.uint64), p16.astype(np.uint64))
    return out


def permute_iq4(xq: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[:, 32g + 2t + h] = xq[:, 32g + 16h + t]: the code order of gemv_iq's IQ4_XS decode."""
    B, K = xq.shape
    out.reshape(B, K // 32, 16, 2)[:] = xq.reshape(B, K // 32, 2, 16).transpose(0, 1, 3, 2)
    return out


@njit(inline="always")
def _u16(w, o):
    return np.int32(w[o]) | (np.int32(w[o + 1]) << 8)


@njit(inline="always")
def _neg(g, m):
    return (g ^ m) + (m & _LOW)


@njit(inline="always")
def _fill(sc, o, n, v):
    """sc (int16 scales viewed as uint64, 4 per word): words o..o+n/4 = four copies of v. Four
    scales per store: element-wise int16 fill loops stay scalar and cost most of the decode."""
    x = np.uint64(np.int64(v) & 0xFFFF) * np.uint64(0x0001000100010001)
    for t in range(n // 4):
        sc[o // 4 + t] = x


@njit(inline="always")
def _iqdec_iq2_xs(w, b64, sc, g64, m64, p16):
    for j in range(8):
        sb = np.int16(w[66 + j])
        _fill(sc, 32 * j, 16, np.int16(2 * (sb & 15) + 1))
        _fill(sc, 32 * j + 16, 16, np.int16(2 * (sb >> 4) + 1))
        for l in range(4):
            q = _u16(w, 2 + 8 * j + 2 * l)
            b64[4 * j + l] = _neg(g64[q & 511], m64[q >> 9])
    return np.float32(0.125)


@njit(inline="always")
def _iqdec_iq2_s(w, b64, sc, g64, m64, p16):
    for j in range(8):
        sb = np.int16(w[74 + j])
        _fill(sc, 32 * j, 16, np.int16(2 * (sb & 15) + 1))
        _fill(sc, 32 * j + 16, 16, np.int16(2 * (sb >> 4) + 1))
        qh = np.int32(w[66 + j])
        for l in range(4):
            gi = np.int32(w[2 + 4 * j + l]) | (((qh >> (2 * l)) & 3) << 8)
            b64[4 * j + l] = _neg(g64[gi], m64[w[34 + 4 * j + l]])
    return np.float32(0.125)


@njit(inline="always")
def _iqdec_iq3_xxs(w, b64, sc, g64, m64, p16):
    for j in range(8):
        a = (np.uint32(w[66 + 4 * j]) | (np.uint32(w[67 + 4 * j]) << 8)
             | (np.uint32(w[68 + 4 * j]) << 16) | (np.uint32(w[69 + 4 * j]) << 24))
        _fill(sc, 32 * j, 32, np.int16(2 * (a >> 28) + 1))
        for l in range(4):
            g = g64[w[2 + 8 * j + 2 * l]] | (g64[w[3 + 8 * j + 2 * l]] << np.uint64(32))
            b64[4 * j + l] = _neg(g, m64[(a >> (7 * l)) & 127])
    return np.float32(0.25)


@njit(inline="always")
def _iqdec_iq3_s(w, b64, sc, g64, m64, p16):
    for j in range(8):
        _fill(sc, 32 * j, 32, np.int16(1 + 2 * ((np.int32(w[106 + j // 2]) >> (4 * (j % 2))) & 15)))
        qh = np.int32(w[66 + j])
        for l in range(4):
            g1 = np.int32(w[2 + 8 * j + 2 * l]) | (((qh >> (2 * l)) & 1) << 8)
            g2 = np.int32(w[3 + 8 * j + 2 * l]) | (((qh >> (2 * l + 1)) & 1) << 8)
            g = g64[g1] | (g64[g2] << np.uint64(32))
            b64[4 * j + l] = _neg(g, m64[w[74 + 4 * j + l]])
    return np.float32(1.0)


@njit(inline="always")
def _iqdec_iq4_xs(w, b64, sc, g64, m64, p16):
    sh = np.int32(w[2]) | (np.int32(w[3]) << 8)
    for j in range(8):
        ls = ((np.int32(w[4 + j // 2]) >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)
        _fill(sc, 32 * j, 32, np.int16(ls - 32))
        for l in range(4):
            o = 8 + 16 * j + 4 * l
            b64[4 * j + l] = (p16[w[o]] | (p16[w[o + 1]] << np.uint64(16))
                              | (p16[w[o + 2]] << np.uint64(32)) | (p16[w[o + 3]] << np.uint64(48)))
    return np.float32(1.0)


@njit(inline="always")
def _iqdec(qt, w, b64, sc, g64, m64, p16):
    if qt == IQ2_XS:
        return _iqdec_iq2_xs(w, b64, sc, g64, m64, p16)
    if qt == IQ2_S:
        return _iqdec_iq2_s(w, b64, sc, g64, m64, p16)
    if qt == IQ3_XXS:
        return _iqdec_iq3_xxs(w, b64, sc, g64, m64, p16)
    if qt == IQ3_S:
        return _iqdec_iq3_s(w, b64, sc, g64, m64, p16)
    return _iqdec_iq4_xs(w, b64, sc, g64, m64, p16)


def make_row_iq(iqdec):
    """The row body of gemv_iq over the IQ decoder dispatch `iqdec` (as make_row_int); the
    block's int32 dot in AVX2 IR where the host has it (_bd_codes: the same exact integer)."""
    simd = HAVE_AVX2 and os.environ.get("TIGHTFIT_CPU_SIMD", "1") != "0"

    @njit(inline="always")
    def row_iq(qt, wr, ts, xq, xd, tab, g64, m64, p16, b8, b64, sc, sc64, acc):
        """acc[0:B] = raw IQ row wr times each activation row (xq permuted for IQ4_XS)."""
        B = xq.shape[0]
        nb = xq.shape[1] // 256
        for b in range(B):
            acc[b] = 0.0
        for ib in range(nb):
            blk = wr[ib * ts:ib * ts + ts]
            f = iqdec(qt, blk, b64, sc64, g64, m64, p16) * _f16(blk, 0, tab)
            for b in range(B):
                if simd:
                    isum = _bd_codes(b8, xq[b], np.int64(256 * ib), sc)
                else:
                    isum = np.int32(0)
                    for t in range(256):
                        isum = np.int32(isum + np.int32(np.int16(b8[t]) * sc[t])
                                        * np.int32(xq[b, 256 * ib + t]))
                acc[b] += xd[b, ib] * (f * np.float32(isum))
    return row_iq


@njit(parallel=True, fastmath=True, cache=True)
def gemv_iq(qt, w, xq, xd, y, tab, g64, m64, p16, sb8, sb64, ssc, ssc64, sacc):
    """y[b, r] for the IQ types above. sb8 (T, 256) int8 and sb64 (T, 32) uint64 are two views
    of the same per-thread code buffer; ssc (T, 256) int16 and ssc64 (T, 64) uint64 two views of
    the per-element scales; sacc (T, B) fp32."""
    M = w.shape[0]
    B = xq.shape[0]
    ts = w.shape[1] // (xq.shape[1] // 256)
    for r in prange(M):
        tid = numba.get_thread_id()
        acc = sacc[tid]
        row_iq(qt, w[r], ts, xq, xd, tab, g64, m64, p16, sb8[tid], sb64[tid], ssc[tid],
               ssc64[tid], acc)
        for b in range(B):
            y[b, r] = acc[b]


# ---- AVX2 block kernels (issue 5): explicit SIMD through numba intrinsics ---------------------
# LLVM does not vectorize the nibble -> codebook lookup of IQ4_XS (it becomes scalar table loads)
# and widens the numba decode loops to 64-bit lanes; the host GEMV then ran at 1-2.5 GB/s per
# core. Here each 256-element block is one integer dot product written in LLVM IR with the
# x86 byte instructions llama.cpp's CPU path uses:
#   codes (32 unsigned bytes per 32-run, unpacked with and/shift/or on whole vectors; IQ4_XS:
#   vpshufb on the 16-entry codebook, then |v| and the sign moved onto x)
#   -> vpmaddubsw(codes, xq)        16 int16 pair sums (|pair| <= 2*63*127 < 2^15: no saturation)
#   -> vpmaddwd(pairs, scales16)    8 int32, the sub-block scale applied (and the pairs summed)
#   -> int32 accumulate over the block, one horizontal add per block.
# The scales come from a 16-entry int16 row (`sc`, one per 16 elements) that the numba code fills
# per block; the sub-block minimums / Q6_K's -32 offset use the per-16 activation sums `xs`.
# Needs AVX2 (`HAVE_AVX2`); otherwise cpu_gemv keeps gemv_int / gemv_iq.
from llvmlite import ir as _ir
from numba import types as _nt
from numba.core import cgutils as _cg
from numba.extending import intrinsic as _intrinsic


def _host_avx2() -> bool:
    try:
        import llvmlite.binding as ll
        from numba.core import config
        if config.CPU_NAME not in (None, "host") or config.CPU_FEATURES:
            return False    # a generic / fixed target (e.g. for a portable cache): no AVX2 IR
        return bool(ll.get_host_cpu_features().get("avx2", False))
    except Exception:  # pragma: no cover
        return False


HAVE_AVX2 = _host_avx2()
SIMD_TYPES = (Q4_K, Q5_K, Q6_K, IQ4_XS) if HAVE_AVX2 else ()

_I8, _I16, _I32, _I64 = (_ir.IntType(n) for n in (8, 16, 32, 64))
_V16B, _V32B = _ir.VectorType(_I8, 16), _ir.VectorType(_I8, 32)
_V16W, _V8D = _ir.VectorType(_I16, 16), _ir.VectorType(_I32, 8)


def _splat8(v, n=32):
    return _ir.Constant(_ir.VectorType(_I8, n), [v] * n)


def _data(context, builder, aty, aval):
    return context.make_array(aty)(context, builder, aval).data


def _load(builder, p, off, vt, et=_I8):
    """Unaligned vector load of type vt at element offset off (a Python int or an i64 value)."""
    o = off if isinstance(off, _ir.Value) else _ir.Constant(_I64, off)
    return builder.load(builder.gep(p, [o], source_etype=et), typ=vt, align=1)


def _block_dot_codegen(kind):
    """codegen of an intrinsic (blk uint8[ts], xq int8[K], xoff int64, sc int16[>=16]) -> int32:
    sum_e code[e] * sc[e // 16] * xq[xoff + e] over the 256 elements of the block at blk[0]
    (code = the unsigned code, or for IQ4_XS the signed codebook value)."""
    def codegen(context, builder, sig, args):
        blk, xq, xoff, sc = args
        pw = _data(context, builder, sig.args[0], blk)
        px = builder.gep(_data(context, builder, sig.args[1], xq), [xoff], source_etype=_I8)
        ps = _data(context, builder, sig.args[3], sc)
        mod = builder.module
        maddubs = _cg.get_or_insert_function(mod, _ir.FunctionType(_V16W, [_V32B, _V32B]),
                                             "llvm.x86.avx2.pmadd.ub.sw")
        maddwd = _cg.get_or_insert_function(mod, _ir.FunctionType(_V8D, [_V16W, _V16W]),
                                            "llvm.x86.avx2.pmadd.wd")
        reduce = _cg.get_or_insert_function(mod, _ir.FunctionType(_I32, [_V8D]),
                                            "llvm.vector.reduce.add.v8i32")
        cat = _ir.Constant(_ir.VectorType(_I32, 32), list(range(32)))
        lo8 = _ir.Constant(_ir.VectorType(_I32, 16), [0] * 8 + [1] * 8)

        def scales(c):   # <16 x i16>: sc[2c] in lanes 0-7 (the run's elements 0-15), sc[2c+1] 8-15
            if kind == 0:    # per-element scales: those of elements 32c and 32c + 16
                two = _ir.Constant(_ir.VectorType(_I16, 2), None)
                for i in range(2):
                    v = builder.load(builder.gep(ps, [_ir.Constant(_I64, 32 * c + 16 * i)],
                                                 source_etype=_I16), typ=_I16)
                    two = builder.insert_element(two, v, _ir.Constant(_I32, i))
            else:
                two = _load(builder, ps, 2 * c, _ir.VectorType(_I16, 2), _I16)
            return builder.shuffle_vector(two, two, lo8)

        codes = []       # (chunk c, <32 x i8> codes, signed?)
        if kind == 0:    # gemv_iq's decoded signed codes (|code| <= 62), blk = the int8 buffer
            codes = [(j, _load(builder, pw, 32 * j, _V32B), True) for j in range(8)]
        elif kind == IQ4_XS:
            pshufb = _cg.get_or_insert_function(mod, _ir.FunctionType(_V32B, [_V32B, _V32B]),
                                                "llvm.x86.avx2.pshuf.b")
            kv = [int(v) for v in (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53,
                                   69, 89, 113)]
            tbl = _ir.Constant(_V32B, kv + kv)
            for j in range(8):
                q = _load(builder, pw, 8 + 16 * j, _V16B)
                idx = builder.shuffle_vector(builder.and_(q, _splat8(15, 16)),
                                             builder.lshr(q, _splat8(4, 16)), cat)
                codes.append((j, builder.call(pshufb, [tbl, idx]), True))
        elif kind in (Q4_K, Q5_K):
            qs = 16 if kind == Q4_K else 48
            qh = _load(builder, pw, 16, _V32B) if kind == Q5_K else None
            for jj in range(4):
                q = _load(builder, pw, qs + 32 * jj, _V32B)
                for half in range(2):
                    c = 2 * jj + half
                    v = builder.and_(q, _splat8(15)) if half == 0 else builder.lshr(q, _splat8(4))
                    if qh is not None:   # bit c of qh[t] is bit 4 of element 32c + t
                        hb = builder.and_(qh, _splat8(1 << c))
                        set_ = builder.icmp_unsigned("!=", hb, _splat8(0))
                        v = builder.or_(v, builder.select(set_, _splat8(16), _splat8(0)))
                    codes.append((c, v, False))
        else:  # Q6_K: unsigned 6-bit codes, the -32 is applied by the caller
            for h in range(2):
                a = _load(builder, pw, 64 * h, _V32B)
                b = _load(builder, pw, 64 * h + 32, _V32B)
                hh = _load(builder, pw, 128 + 32 * h, _V32B)
                for g in range(4):
                    low = a if g % 2 == 0 else b
                    low = builder.and_(low, _splat8(15)) if g < 2 else builder.lshr(low, _splat8(4))
                    hi = builder.and_(builder.shl(builder.lshr(hh, _splat8(2 * g)), _splat8(4)),
                                      _splat8(48)) if g else \
                        builder.shl(builder.and_(hh, _splat8(3)), _splat8(4))
                    codes.append((4 * h + g, builder.or_(low, hi), False))
        acc = _ir.Constant(_V8D, [0] * 8)
        zero = _splat8(0)
        for c, v, signed in codes:
            x = _load(builder, px, 32 * c, _V32B)
            if signed:   # vpmaddubsw wants the weights unsigned: |v| * (sign(v) x)
                neg = builder.icmp_signed("<", v, zero)
                x = builder.select(neg, builder.sub(zero, x), x)
                v = builder.select(neg, builder.sub(zero, v), v)
            acc = builder.add(acc, builder.call(maddwd, [builder.call(maddubs, [v, x]), scales(c)]))
        return builder.call(reduce, [acc])
    return codegen


def _make_block_dot(kind):
    @_intrinsic
    def block_dot(tyctx, blk, xq, xoff, sc):
        return _nt.int32(blk, xq, xoff, sc), _block_dot_codegen(kind)
    return block_dot


_bd_iq4_xs = _make_block_dot(IQ4_XS)
_bd_q4_k = _make_block_dot(Q4_K)
_bd_q5_k = _make_block_dot(Q5_K)
_bd_q6_k = _make_block_dot(Q6_K)
#: (b8 int8[256] signed codes, xq row, xoff, sc int16[256] per-element scales) -> int32: the
#: IQ grid types' block dot of gemv_iq (sc constant over each 16, as their decoders fill it)
_bd_codes = _make_block_dot(0)
row_iq = make_row_iq(_iqdec)


@njit(inline="always")
def _simd_block(qt, blk, xq, xoff, xs, soff, sc, tab):
    """Fill sc with blk's per-16 scales and return blk . xq[xoff:xoff+256] / xd as fp32."""
    if qt == IQ4_XS:
        sh = np.int32(blk[2]) | (np.int32(blk[3]) << 8)
        for j in range(8):
            ls = ((np.int32(blk[4 + j // 2]) >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)
            sc[2 * j] = ls - 32
            sc[2 * j + 1] = ls - 32
        return _f16(blk, 0, tab) * np.float32(_bd_iq4_xs(blk, xq, xoff, sc))
    if qt == Q6_K:
        off = np.int32(0)
        for s in range(16):
            v = np.int32(np.int8(blk[192 + s]))
            sc[s] = v
            off += v * xs[soff + s]
        return _f16(blk, 208, tab) * np.float32(_bd_q6_k(blk, xq, xoff, sc) - 32 * off)
    msum = np.int32(0)
    for j in range(8):
        s, m = _k4(blk, 4, j)
        sc[2 * j] = s
        sc[2 * j + 1] = s
        msum += m * (xs[soff + 2 * j] + xs[soff + 2 * j + 1])
    isum = _bd_q4_k(blk, xq, xoff, sc) if qt == Q4_K else _bd_q5_k(blk, xq, xoff, sc)
    return _f16(blk, 0, tab) * np.float32(isum) - _f16(blk, 2, tab) * np.float32(msum)


@njit(parallel=True, fastmath=True, cache=True)
def gemv_simd(qt, w, xq, xd, xs, y, tab, ssc):
    """y[b, r] for SIMD_TYPES (AVX2): xq (B, K) int8, xd (B, K/256) fp32, xs (B, K/16) int32 as
    for gemv_int; ssc (T, >= 16) int16 per-thread scale rows. The running sum is a register."""
    M = w.shape[0]
    B = xq.shape[0]
    nb = xq.shape[1] // 256
    ts = w.shape[1] // nb
    for r in prange(M):
        sc = ssc[numba.get_thread_id()]
        wr = w[r]
        for b in range(B):
            xb = xq[b]
            sb = xs[b]
            acc = np.float32(0.0)
            for ib in range(nb):
                blk = wr[ib * ts:ib * ts + ts]
                acc += xd[b, ib] * _simd_block(qt, blk, xb, np.int64(256 * ib), sb, 16 * ib, sc,
                                               tab)
            y[b, r] = acc


@njit(parallel=True, fastmath=True, cache=True)
def gemv_simd_group(ws, qts, ycol, cm, cr0, cr1, xq, xd, xs, y, tab, ssc):
    """Several SIMD_TYPES matrices sharing one quantized x, in ONE parallel loop (issue 5):
    ws a typed List of raw (M_m, row_bytes_m) matrices, qts[m] their types, ycol[m] the first
    output column of matrix m in y (B, sum M_m). The work is a list of row chunks
    (cm[c]: matrix, rows cr0[c]..cr1[c]) balanced by bytes over the threads by the caller. Each
    row is computed exactly as gemv_simd computes it (same block function, same running sum)."""
    B = xq.shape[0]
    nb = xq.shape[1] // 256
    for c in prange(cm.shape[0]):
        m = cm[c]
        w = ws[m]
        qt = qts[m]
        col = ycol[m]
        ts = w.shape[1] // nb
        sc = ssc[numba.get_thread_id()]
        for r in range(cr0[c], cr1[c]):
            wr = w[r]
            for b in range(B):
                xb = xq[b]
                sb = xs[b]
                acc = np.float32(0.0)
                for ib in range(nb):
                    blk = wr[ib * ts:ib * ts + ts]
                    acc += xd[b, ib] * _simd_block(qt, blk, xb, np.int64(256 * ib), sb, 16 * ib,
                                                   sc, tab)
                y[b, col + r] = acc
