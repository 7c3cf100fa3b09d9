"""numba kernels behind tightfit.kernels.cpu_gemv for the ternary types TQ2_0 (35) and TQ1_0 (34).

Layouts (spec/quant-formats.md §2.3; gguf-py's TQ2_0/TQ1_0 dequantizers agree), 256 elements:

    TQ2_0, 66 bytes: qs[0:64] crumb planes, d fp16 at 64. Element e = 128c + 32n + m has the code
        (qs[32c + m] >> 2n) & 3.
    TQ1_0, 54 bytes: qs[0:48], qh[48:52], d fp16 at 52. Trit n of byte b is
        ((b * 3^n mod 256) * 3) >> 8, i.e. (b' >= 86) + (b' >= 171) with b' = b * 3^n mod 256;
        elements 0..159 are trit e//32 of qs[e%32], 160..239 trit (e-160)//16 of
        qs[32 + (e-160)%16], 240..255 trit (e-240)//4 of qh[(e-240)%4].

In both the weight is d * (code - 1) with code in {0, 1, 2} (a TQ2_0 code 3, never written by the
quantizer, decodes as +2d, as in gguf-py). With the activations quantized per
256 as in cpu_gemv_kern (xq int8, xd fp32) and xb the int32 sum of each 256 codes, a block adds

    xd[b, blk] * d * (sum_e code[e] * xq[b, e]  -  xb[b, blk])

to output b: one exact int32 sum of unsigned code times int8 per block. On AVX2 hosts the sum is
written in LLVM IR (vpmaddubsw on 32 codes at a time, the eight int16 partial sums added in int16:
|8 * 2 * 3 * 127| < 2^15, then one vpmaddwd by 1 and a horizontal add); elsewhere the portable
numba loops below compute the same integer, so both paths give the same result bit for bit.

Kernels: `gemv_tq[_simd]` (one matrix, parallel over rows) and `gemv_tq_group[_simd]` (several
matrices sharing x, parallel over byte-balanced row chunks; each row computed exactly as in
gemv_tq). cpu_gemv picks the `_simd` pair when its `TQ_SIMD` is set (AVX2, TIGHTFIT_CPU_SIMD != 0).
`decode_tq` decodes whole rows to fp32 (cpu_gemv.decode_rows).

Single thread, 17408 x 5120, AMD EPYC (Zen 4) VM: TQ2_0 13-14 GB/s of weight bytes (IQ4_XS in
gemv_simd 6.6), TQ1_0 5.3-5.5 (its trits cost 4 byte ops per 32 elements more); the portable
kernels 5.3 and 3.0 GB/s.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from tightfit.kernels import cpu_gemv_kern as _K

TQ1_0, TQ2_0 = 34, 35
TQ_TYPES = (TQ1_0, TQ2_0)


@njit(inline="always")
def _f16(w, o, tab):
    return tab[np.int32(w[o]) | (np.int32(w[o + 1]) << 8)]


@njit(fastmath=True, cache=True)
def block_sums(xs, xb):
    """xb[b, i] = sum of the 256 int8 activation codes of block i (from the per-16 sums xs)."""
    for b in range(xs.shape[0]):
        for i in range(xb.shape[1]):
            s = np.int32(0)
            for j in range(16):
                s += xs[b, 16 * i + j]
            xb[b, i] = s


# ---- portable block sums: sum_e code[e] * x[x0 + e] (int32) -----------------------------------

@njit(inline="always")
def _trit(v, p):
    """Trit n (0 = most significant) of the TQ1_0 byte v (an int32 0..255), p = 3^n (a literal:
    a runtime power is a call that blocks vectorization): 0, 1 or 2."""
    return (((v * p) & 255) * 3) >> 8


@njit(inline="always")
def _pdot_tq2(blk, x, x0):
    s = np.int32(0)
    for c in range(2):
        for m in range(32):
            v = np.int32(blk[32 * c + m])
            e = x0 + 128 * c + m
            s = np.int32(s + (v & 3) * np.int32(x[e]) + ((v >> 2) & 3) * np.int32(x[e + 32])
                         + ((v >> 4) & 3) * np.int32(x[e + 64]) + (v >> 6) * np.int32(x[e + 96]))
    return s


@njit(inline="always")
def _pdot_tq1(blk, x, x0):
    s = np.int32(0)
    for m in range(32):
        v = np.int32(blk[m])
        e = x0 + m
        s = np.int32(s + _trit(v, 1) * np.int32(x[e]) + _trit(v, 3) * np.int32(x[e + 32])
                     + _trit(v, 9) * np.int32(x[e + 64]) + _trit(v, 27) * np.int32(x[e + 96])
                     + _trit(v, 81) * np.int32(x[e + 128]))
    for m in range(16):
        v = np.int32(blk[32 + m])
        e = x0 + 160 + m
        s = np.int32(s + _trit(v, 1) * np.int32(x[e]) + _trit(v, 3) * np.int32(x[e + 16])
                     + _trit(v, 9) * np.int32(x[e + 32]) + _trit(v, 27) * np.int32(x[e + 48])
                     + _trit(v, 81) * np.int32(x[e + 64]))
    for m in range(4):
        v = np.int32(blk[48 + m])
        e = x0 + 240 + m
        s = np.int32(s + _trit(v, 1) * np.int32(x[e]) + _trit(v, 3) * np.int32(x[e + 4])
                     + _trit(v, 9) * np.int32(x[e + 8]) + _trit(v, 27) * np.int32(x[e + 12]))
    return s


# ---- AVX2 block sums (the same integer), in LLVM IR -------------------------------------------
from llvmlite import ir as _ir                            # noqa: E402
from numba import types as _nt                            # noqa: E402
from numba.core import cgutils as _cg                     # noqa: E402
from numba.extending import intrinsic as _intrinsic       # noqa: E402

_I8, _I16, _I32 = (_ir.IntType(n) for n in (8, 16, 32))
_V16B, _V32B = _ir.VectorType(_I8, 16), _ir.VectorType(_I8, 32)
_V16W, _V8D = _ir.VectorType(_I16, 16), _ir.VectorType(_I32, 8)


def _splat(v, n=32):
    return _ir.Constant(_ir.VectorType(_I8, n), [v] * n)


def _tq_codegen(kind):
    """codegen of (blk uint8[ts], xq int8[K], xoff int64) -> int32 sum_e code[e] * xq[xoff + e]
    over the block at blk[0]. Loads stay inside the block (a row's last block may end the mmap)."""
    def codegen(context, builder, sig, args):
        blk, xq, xoff = args
        pw = _K._data(context, builder, sig.args[0], blk)
        px = builder.gep(_K._data(context, builder, sig.args[1], xq), [xoff], source_etype=_I8)
        mod = builder.module
        maddubs = _cg.get_or_insert_function(mod, _ir.FunctionType(_V16W, [_V32B, _V32B]),
                                             "llvm.x86.avx2.pmadd.ub.sw")
        maddwd = _cg.get_or_insert_function(mod, _ir.FunctionType(_V8D, [_V16W, _V16W]),
                                            "llvm.x86.avx2.pmadd.wd")
        reduce = _cg.get_or_insert_function(mod, _ir.FunctionType(_I32, [_V8D]),
                                            "llvm.vector.reduce.add.v8i32")
        acc = []

        def dot(codes, xo):   # 32 unsigned codes (0..3) times xq[xoff + xo : + 32]
            p = builder.call(maddubs, [codes, _K._load(builder, px, xo, _V32B)])
            acc.append(p if not acc else builder.add(acc.pop(), p))

        def times3(v):        # v * 3 mod 256, bytewise
            return builder.add(builder.add(v, v), v)

        def trit(s, n=32):    # s = b' ^ 0x80: (b' >= 86) + (b' >= 171) = -(s > -43) - (s > 42)
            a = builder.sext(builder.icmp_signed(">", s, _splat(-43, n)), s.type)
            b = builder.sext(builder.icmp_signed(">", s, _splat(42, n)), s.type)
            return builder.sub(builder.sub(_splat(0, n), a), b)

        if kind == TQ2_0:
            for c in range(2):
                q = _K._load(builder, pw, 32 * c, _V32B)
                for n in range(4):
                    v = builder.lshr(q, _splat(2 * n)) if n else q
                    dot(builder.and_(v, _splat(3)) if n < 3 else v, 128 * c + 32 * n)
        else:
            # trits of s = b ^ 0x80 = b - 128 (mod 256): b * 3^n - 128 = 3^n * s (mod 256), so the
            # planes stay in the signed domain of vpcmpgtb with one xor per load
            q = builder.xor(_K._load(builder, pw, 0, _V32B), _splat(0x80))   # 0..159: 5 planes
            for n in range(5):
                dot(trit(q), 32 * n)
                q = times3(q)
            h = builder.xor(_K._load(builder, pw, 32, _V16B), _splat(0x80, 16))  # 160..239
            cat = _ir.Constant(_ir.VectorType(_I32, 32), list(range(32)))
            c = builder.shuffle_vector(h, times3(h), cat)   # planes (0, 1): elements 160..191
            dot(trit(c), 160)
            c = times3(times3(c))                           # planes (2, 3): 192..223
            dot(trit(c), 192)
            c = times3(times3(c))                           # plane 4 in the low half: 224..239
            qh = builder.bitcast(_K._load(builder, pw, 48, _I32), _ir.VectorType(_I8, 4))
            qh = builder.shuffle_vector(qh, qh, _ir.Constant(_ir.VectorType(_I32, 16),
                                                             list(range(4)) * 4))
            qh = builder.mul(builder.xor(qh, _splat(0x80, 16)),
                             _ir.Constant(_V16B, [1] * 4 + [3] * 4 + [9] * 4 + [27] * 4))
            lo = builder.shuffle_vector(c, c, _ir.Constant(_ir.VectorType(_I32, 16),
                                                           list(range(16))))
            dot(trit(builder.shuffle_vector(lo, qh, cat)), 224)   # + qh's 240..255
        ones = _ir.Constant(_V16W, [1] * 16)
        return builder.call(reduce, [builder.call(maddwd, [acc[0], ones])])
    return codegen


def _make(kind):
    @_intrinsic
    def tq_dot(tyctx, blk, xq, xoff):
        return _nt.int32(blk, xq, xoff), _tq_codegen(kind)
    return tq_dot


_sdot_tq2 = _make(TQ2_0)
_sdot_tq1 = _make(TQ1_0)


# ---- one block, both paths: fp32 d * (sum code * xq - sum xq) -----------------------------------

@njit(inline="always")
def _block(qt, blk, x, ib, xb, tab):
    if qt == TQ2_0:
        return _f16(blk, 64, tab) * np.float32(_pdot_tq2(blk, x, 256 * ib) - xb[ib])
    return _f16(blk, 52, tab) * np.float32(_pdot_tq1(blk, x, 256 * ib) - xb[ib])


@njit(inline="always")
def _block_simd(qt, blk, x, ib, xb, tab):
    if qt == TQ2_0:
        return _f16(blk, 64, tab) * np.float32(_sdot_tq2(blk, x, np.int64(256 * ib)) - xb[ib])
    return _f16(blk, 52, tab) * np.float32(_sdot_tq1(blk, x, np.int64(256 * ib)) - xb[ib])


# The four kernels differ only in the block function (_block / _block_simd: which one is a
# compile-time choice, the AVX2 IR must never be compiled on a host without AVX2) and in the loop
# over rows (one matrix / a chunk list over several). Same running sum in all four.

@njit(parallel=True, fastmath=True, cache=True)
def gemv_tq(qt, w, xq, xd, xb, y, tab):
    """y[b, r] = row r of the raw TQ1_0/TQ2_0 matrix w (M, row_bytes) times activation b:
    xq (B, K) int8, xd (B, K/256) fp32, xb (B, K/256) int32 block sums of xq."""
    nb = xq.shape[1] // 256
    ts = w.shape[1] // nb
    for r in prange(w.shape[0]):
        wr = w[r]
        for b in range(xq.shape[0]):
            x = xq[b]
            sb = xb[b]
            acc = np.float32(0.0)
            for ib in range(nb):
                acc += xd[b, ib] * _block(qt, wr[ib * ts:ib * ts + ts], x, ib, sb, tab)
            y[b, r] = acc


@njit(parallel=True, fastmath=True, cache=True)
def gemv_tq_simd(qt, w, xq, xd, xb, y, tab):
    """gemv_tq with the AVX2 block sums."""
    nb = xq.shape[1] // 256
    ts = w.shape[1] // nb
    for r in prange(w.shape[0]):
        wr = w[r]
        for b in range(xq.shape[0]):
            x = xq[b]
            sb = xb[b]
            acc = np.float32(0.0)
            for ib in range(nb):
                acc += xd[b, ib] * _block_simd(qt, wr[ib * ts:ib * ts + ts], x, ib, sb, tab)
            y[b, r] = acc


@njit(parallel=True, fastmath=True, cache=True)
def gemv_tq_group(ws, qts, ycol, cm, cr0, cr1, xq, xd, xb, y, tab):
    """Several ternary matrices sharing x in one parallel loop, as cpu_gemv_kern.gemv_simd_group:
    ws a typed List of raw matrices, qts their types, ycol their first output column in y, the
    work a list of row chunks (cm[c]: matrix, rows cr0[c]..cr1[c])."""
    nb = xq.shape[1] // 256
    for c in prange(cm.shape[0]):
        m = cm[c]
        w = ws[m]
        qt = qts[m]
        col = ycol[m]
        ts = w.shape[1] // nb
        for r in range(cr0[c], cr1[c]):
            wr = w[r]
            for b in range(xq.shape[0]):
                x = xq[b]
                sb = xb[b]
                acc = np.float32(0.0)
                for ib in range(nb):
                    acc += xd[b, ib] * _block(qt, wr[ib * ts:ib * ts + ts], x, ib, sb, tab)
                y[b, col + r] = acc


@njit(parallel=True, fastmath=True, cache=True)
def gemv_tq_group_simd(ws, qts, ycol, cm, cr0, cr1, xq, xd, xb, y, tab):
    """gemv_tq_group with the AVX2 block sums."""
    nb = xq.shape[1] // 256
    for c in prange(cm.shape[0]):
        m = cm[c]
        w = ws[m]
        qt = qts[m]
        col = ycol[m]
        ts = w.shape[1] // nb
        for r in range(cr0[c], cr1[c]):
            wr = w[r]
            for b in range(xq.shape[0]):
                x = xq[b]
                sb = xb[b]
                acc = np.float32(0.0)
                for ib in range(nb):
                    acc += xd[b, ib] * _block_simd(qt, wr[ib * ts:ib * ts + ts], x, ib, sb, tab)
                y[b, col + r] = acc


# ---- decode_rows: whole rows to fp32 (the host embedding lookup) -------------------------------

@njit(parallel=True, cache=True)
def decode_tq(qt, w, rows, out, tab):
    """out[i, :] = dequantized row rows[i] of the raw TQ1_0/TQ2_0 matrix w."""
    nb = out.shape[1] // 256
    ts = w.shape[1] // nb
    for i in prange(rows.shape[0]):
        wr = w[rows[i]]
        y = out[i]
        for ib in range(nb):
            blk = wr[ib * ts:ib * ts + ts]
            e = 256 * ib
            if qt == TQ2_0:
                d = _f16(blk, 64, tab)
                for c in range(2):
                    for m in range(32):
                        v = np.int32(blk[32 * c + m])
                        for n in range(4):
                            y[e + 128 * c + 32 * n + m] = d * np.float32(((v >> (2 * n)) & 3) - 1)
            else:
                d = _f16(blk, 52, tab)
                # element e0 + span * n + j is trit n of byte j0 + j
                for j0, e0, span, nt in ((0, 0, 32, 5), (32, 160, 16, 5), (48, 240, 4, 4)):
                    for j in range(span):
                        v = np.int32(blk[j0 + j])
                        p = np.int32(1)
                        for n in range(nt):
                            y[e + e0 + span * n + j] = d * np.float32(_trit(v, p) - 1)
                            p *= 3
