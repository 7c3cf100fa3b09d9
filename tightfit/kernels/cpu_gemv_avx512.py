"""AVX-512 VNNI block kernels for the host GEMV (issue 5): drop-in twins of cpu_gemv_kern's AVX2
`gemv_simd` / `gemv_simd_group` for IQ4_XS, Q4_K, Q5_K and Q6_K.

Same inputs, same contract (cpu_gemv_kern's module docstring): xq (B, K) int8 activation codes,
xd (B, K/256) fp32 scales, xs (B, K/16) int32 sums of every 16 codes. Each 256-element block is
one exact int32 sum computed here in LLVM IR on 512-bit vectors (the same integer as gemv_simd's);
the fp32 arithmetic around it is written out with explicit fma (no fastmath) in the form LLVM
gives gemv_simd's fastmath code in numba's cache (see `_row`), so the outputs are bit-identical
to a cached gemv_simd. (A fresh in-process compile of gemv_simd rounds IQ4_XS/Q6_K as
fma(xd, f * isum, acc) instead: a few-ulp difference that this module does not follow.)

One zmm holds 64 consecutive elements of a block (four per block):

* Q4_K / Q5_K / Q6_K (unsigned codes 0..15 / 0..31 / 0..63): `vpdpbusd(0, codes, xq)` gives 16
  int32 lanes, each the sum of 4 code*x products: |lane| <= 4*63*127 < 2^15. Each lane lies in
  ONE sub-block (32 elements = 8 lanes, Q6_K's 16 = 4 lanes), so the sub-block scale is applied
  with `vpdpwssd(acc, lanes, scale)`, the scale lane holding the scale in its low int16 and 0 in
  its high one: low(lane) * scale + high(lane) * 0 = lane * scale, exact as |lane| < 2^15. Two
  VNNI instructions per 64 elements. The sub-block minimums (Q4_K/Q5_K) and Q6_K's -32 offset
  use the per-16 activation sums xs in the same way (|xs| <= 16*127 < 2^15): one
  `vpdpwssd(., xs, mins)` per block.
* IQ4_XS (signed codebook values): vpshufb on the 16-entry table of |value| with the 4-bit codes;
  the sign (code < 8) moves onto x (masked 0 - x), `vpmaddubsw(|v|, +-x)` gives int16 pair sums
  (|pair| <= 2*127*127 < 2^15) and `vpdpwssd(acc, pairs, scale)` applies the per-32 scale.
  (A vpdpbusd form would need |v| + 128 as the unsigned operand: its 4-product lanes do not fit
  int16 and the scale would take a 2-uop vpmulld per 64 elements.) The 32 code bytes of two
  sub-blocks are one broadcast load; x is permuted once per call (`permute_x`) to the order the
  nibbles then come in, which saves a cross-lane shuffle per 64 elements.

The per-block scales are decoded on vectors too (no scalar scale loop, no scratch round trip).
Needs avx512f + avx512bw + avx512vnni on the host (`available()`); otherwise (or with
TIGHTFIT_CPU_AVX512=0: `ENABLED`) cpu_gemv keeps the AVX2 kernels. Nothing here is compiled until
a kernel is first called, so importing the module is safe on any host.
"""
from __future__ import annotations

import os

import numpy as np
from numba import njit, prange
from llvmlite import ir as _ir
from numba import types as _nt
from numba.core import cgutils as _cg
from numba.extending import intrinsic as _intrinsic

Q4_K, Q5_K, Q6_K, IQ4_XS = 12, 13, 14, 23
#: the types gemv_avx512 runs (the same set as the AVX2 gemv_simd)
TYPES = (Q4_K, Q5_K, Q6_K, IQ4_XS)
_NEEDED = ("avx512f", "avx512bw", "avx512vnni")


def available() -> bool:
    """True when this host can run the kernels: avx512f, avx512bw and avx512vnni, and numba
    compiles for the host CPU (not a fixed/generic target, e.g. for a portable cache)."""
    try:
        import llvmlite.binding as ll
        from numba.core import config
        if config.CPU_NAME not in (None, "host") or config.CPU_FEATURES:
            return False
        feats = ll.get_host_cpu_features()
        return all(bool(feats.get(f, False)) for f in _NEEDED)
    except Exception:  # pragma: no cover
        return False


#: use the AVX-512 kernels: the host has the features and TIGHTFIT_CPU_AVX512 is not "0"
ENABLED = available() and os.environ.get("TIGHTFIT_CPU_AVX512", "1") != "0"

# ---- LLVM IR helpers --------------------------------------------------------------------------
_I8, _I16, _I32, _I64 = (_ir.IntType(n) for n in (8, 16, 32, 64))


def _vt(et, n):
    return _ir.VectorType(et, n)


