"""AVX-512 VNNI host GEMV with the whole row loop in LLVM IR and a vector epilogue (issue 5).

cpu_gemv_avx512's kernels reduce every 256-element block's 16 int32 lanes to one integer and then
do the block's fp32 scaling on scalars (bit-identical to the AVX2 gemv_simd). Per block that is a
shuffle/add tree, two extracts, table lookups for the fp16 factors and scalar fma chains: ~25 of
the ~85 instructions of a Q4_K block, a third of them on the shuffle port. The device host runs
these kernels compute-bound (session 11: IQ4_XS / Q4_K / Q5_K at 82-94 GB/s on 16 threads where
Q6_K, the cheapest decode per byte, reached 135 GB/s), so instructions per block are the 8 GiB
decode's limit.

Here the lanes stay lanes: per block and activation row, the int32 lanes are converted to fp32
(exact: |lane| < 2^24) and multiplied into a <16 x float> accumulator with the block's factor
(d * xd; Q4_K / Q5_K add the min lanes times -(dmin * xd)), the fp16 factors converted with
vcvtph2ps; the 16 lanes are summed once per row (an ordered reduction). The integers are those of
cpu_gemv_avx512._block_cols (the same IR); only the fp32 rounding order differs from the scalar
form, so results agree with it to fp32 rounding (tests/test_cpu_gemv_avx512.py), and every
activation row's result is bit-identical whether it runs alone or in a batch (the multi-row form
is the one-row form per row, each row with its own accumulator).

The row loop is one intrinsic per (format, rows): (row bytes, blocks, xq, xs, xd, row indices,
pf) -> rows fp32, with the software prefetch of cpu_gemv_avx512 (pf: prefetch_arg()).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir as _ir
from numba import njit, prange
from numba import types as _nt
from numba.core import cgutils as _cg
from numba.extending import intrinsic as _intrinsic

from tightfit.kernels.cpu_gemv_avx512 import (COLS, IQ4_XS, PF_ARG, Q4_K, Q5_K, Q6_K, _I8, _I32, _I64,
                                              _Ops, _block_cols, _data, _fn, permute_x,
                                              prefetch_ir, row_groups)

_F32 = _ir.FloatType()
_V16F = _ir.VectorType(_F32, 16)
#: bytes per block and byte offsets of the fp16 factors (d, then dmin for Q4_K / Q5_K)
_TS = {IQ4_XS: 136, Q4_K: 144, Q5_K: 176, Q6_K: 210}
_D_OFF = {IQ4_XS: 0, Q4_K: 0, Q5_K: 0, Q6_K: 208}


def _half(builder, p, off):
    """The fp16 at byte offset off of p, as fp32 (fpext: vcvtph2ps)."""
    q = builder.gep(p, [_ir.Constant(_I64, off)], source_etype=_I8)
    h = builder.load(builder.bitcast(q, _ir.PointerType(_ir.HalfType())) if not getattr(
        q.type, "is_opaque", False) else q, typ=_ir.HalfType(), align=1)
    return builder.fpext(h, _F32)


def _splat_f(builder, v):
    u = builder.insert_element(_ir.Constant(_V16F, _ir.Undefined), v, _ir.Constant(_I32, 0))
    return builder.shuffle_vector(u, u, _ir.Constant(_ir.VectorType(_I32, 16), [0] * 16))


def _fma_v(builder, a, b, c):
    f = _fn(builder, "llvm.fma.v16f32", _V16F, [_V16F] * 3)
    return builder.call(f, [a, b, c])


def _codegen(kind, ncol):
    ts = _TS[kind]
    doff = _D_OFF[kind]

    def codegen(context, builder, sig, args):
        wr, nb, xq, xs, xd = args[:5]
        js = args[5:5 + ncol]
        pf = args[5 + ncol]
        ops = _Ops(builder)
        pw0 = _data(context, builder, sig.args[0], wr)
        px0 = _data(context, builder, sig.args[2], xq)
        ps0 = _data(context, builder, sig.args[3], xs)
        pd0 = _data(context, builder, sig.args[4], xd)
        kx = _cg.unpack_tuple(builder, context.make_array(sig.args[2])(context, builder, xq).shape)[1]
        ks = _cg.unpack_tuple(builder, context.make_array(sig.args[3])(context, builder, xs).shape)[1]
        kd = _cg.unpack_tuple(builder, context.make_array(sig.args[4])(context, builder, xd).shape)[1]
        p1 = builder.and_(pf, _ir.Constant(_I64, 0xFFFFFFFF))
        p2 = builder.lshr(pf, _ir.Constant(_I64, 32))
        zero = _ir.Constant(_I64, 0)
        accs = [_cg.alloca_once_value(builder, _ir.Constant(_V16F, [0.0] * 16)) for _ in range(ncol)]
        xrow = [builder.mul(j, kx) for j in js]
        srow = [builder.mul(j, ks) for j in js]
        drow = [builder.mul(j, kd) for j in js]
        with _cg.for_range(builder, nb) as loop:
            ib = loop.index
            off = builder.mul(ib, _ir.Constant(_I64, ts))
            pw = builder.gep(pw0, [off], source_etype=_I8)
            for dist, loc in ((p1, 3), (p2, 2)):
                with builder.if_then(builder.icmp_unsigned(">", dist, zero), likely=True):
                    for c in range(0, ts, 64):
                        prefetch_ir(builder, pw, builder.add(dist, _ir.Constant(_I64, c)), loc)
            xo = builder.mul(ib, _ir.Constant(_I64, 256))
            so = builder.mul(ib, _ir.Constant(_I64, 16))
            pxs = [builder.gep(px0, [builder.add(r, xo)], source_etype=_I8) for r in xrow]
            pss = [builder.gep(ps0, [builder.add(r, so)], source_etype=_I32) for r in srow]
            res = _block_cols(kind, ops, builder, pw, pxs, pss)
            d = _half(builder, pw, doff)
            dmin = _half(builder, pw, 2) if kind in (Q4_K, Q5_K) else None
            for j in range(ncol):
                xdj = builder.load(builder.gep(pd0, [builder.add(drow[j], ib)], source_etype=_F32),
                                   typ=_F32)
                acc = builder.load(accs[j])
                if kind in (Q4_K, Q5_K):
                    il, ml = res[j]
                    acc = _fma_v(builder, _splat_f(builder, builder.fmul(d, xdj)),
                                 builder.sitofp(il, _V16F), acc)
                    acc = _fma_v(builder, _splat_f(builder, builder.fneg(builder.fmul(dmin, xdj))),
                                 builder.sitofp(ml, _V16F), acc)
                else:
                    acc = _fma_v(builder, _splat_f(builder, builder.fmul(d, xdj)),
                                 builder.sitofp(res[j], _V16F), acc)
                builder.store(acc, accs[j])
        red = _fn(builder, "llvm.vector.reduce.fadd.v16f32", _F32, [_F32, _V16F])
        outs = [builder.call(red, [_ir.Constant(_F32, 0.0), builder.load(a)]) for a in accs]
        return context.make_tuple(builder, sig.return_type, outs)
    return codegen


def _make(kind, ncol):
    ret = _nt.UniTuple(_nt.float32, ncol)
    if ncol == 1:
        @_intrinsic
        def row1(tyctx, wr, nb, xq, xs, xd, j0, pf):
            return ret(wr, nb, xq, xs, xd, j0, pf), _codegen(kind, 1)
        return row1

    @_intrinsic
    def row4(tyctx, wr, nb, xq, xs, xd, j0, j1, j2, j3, pf):
        return ret(wr, nb, xq, xs, xd, j0, j1, j2, j3, pf), _codegen(kind, 4)
    return row4


_r1 = {k: _make(k, 1) for k in _TS}
_r4 = {k: _make(k, COLS) for k in _TS}
_r1_iq4, _r1_q4k, _r1_q5k, _r1_q6k = _r1[IQ4_XS], _r1[Q4_K], _r1[Q5_K], _r1[Q6_K]
_r4_iq4, _r4_q4k, _r4_q5k, _r4_q6k = _r4[IQ4_XS], _r4[Q4_K], _r4[Q5_K], _r4[Q6_K]


@njit(inline="always")
def _one(qt, wr, ts, nb, xq, xs, xd, j, tab, pf):
    """row_groups' one-row call (ts, tab unused: the IR knows the block size, converts fp16)."""
    if qt == IQ4_XS:
        return _r1_iq4(wr, nb, xq, xs, xd, j, pf)[0]
    if qt == Q4_K:
        return _r1_q4k(wr, nb, xq, xs, xd, j, pf)[0]
    if qt == Q5_K:
        return _r1_q5k(wr, nb, xq, xs, xd, j, pf)[0]
    return _r1_q6k(wr, nb, xq, xs, xd, j, pf)[0]


