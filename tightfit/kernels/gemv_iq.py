"""GEMV bodies for the grid formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S.

Grid entries (8 magnitudes of IQ2, 4 of IQ3, one byte each, all in 1..62) are gathered from small
device tables (2-8 KiB: they stay in L1/L2). Signs come from a 384-entry table of int64 byte
masks: entries 0..255 expand an explicit sign byte (0xFF where the bit is set), entries
256..383 expand a 7-bit IQ2/IQ3 sign index with its implied even-parity eighth bit
(spec §2.2, ksigns). A masked word is negated per byte as (g ^ m) + (m & 0x01): since every
magnitude is >= 1 no byte carries into the next. Contract as in gemv_k.py.
"""
from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from tightfit.kernels.gemv_prims import dp4a, ld_u8, ld_u16, ld_w32, ld_f16
from tightfit.kernels.gemv_k import act_w, act_d, M1

SIGN7 = tl.constexpr(256)   # offset of the 7-bit-index half of the sign table


def host_tables() -> dict:
    """NumPy tables (built once from tightfit.quant.tables): 'sign' int64[384], and one grid
    per format, packed little-endian: int64 (IQ2: 8 bytes) or int32 (IQ3: 4 bytes)."""
    from tightfit.quant import tables
    bits = (np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1
    mask256 = (bits.astype(np.uint64) * np.uint64(0xFF)) << (np.arange(8, dtype=np.uint64) * 8)
    mask256 = np.bitwise_or.reduce(mask256, axis=1)
    sign = np.concatenate([mask256, mask256[tables.KSIGNS.astype(np.int64)]]).view(np.int64)
    out = {"sign": sign}
    for name in ("iq2xxs", "iq2xs", "iq2s", "iq3xxs", "iq3s"):
        g = tables.grid(name).astype(np.uint8)
        out[name] = np.ascontiguousarray(g).view(np.int64 if g.shape[1] == 8 else np.int32)[:, 0]
    return out


@triton.jit
def _signed(g, msk):
    return (g ^ msk) + (msk & M1)


@triton.jit
def _grid8(tg, tsm, gi, si, m):
    """One IQ2 group of 8: grid index gi, sign-table index si -> two signed int8x4 words."""
    g = tl.load(tg + gi, mask=m, other=0)
    s = tl.load(tsm + si, mask=m, other=0)
    g0 = (g & 0xFFFFFFFF).to(tl.int32)
    g1 = (g >> 32).to(tl.int32)
    s0 = (s & 0xFFFFFFFF).to(tl.int32)
    s1 = (s >> 32).to(tl.int32)
    return _signed(g0, s0), _signed(g1, s1)


@triton.jit
def blk_iq2(base, m, xa, dab, s16b, km, acc, KW, tg, tsm, FMT: tl.constexpr, EMU: tl.constexpr):
    """FMT 16 = IQ2_XXS (scale per 32), 17 = IQ2_XS, 22 = IQ2_S (scales per 16)."""
    d = ld_f16(base, m)
    for ib in tl.static_range(8):
        if FMT == 16:
            aux = ld_w32(base + 2 + 8 * ib + 4, m, False)
            isum = tl.zeros(acc.shape, tl.int32)
        else:
            sc = ld_u8(base + (66 if FMT == 17 else 74) + ib, m)
            ia = tl.zeros(acc.shape, tl.int32)
            ib2 = tl.zeros(acc.shape, tl.int32)
        if FMT == 22:
            qh = ld_u8(base + 66 + ib, m)
        for l in tl.static_range(4):
            if FMT == 16:
                gi = ld_u8(base + 2 + 8 * ib + l, m)
                si = SIGN7 + ((aux >> (7 * l)) & 127)
            elif FMT == 17:
                q = ld_u16(base + 2 + 8 * ib + 2 * l, m)
                gi = q & 511
                si = SIGN7 + (q >> 9)
            else:
                gi = ld_u8(base + 2 + 4 * ib + l, m) | (((qh >> (2 * l)) & 3) << 8)
                si = ld_u8(base + 34 + 4 * ib + l, m)
            w0, w1 = _grid8(tg, tsm, gi, si, m)
            a0 = act_w(xa, km, KW, 8 * ib + 2 * l)
            a1 = act_w(xa, km, KW, 8 * ib + 2 * l + 1)
            if FMT == 16:
                isum = dp4a(w1[None, :, :], a1, dp4a(w0[None, :, :], a0, isum, EMU), EMU)
            elif l < 2:
                ia = dp4a(w1[None, :, :], a1, dp4a(w0[None, :, :], a0, ia, EMU), EMU)
            else:
                ib2 = dp4a(w1[None, :, :], a1, dp4a(w0[None, :, :], a0, ib2, EMU), EMU)
        if FMT == 16:
            f = d * (2 * ((aux >> 28) & 15) + 1).to(tl.float32) * 0.125
            acc += act_d(dab, km, ib) * isum.to(tl.float32) * f[None, :, :]
        else:
            fa = d * (2 * (sc & 15) + 1).to(tl.float32) * 0.125
            fb = d * (2 * (sc >> 4) + 1).to(tl.float32) * 0.125
            acc += act_d(dab, km, ib) * (ia.to(tl.float32) * fa[None, :, :]
                                         + ib2.to(tl.float32) * fb[None, :, :])
    return acc


@triton.jit
def blk_iq3(base, m, xa, dab, s16b, km, acc, KW, tg, tsm, FMT: tl.constexpr, EMU: tl.constexpr):
    """FMT 18 = IQ3_XXS, 21 = IQ3_S; both one scale per 32 and 4-byte grid entries."""
    d = ld_f16(base, m)
    for ib in tl.static_range(8):
        if FMT == 18:
            aux = ld_w32(base + 66 + 4 * ib, m, False)
        else:
            qh = ld_u8(base + 66 + ib, m)
        isum = tl.zeros(acc.shape, tl.int32)
        for l in tl.static_range(4):
            i1 = ld_u8(base + 2 + 8 * ib + 2 * l, m)
            i2 = ld_u8(base + 2 + 8 * ib + 2 * l + 1, m)
            if FMT == 18:
                si = SIGN7 + ((aux >> (7 * l)) & 127)
            else:
                i1 = i1 | (((qh >> (2 * l)) & 1) << 8)
                i2 = i2 | (((qh >> (2 * l + 1)) & 1) << 8)
                si = ld_u8(base + 74 + 4 * ib + l, m)
            s = tl.load(tsm + si, mask=m, other=0)
            g0 = tl.load(tg + i1, mask=m, other=0)
            g1 = tl.load(tg + i2, mask=m, other=0)
            w0 = _signed(g0, (s & 0xFFFFFFFF).to(tl.int32))
            w1 = _signed(g1, (s >> 32).to(tl.int32))
            isum = dp4a(w0[None, :, :], act_w(xa, km, KW, 8 * ib + 2 * l), isum, EMU)
            isum = dp4a(w1[None, :, :], act_w(xa, km, KW, 8 * ib + 2 * l + 1), isum, EMU)
        if FMT == 18:
            f = d * (2 * ((aux >> 28) & 15) + 1).to(tl.float32) * 0.25
        else:
            sc = (ld_u8(base + 106 + ib // 2, m) >> (4 * (ib % 2))) & 15
            f = d * (1 + 2 * sc).to(tl.float32)
        acc += act_d(dab, km, ib) * isum.to(tl.float32) * f[None, :, :]
    return acc