_V64B, _V32W, _V16D, _V8Q = _vt(_I8, 64), _vt(_I16, 32), _vt(_I32, 16), _vt(_I64, 8)


def _const(et, vals):
    return _ir.Constant(_vt(et, len(vals)), [int(v) for v in vals])


def _splat(et, v, n):
    return _const(et, [v] * n)


def _data(context, builder, aty, aval):
    return context.make_array(aty)(context, builder, aval).data


def _load(builder, p, off, vt, et=_I8):
    """Unaligned load of vector type vt at element offset off (a Python int) of pointer p."""
    return builder.load(builder.gep(p, [_ir.Constant(_I64, off)], source_etype=et), typ=vt,
                        align=1)


def _fn(builder, name, ret, args):
    return _cg.get_or_insert_function(builder.module, _ir.FunctionType(ret, args), name)


class _Ops:
    """The x86 instructions used, as calls of LLVM's x86 intrinsics (the <16 x i32> operand form
    of the VNNI ones, which LLVM 14..22 all accept)."""

    def __init__(self, builder):
        self.b = builder
        self._dpbusd = _fn(builder, "llvm.x86.avx512.vpdpbusd.512", _V16D, [_V16D] * 3)
        self._dpwssd = _fn(builder, "llvm.x86.avx512.vpdpwssd.512", _V16D, [_V16D] * 3)
        self._maddubs = _fn(builder, "llvm.x86.avx512.pmaddubs.w.512", _V32W, [_V64B, _V64B])
        self._pshufb = _fn(builder, "llvm.x86.avx512.pshuf.b.512", _V64B, [_V64B, _V64B])
        self._reduce = _fn(builder, "llvm.vector.reduce.add.v16i32", _I32, [_V16D])
        self.zero = _ir.Constant(_V16D, [0] * 16)

    def dpbusd(self, acc, u8, s8):        # acc + sum of 4 (unsigned u8 * signed s8) per lane
        b = self.b
        return b.call(self._dpbusd, [acc, b.bitcast(u8, _V16D), b.bitcast(s8, _V16D)])

    def dpwssd(self, acc, a, c):          # acc + sum of 2 (int16 * int16) per lane
        b = self.b
        return b.call(self._dpwssd, [acc, b.bitcast(a, _V16D), b.bitcast(c, _V16D)])

    def maddubs(self, u8, s8):
        return self.b.call(self._maddubs, [u8, s8])

    def pshufb(self, tbl, idx):
        return self.b.call(self._pshufb, [tbl, idx])

    def reduce(self, v):
        return self.b.call(self._reduce, [v])

    def q_shift(self, v, amounts, left=False):
        """v (64 bytes) viewed as 8 uint64, each shifted by its own amount (vpsrlvq/vpsllvq)."""
        b = self.b
        q = b.bitcast(v, _V8Q)
        s = _const(_I64, amounts)
        return b.bitcast(b.shl(q, s) if left else b.lshr(q, s), _V64B)

    def lanes(self, v16, idx):
        """<16 x i32> lanes v16[idx[i]] (vpermd)."""
        return self.b.shuffle_vector(v16, v16, _const(_I32, idx))


def _k4_scales(ops, builder, pw):
    """Q4_K/Q5_K: <16 x i32> lanes 0..7 = the 6-bit scales, 8..15 = the 6-bit mins (the 12-byte
    packing at byte 4, as cpu_gemv_kern._k4), decoded together on one vector."""
    b16 = _load(builder, pw, 0, _vt(_I8, 16))      # bytes 0..15: d, dmin, 12 scale bytes
    # lane j < 4: scale byte b[j] & 63, min b[j+4] & 63; j >= 4: scale (b[j+4] & 15) |
    # (b[j-4] >> 6) << 4, min (b[j+4] >> 4) | (b[j] >> 6) << 4 (b[k] = byte 4 + k)
    a_idx = [4 + j if j < 4 else 8 + j for j in range(8)] + [8 + j for j in range(8)]
    h_idx = [0 if j < 4 else j for j in range(8)] + [0 if j < 4 else 4 + j for j in range(8)]
    a_sh = [0] * 8 + [0 if j < 4 else 4 for j in range(8)]
    a_mask = [63 if j < 4 else 15 for j in range(8)] * 2
    h_mask = [0 if j < 4 else 0x30 for j in range(8)] * 2
    a = builder.zext(builder.shuffle_vector(b16, b16, _const(_I32, a_idx)), _vt(_I16, 16))
    h = builder.zext(builder.shuffle_vector(b16, b16, _const(_I32, h_idx)), _vt(_I16, 16))
    lo = builder.and_(builder.lshr(a, _const(_I16, a_sh)), _const(_I16, a_mask))
    hi = builder.and_(builder.lshr(h, _splat(_I16, 2, 16)), _const(_I16, h_mask))
    return builder.zext(builder.or_(lo, hi), _V16D)