@njit(inline="always")
def _four(qt, wr, ts, nb, xq, xs, xd, j0, j1, j2, j3, tab, pf):
    if qt == IQ4_XS:
        return _r4_iq4(wr, nb, xq, xs, xd, j0, j1, j2, j3, pf)
    if qt == Q4_K:
        return _r4_q4k(wr, nb, xq, xs, xd, j0, j1, j2, j3, pf)
    if qt == Q5_K:
        return _r4_q5k(wr, nb, xq, xs, xd, j0, j1, j2, j3, pf)
    return _r4_q6k(wr, nb, xq, xs, xd, j0, j1, j2, j3, pf)


@njit(parallel=True, cache=True)
def gemv_avx512v(qt, w, xq, xd, xs, y, tab, ssc, pf=PF_ARG):
    """cpu_gemv_avx512.gemv_avx512's signature and integers, vector epilogue (module docstring):
    y[b, r] = row r of w times activation row b. tab / ssc unused (kept for the signature)."""
    M = w.shape[0]
    nb = np.int64(xq.shape[1] // 256)
    xp = permute_x(xq, np.empty(xq.shape, np.int8)) if qt == IQ4_XS else xq
    for r in prange(M):
        row_groups(_one, _four, qt, w[r], 0, nb, xp, xs, xd, y, r, tab, pf)


@njit(parallel=True, cache=True)
def gemv_avx512v_group(ws, qts, ycol, cm, cr0, cr1, xq, xd, xs, y, tab, ssc, pf=PF_ARG):
    """cpu_gemv_avx512.gemv_avx512_group on the vector-epilogue row loop (same signature)."""
    nb = np.int64(xq.shape[1] // 256)
    xp = permute_x(xq, np.empty(xq.shape, np.int8))
    for c in prange(cm.shape[0]):
        m = cm[c]
        w = ws[m]
        qt = qts[m]
        col = ycol[m]
        xx = xp if qt == IQ4_XS else xq
        for r in range(cr0[c], cr1[c]):
            row_groups(_one, _four, qt, w[r], 0, nb, xx, xs, xd, y, col + r, tab, pf)


__all__ = ["gemv_avx512v", "gemv_avx512v_group"]