def _reduce2(builder, a, b):
    """(sum of a's 16 int32 lanes, sum of b's) with one shared shuffle/add tree (12 instructions
    instead of two 8-instruction reductions)."""
    def half(v, lo_idx, hi_idx):
        return builder.add(builder.shuffle_vector(v[0], v[1], _const(_I32, lo_idx)),
                           builder.shuffle_vector(v[0], v[1], _const(_I32, hi_idx)))
    s = half((a, b), list(range(8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32)))
    t = half((s, s), [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
    u = half((t, t), [0, 1, 4, 5], [2, 3, 6, 7])
    v = half((u, u), [0, 2], [1, 3])
    return builder.extract_element(v, _ir.Constant(_I32, 0)), \
        builder.extract_element(v, _ir.Constant(_I32, 1))


def _block_vec(kind, ops, builder, pw, px, ps):
    """The 256-element block at byte pointer pw against xq at px (int8*) and xs at ps (int32*):
    <16 x i32> lanes summing to the block's integer (IQ4_XS; Q6_K with its -32 offset applied),
    or (code lanes, min lanes) for Q4_K/Q5_K (isum and msum of cpu_gemv_kern._simd_block)."""
    return _block_cols(kind, ops, builder, pw, [px], [ps])[0]


def _block_cols(kind, ops, builder, pw, pxs, pss):
    """_block_vec for several activation rows at once (pxs[j], pss[j]: column j's xq and xs
    pointers): the block's codes and scales are decoded ONCE and multiplied into every column, so
    a C-column call costs the decode plus C x (load, dot, scale) per 64 elements instead of C
    whole passes (the speculative verify block, issue 10: M = k + 1 columns per host row). Each
    column's lanes hold exactly the integers a one-column call gives (integer arithmetic: the
    grouping of the columns cannot change them). Returns one entry per column, as _block_vec."""
    ncol = len(pxs)

    def x64(j, c):                           # column j's xq[64c : 64c + 64]
        return _load(builder, pxs[j], 64 * c, _V64B)

    def xsums(j):                            # column j's xs[0:16] (|v| <= 16 * 127 = 2032)
        return _load(builder, pss[j], 0, _V16D, _I32)

    # two chains per column: chunk c adds into accs[j][c % 2]
    accs = [[ops.zero, ops.zero] for _ in range(ncol)]
    if kind == IQ4_XS:
        # scales: ls_j = ((sl[j/2] >> 4(j%2)) & 15) | ((sh >> 2j) & 3) << 4, minus 32
        b8 = _load(builder, pw, 0, _vt(_I8, 8))
        w16 = builder.zext(builder.shuffle_vector(b8, b8, _const(_I32, [4, 4, 5, 5, 6, 6, 7, 7])),
                           _vt(_I16, 8))
        lo = builder.and_(builder.lshr(w16, _const(_I16, [0, 4] * 4)), _splat(_I16, 15, 8))
        sh = builder.bitcast(b8, _vt(_I16, 4))
        shb = builder.shuffle_vector(sh, sh, _splat(_I32, 1, 8))
        hi = builder.shl(builder.and_(builder.lshr(shb, _const(_I16, range(0, 16, 2))),
                                      _splat(_I16, 3, 8)), _splat(_I16, 4, 8))
        sc8 = builder.sub(builder.or_(lo, hi), _splat(_I16, 32, 8))
        mag = [127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113]
        tbl = _const(_I8, mag * 4)
        zero_b = _splat(_I8, 0, 64)
        for c in range(4):
            # q = the 32 code bytes of sub-blocks 2c, 2c+1 in both halves (one broadcast load):
            # 128-bit lanes lo(q[0:16]), lo(q[16:32]), hi(q[0:16]), hi(q[16:32]) = elements
            # 0-15, 32-47, 16-31, 48-63 of the 64: the order of the permuted x (permute_x)
            q = _load(builder, pw, 8 + 32 * c, _vt(_I8, 32))
            qq = builder.shuffle_vector(q, q, _const(_I32, list(range(32)) * 2))
            idx = builder.and_(ops.q_shift(qq, [0] * 4 + [4] * 4), _splat(_I8, 15, 64))
            neg = builder.icmp_unsigned("<", idx, _splat(_I8, 8, 64))   # codebook value < 0
            mags = ops.pshufb(tbl, idx)
            scl = builder.shuffle_vector(sc8, sc8, _const(_I32, ([2 * c] * 8 + [2 * c + 1] * 8) * 2))
            for j in range(ncol):
                x = x64(j, c)
                x = builder.select(neg, builder.sub(zero_b, x), x)
                accs[j][c % 2] = ops.dpwssd(accs[j][c % 2], ops.maddubs(mags, x), scl)
        return [builder.add(a[0], a[1]) for a in accs]
    if kind == Q6_K:
        scb = _load(builder, pw, 192, _vt(_I8, 16))
        sc32 = builder.zext(builder.sext(scb, _vt(_I16, 16)), _V16D)   # scale in the low half
        m30 = _splat(_I8, 0x30, 64)
        m15 = _splat(_I8, 15, 64)
        for h in range(2):
            ql = _load(builder, pw, 64 * h, _V64B)
            q = _load(builder, pw, 128 + 32 * h, _vt(_I8, 32))
            hh = builder.shuffle_vector(q, q, _const(_I32, list(range(32)) * 2))
            for p in range(2):
                c = 2 * h + p
                low = builder.and_(ql if p == 0 else ops.q_shift(ql, [4] * 8), m15)
                # bits 4,5 of byte e <- bits 2g, 2g+1 of qh (g = 2p for the low 32, 2p+1 high)
                hi = ops.q_shift(hh, [4] * 4 + [2] * 4, left=True) if p == 0 else \
                    ops.q_shift(hh, [0] * 4 + [2] * 4)
                codes = builder.or_(low, builder.and_(hi, m30))
                scl = ops.lanes(sc32, [4 * c + i // 4 for i in range(16)])
                for j in range(ncol):
                    t = ops.dpbusd(ops.zero, codes, x64(j, c))
                    accs[j][p] = ops.dpwssd(accs[j][p], t, scl)
        # - 32 * sum_s sc[s] * xs[s]: -32 sc fits int16 (|.| <= 4096)
        nsc = builder.and_(builder.mul(builder.sext(scb, _V16D), _splat(_I32, -32, 16)),
                           _splat(_I32, 0xFFFF, 16))
        return [ops.dpwssd(builder.add(accs[j][0], accs[j][1]), xsums(j), nsc)
                for j in range(ncol)]
    # Q4_K / Q5_K
    scm = _k4_scales(ops, builder, pw)
    qs = 16 if kind == Q4_K else 48
    if kind == Q5_K:
        q = _load(builder, pw, 16, _vt(_I8, 32))
        qh = builder.shuffle_vector(q, q, _const(_I32, list(range(32)) * 2))
    m15 = _splat(_I8, 15, 64)
    for c in range(4):
        q = _load(builder, pw, qs + 32 * c, _vt(_I8, 32))
        qq = builder.shuffle_vector(q, q, _const(_I32, list(range(32)) * 2))
        codes = builder.and_(ops.q_shift(qq, [0] * 4 + [4] * 4), m15)
        if kind == Q5_K:     # bit s of qh[t] is bit 4 of element 32s + t (s = 2c, 2c + 1)
            bit = _const(_I8, [1 << (2 * c)] * 32 + [1 << (2 * c + 1)] * 32)
            set_ = builder.icmp_unsigned("!=", builder.and_(qh, bit), _splat(_I8, 0, 64))
            codes = builder.or_(codes, builder.select(set_, _splat(_I8, 16, 64),
                                                      _splat(_I8, 0, 64)))
        scl = ops.lanes(scm, [2 * c] * 8 + [2 * c + 1] * 8)
        for j in range(ncol):
            t = ops.dpbusd(ops.zero, codes, x64(j, c))
            accs[j][c % 2] = ops.dpwssd(accs[j][c % 2], t, scl)
    mlanes = ops.lanes(scm, [8 + i // 2 for i in range(16)])
    return [(builder.add(accs[j][0], accs[j][1]), ops.dpwssd(ops.zero, xsums(j), mlanes))
            for j in range(ncol)]


def _reduce_many(builder, vs):
    """The lane sums of len(vs) (a power of two, >= 2) <16 x i32> vectors, with one shared
    shuffle/add tree: each level halves the lanes per vector and pairs up vectors, so 4 vectors
    take 15 shuffle/add instructions instead of 4 x 8 (the one-column _reduce2 is this tree at 2).
    Integer adds: the sums are exactly those of separate reductions."""
    n = len(vs)
    level = list(vs)           # entries: vectors whose lanes each hold partial sums of one v
    per = 16                   # lanes per original vector inside an entry
    while len(level) > 1:      # pair entries: (a, b) -> a's lane halves added, then b's
        half = per // 2
        nxt = []
        for i in range(0, len(level), 2):
            a, b = level[i], level[i + 1]
            lo, hi = [], []
            for g in range(16 // per):                 # groups of `per` lanes in a (and b)
                lo += list(range(g * per, g * per + half))
                hi += list(range(g * per + half, g * per + per))
            lo2 = lo + [16 + k for k in lo]
            hi2 = hi + [16 + k for k in hi]
            nxt.append(builder.add(builder.shuffle_vector(a, b, _const(_I32, lo2)),
                                   builder.shuffle_vector(a, b, _const(_I32, hi2))))
        level, per = nxt, half
    v = level[0]               # n groups of `per` lanes, group g = original vector g
    while per > 1:
        half = per // 2
        lo = [g * per + k for g in range(n) for k in range(half)]
        hi = [g * per + half + k for g in range(n) for k in range(half)]
        v = builder.add(builder.shuffle_vector(v, v, _const(_I32, lo)),
                        builder.shuffle_vector(v, v, _const(_I32, hi)))
        per = half
    return [builder.extract_element(v, _ir.Constant(_I32, g)) for g in range(n)]


def _codegen(kind):
    """codegen of (blk uint8[ts], xq int8[K], xoff int64, xs int32[K/16], soff int64) -> int32
    (IQ4_XS; Q6_K with its -32 offset applied: the block's whole integer sum, as
    cpu_gemv_kern._simd_block) or (int32 isum, int32 msum) (Q4_K/Q5_K: code and min sums,
    reduced together)."""
    def codegen(context, builder, sig, args):
        blk, xq, xoff, xs, soff = args
        ops = _Ops(builder)
        pw = _data(context, builder, sig.args[0], blk)
        px = builder.gep(_data(context, builder, sig.args[1], xq), [xoff], source_etype=_I8)
        ps = builder.gep(_data(context, builder, sig.args[3], xs), [soff], source_etype=_I32)
        if kind in (Q4_K, Q5_K):
            a, b = _block_vec(kind, ops, builder, pw, px, ps)
            return context.make_tuple(builder, sig.return_type, list(_reduce2(builder, a, b)))
        return ops.reduce(_block_vec(kind, ops, builder, pw, px, ps))
    return codegen


def _make(kind):
    ret = _nt.UniTuple(_nt.int32, 2) if kind in (Q4_K, Q5_K) else _nt.int32

    @_intrinsic
    def block_dot(tyctx, blk, xq, xoff, xs, soff):
        return ret(blk, xq, xoff, xs, soff), _codegen(kind)
    return block_dot


#: activation rows per multi-column block call (the verify block's M = k + 1 columns go through
#: in groups of COLS; a short last group repeats its last row and drops those results)
COLS = 4


def _codegen_cols(kind):
    """codegen of (blk uint8[ts], xq int8[B, K], xoff0..3 int64, xs int32[B, K/16], soff0..3 int64)
    -> COLS int32 (IQ4_XS, Q6_K) or 2 * COLS int32 (Q4_K/Q5_K: isum, msum per column): the block
    against four activation rows (flat element offsets into xq / xs), decoded once."""
    def codegen(context, builder, sig, args):
        blk, xq = args[0], args[1]
        xoffs = args[2:2 + COLS]
        xs = args[2 + COLS]
        soffs = args[3 + COLS:3 + 2 * COLS]
        ops = _Ops(builder)
        pw = _data(context, builder, sig.args[0], blk)
        bx = _data(context, builder, sig.args[1], xq)
        bs = _data(context, builder, sig.args[2 + COLS], xs)
        pxs = [builder.gep(bx, [o], source_etype=_I8) for o in xoffs]
        pss = [builder.gep(bs, [o], source_etype=_I32) for o in soffs]
        res = _block_cols(kind, ops, builder, pw, pxs, pss)
        vecs = [v for pair in res for v in pair] if kind in (Q4_K, Q5_K) else res
        return context.make_tuple(builder, sig.return_type, _reduce_many(builder, vecs))
    return codegen


def _make_cols(kind):
    ret = _nt.UniTuple(_nt.int32, 2 * COLS if kind in (Q4_K, Q5_K) else COLS)

    @_intrinsic
    def block_dot_cols(tyctx, blk, xq, xo0, xo1, xo2, xo3, xs, so0, so1, so2, so3):
        return ret(blk, xq, xo0, xo1, xo2, xo3, xs, so0, so1, so2, so3), _codegen_cols(kind)
    return block_dot_cols


_bdc_iq4_xs = _make_cols(IQ4_XS)
_bdc_q4_k = _make_cols(Q4_K)
_bdc_q5_k = _make_cols(Q5_K)
_bdc_q6_k = _make_cols(Q6_K)

_bd_iq4_xs = _make(IQ4_XS)
_bd_q4_k = _make(Q4_K)
_bd_q5_k = _make(Q5_K)
_bd_q6_k = _make(Q6_K)


@njit(inline="always")
def _f16(w, o, tab):
    return tab[np.int32(w[o]) | (np.int32(w[o + 1]) << 8)]


def _fma_codegen(context, builder, sig, args):
    f = _fn(builder, "llvm.fma.f32", _ir.FloatType(), [_ir.FloatType()] * 3)
    return builder.call(f, list(args))


@_intrinsic
def _fma(tyctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f32: vfmadd)."""
    return _nt.float32(_nt.float32, _nt.float32, _nt.float32), _fma_codegen


def prefetch_ir(builder, p, off, locality: int = 3) -> None:
    """Emit a prefetch of byte `off` (an i64 IR value) of byte pointer p.
    llvm.prefetch(ptr, rw = 0 read, locality (3 keep: prefetcht0, 2: prefetcht1), cache = 1 data).
    Its name carries the pointer type, which is opaque (p0) in newer llvmlite and i8* (p0i8) in
    older; prefetch never faults, so an address past the array (the next row, or past the last)
    is fine."""
    q = builder.gep(p, [off], source_etype=_I8)
    if getattr(q.type, "is_opaque", False):
        name = "llvm.prefetch.p0"
    else:
        q = builder.bitcast(q, _ir.PointerType(_I8))
        name = "llvm.prefetch.p0i8"
    f = _fn(builder, name, _ir.VoidType(), [q.type, _I32, _I32, _I32])
    builder.call(f, [q, _ir.Constant(_I32, 0), _ir.Constant(_I32, locality), _ir.Constant(_I32, 1)])


def _prefetch_codegen(context, builder, sig, args, locality=3):
    prefetch_ir(builder, _data(context, builder, sig.args[0], args[0]), args[1], locality)
    return context.get_dummy_value()


@_intrinsic
def _prefetch(tyctx, arr, off):
    """Hint the cache line holding byte `off` of arr's data into L1 (x86 prefetcht0)."""
    return _nt.void(arr, _nt.int64), _prefetch_codegen


def _prefetch_l2_codegen(context, builder, sig, args):
    return _prefetch_codegen(context, builder, sig, args, locality=2)


@_intrinsic
def _prefetch_l2(tyctx, arr, off):
    """Hint the cache line holding byte `off` of arr's data into L2 (x86 prefetcht1)."""
    return _nt.void(arr, _nt.int64), _prefetch_l2_codegen


#: bytes ahead of the block being read that each row's loop prefetches (0: none). The host rows
#: stream from RAM at ~6 GB/s per thread without it: one core does not keep enough misses in
#: flight. Session 9 on the device host (bench/cpu_gemv_avx512.py --copies 12, 17408 x 5120, the
#: four types): 16 threads 59.4 GB/s with none, 74.5 / 77.5 / 77.2 at 1024 / 2048 / 4096 bytes;
#: 1 thread 6.6 -> 10.5. The 8 GiB placed decode on one host: 6.88 -> 8.54 tok/s, host kernels
#: 64.8 -> 70.3 GB/s (bench/RESULTS.md session 9 call 6). TIGHTFIT_CPU_PREFETCH sets it.
def _prefetch_env() -> int:
    v = os.environ.get("TIGHTFIT_CPU_PREFETCH", "2048").strip() or "0"
    if not v.isdigit():
        raise ValueError(f"TIGHTFIT_CPU_PREFETCH={v!r}: expected a byte count >= 0 (0: no "
                         f"software prefetch)")
    return int(v)


PREFETCH = _prefetch_env()


#: a second, farther prefetch into L2 only (prefetcht1), bytes ahead of the block (0: none). The
#: L1 prefetch holds a line-fill buffer from issue to arrival (~10-16 per core); an L2 prefetch
#: only takes an L2 miss slot (~32-48), so a far one keeps more misses in flight per core and the
#: near one then hits L2. TIGHTFIT_CPU_PREFETCH_L2 sets it; it rides in the high 32 bits of `pf`
#: (pf = L1 distance + (L2 distance << 32)) so the kernels keep gemv_simd's signature plus one.
def _prefetch_l2_env() -> int:
    v = os.environ.get("TIGHTFIT_CPU_PREFETCH_L2", "0").strip() or "0"
    if not v.isdigit():
        raise ValueError(f"TIGHTFIT_CPU_PREFETCH_L2={v!r}: expected a byte count >= 0 (0: none)")
    return int(v)


PREFETCH_L2 = _prefetch_l2_env()


def prefetch_arg(l1: int = PREFETCH, l2: int = PREFETCH_L2) -> int:
    """The kernels' `pf` argument: L1 distance in the low 32 bits, L2 distance in the high."""
    if not (0 <= l1 < 1 << 31 and 0 <= l2 < 1 << 31):
        raise ValueError(f"prefetch distances out of range: {l1}, {l2}")
    return int(l1) | (int(l2) << 32)


PF_ARG = prefetch_arg()


@njit(inline="always")
def _pf_block(wr, o, ts, pf):
    p1 = pf & 0xFFFFFFFF
    p2 = pf >> 32
    if p1 > 0:
        for c in range(0, ts, 64):
            _prefetch(wr, np.int64(o + p1 + c))
    if p2 > 0:
        for c in range(0, ts, 64):
            _prefetch_l2(wr, np.int64(o + p2 + c))


@njit(inline="always")
def permute_x(xq, xp):
    """xp = xq with 128-bit lanes 1 and 2 of every 64 bytes swapped (elements 0-15, 32-47,
    16-31, 48-63): the order in which the IQ4_XS block code meets the activations."""
    for b in range(xq.shape[0]):
        for c in range(xq.shape[1] // 64):
            for t in range(16):
                xp[b, 64 * c + t] = xq[b, 64 * c + t]
                xp[b, 64 * c + 16 + t] = xq[b, 64 * c + 32 + t]
                xp[b, 64 * c + 32 + t] = xq[b, 64 * c + 16 + t]
                xp[b, 64 * c + 48 + t] = xq[b, 64 * c + 48 + t]
    return xp


@njit(inline="always")
def _row(qt, wr, ts, nb, xb, sb, xdb, tab, pf):
    """Row wr (nb blocks of ts bytes) times activation row xb (for IQ4_XS permuted by permute_x):
    the fp32 running sum over the
    blocks, rounded exactly as the AVX2 gemv_simd rounds it. That kernel is compiled with
    fastmath, and LLVM (checked on 22) turns its `acc += xd * (f * isum)` into
    fma(f * xd, isum, acc) and its `acc += xd * (f * isum - dmin * msum)` into
    fma(xd, fma(f, isum, -(dmin * msum)), acc) (the vfnmadd pair in its assembly is the same
    rounding). Here these forms are written out, without fastmath, so no reassociation can move
    them; tests/test_cpu_gemv_avx512.py checks the equality bit for bit."""
    acc = np.float32(0.0)
    if qt == IQ4_XS or qt == Q6_K:
        for ib in range(nb):
            _pf_block(wr, ib * ts, ts, pf)
            blk = wr[ib * ts:ib * ts + ts]
            if qt == IQ4_XS:
                isum = _bd_iq4_xs(blk, xb, np.int64(256 * ib), sb, np.int64(16 * ib))
                acc = _fma(_f16(blk, 0, tab) * xdb[ib], np.float32(isum), acc)
            else:
                isum = _bd_q6_k(blk, xb, np.int64(256 * ib), sb, np.int64(16 * ib))
                acc = _fma(_f16(blk, 208, tab) * xdb[ib], np.float32(isum), acc)
        return acc
    for ib in range(nb):
        _pf_block(wr, ib * ts, ts, pf)
        blk = wr[ib * ts:ib * ts + ts]
        if qt == Q4_K:
            isum, msum = _bd_q4_k(blk, xb, np.int64(256 * ib), sb, np.int64(16 * ib))
        else:
            isum, msum = _bd_q5_k(blk, xb, np.int64(256 * ib), sb, np.int64(16 * ib))
        v = _fma(_f16(blk, 0, tab), np.float32(isum), -(_f16(blk, 2, tab) * np.float32(msum)))
        acc = _fma(xdb[ib], v, acc)
    return acc


@njit(inline="always")
def _row_cols(qt, wr, ts, nb, xq, xs, xd, j0, j1, j2, j3, tab, pf):
    """_row for activation rows j0..j3 of xq / xs / xd (C-contiguous; xq permuted for IQ4_XS) in
    one pass over the row: each block decoded once (_block_cols). Each column's running sum is
    _row's, operation for operation, so every output is bit-identical to a one-column call."""
    K = np.int64(xq.shape[1])
    K16 = np.int64(xs.shape[1])
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    a3 = np.float32(0.0)
    for ib in range(nb):
        _pf_block(wr, ib * ts, ts, pf)
        blk = wr[ib * ts:ib * ts + ts]
        xo = np.int64(256 * ib)
        so = np.int64(16 * ib)
        x0, x1, x2, x3 = j0 * K + xo, j1 * K + xo, j2 * K + xo, j3 * K + xo
        s0, s1, s2, s3 = j0 * K16 + so, j1 * K16 + so, j2 * K16 + so, j3 * K16 + so
        if qt == IQ4_XS or qt == Q6_K:
            if qt == IQ4_XS:
                i0, i1, i2, i3 = _bdc_iq4_xs(blk, xq, x0, x1, x2, x3, xs, s0, s1, s2, s3)
                f = _f16(blk, 0, tab)
            else:
                i0, i1, i2, i3 = _bdc_q6_k(blk, xq, x0, x1, x2, x3, xs, s0, s1, s2, s3)
                f = _f16(blk, 208, tab)
            a0 = _fma(f * xd[j0, ib], np.float32(i0), a0)
            a1 = _fma(f * xd[j1, ib], np.float32(i1), a1)
            a2 = _fma(f * xd[j2, ib], np.float32(i2), a2)
            a3 = _fma(f * xd[j3, ib], np.float32(i3), a3)
        else:
            if qt == Q4_K:
                i0, m0, i1, m1, i2, m2, i3, m3 = _bdc_q4_k(blk, xq, x0, x1, x2, x3, xs,
                                                           s0, s1, s2, s3)
            else:
                i0, m0, i1, m1, i2, m2, i3, m3 = _bdc_q5_k(blk, xq, x0, x1, x2, x3, xs,
                                                           s0, s1, s2, s3)
            d = _f16(blk, 0, tab)
            dm = _f16(blk, 2, tab)
            a0 = _fma(xd[j0, ib], _fma(d, np.float32(i0), -(dm * np.float32(m0))), a0)
            a1 = _fma(xd[j1, ib], _fma(d, np.float32(i1), -(dm * np.float32(m1))), a1)
            a2 = _fma(xd[j2, ib], _fma(d, np.float32(i2), -(dm * np.float32(m2))), a2)
            a3 = _fma(xd[j3, ib], _fma(d, np.float32(i3), -(dm * np.float32(m3))), a3)
    return a0, a1, a2, a3


@njit(inline="always")
def row_groups(one, four, qt, wr, ts, nb, xq, xs, xd, y, yc, tab, pf):
    """y[b, yc] = row wr times activation row b, for every b: in groups of COLS through `four`
    (a short last group repeats its last row), a last single row through `one`. The row's bytes
    stay in L1 between the groups: memory traffic is one pass whatever B. one(qt, wr, ts, nb, xq,
    xs, xd, j, tab, pf) and four(..., j0, j1, j2, j3, tab, pf) are this module's _one_row /
    _row_cols or cpu_gemv_avx512_loop's vector-epilogue pair."""
    B = xq.shape[0]
    for b0 in range(0, B, COLS):
        last = min(b0 + COLS, B) - 1
        if last == b0:          # one row left: a padded group would decode for nothing
            y[b0, yc] = one(qt, wr, ts, nb, xq, xs, xd, np.int64(b0), tab, pf)
            continue
        r0, r1, r2, r3 = four(qt, wr, ts, nb, xq, xs, xd, np.int64(b0),
                              np.int64(min(b0 + 1, last)), np.int64(min(b0 + 2, last)),
                              np.int64(min(b0 + 3, last)), tab, pf)
        y[b0, yc] = r0
        if b0 + 1 <= last:
            y[b0 + 1, yc] = r1
        if b0 + 2 <= last:
            y[b0 + 2, yc] = r2
        if b0 + 3 <= last:
            y[b0 + 3, yc] = r3


@njit(inline="always")
def _one_row(qt, wr, ts, nb, xq, xs, xd, j, tab, pf):
    return _row(qt, wr, ts, nb, xq[j], xs[j], xd[j], tab, pf)


@njit(parallel=True, cache=True)
def gemv_avx512(qt, w, xq, xd, xs, y, tab, ssc, pf=PF_ARG):
    """cpu_gemv_kern.gemv_simd on AVX-512 VNNI: same signature, same result bit for bit
    (ssc is unused: the scales never leave the vector registers); pf: prefetch_arg(). Two or more
    activation rows go through _row_cols, COLS per pass over each weight row."""
    M = w.shape[0]
    nb = xq.shape[1] // 256
    ts = w.shape[1] // nb
    xp = permute_x(xq, np.empty(xq.shape, np.int8)) if qt == IQ4_XS else xq
    for r in prange(M):
        row_groups(_one_row, _row_cols, qt, w[r], ts, nb, xp, xs, xd, y, r, tab, pf)


@njit(parallel=True, cache=True)
def gemv_avx512_group(ws, qts, ycol, cm, cr0, cr1, xq, xd, xs, y, tab, ssc, pf=PF_ARG):
    """cpu_gemv_kern.gemv_simd_group on AVX-512 VNNI: same signature, same result bit for bit
    (pf: prefetch_arg())."""
    nb = xq.shape[1] // 256
    xp = permute_x(xq, np.empty(xq.shape, np.int8))
    for c in prange(cm.shape[0]):
        m = cm[c]
        w = ws[m]
        qt = qts[m]
        col = ycol[m]
        ts = w.shape[1] // nb
        xx = xp if qt == IQ4_XS else xq
        for r in range(cr0[c], cr1[c]):
            row_groups(_one_row, _row_cols, qt, w[r], ts, nb, xx, xs, xd, y, col + r, tab, pf)
