"""Decoders of the grid ("i-quant") types and IQ4_XS (spec/quant-formats.md §2.3, §2.4).

Signs are applied as a multiply by +-1 after the scale*grid product; negation is exact, so the
result equals the C reference's `db * grid * sign`.
"""
from __future__ import annotations

import numpy as np

from tightfit.quant import tables
from tightfit.quant.dequant import F32, f16_at, nibbles_half_split, u16_at, u32_at

_U8 = np.uint8
_BITS = np.arange(8, dtype=_U8)


def _sign_bits(sign_bytes: np.ndarray) -> np.ndarray:
    """(...,) sign bytes -> (..., 8) float32 +-1, bit j set = element j negative."""
    bits = (sign_bytes[..., None] >> _BITS) & 1
    return F32(1) - F32(2) * bits.astype(F32)


def _iq2_xxs(b):
    # d 0; per sub-block ib: 4 index bytes at 2+8ib, u32 at 6+8ib (4 x 7-bit sign idx, scale bits 28..31)
    n = b.shape[0]
    sub = b[:, 2:66].reshape(n, 8, 8)
    idx = sub[:, :, 0:4]
    aux = np.ascontiguousarray(sub[:, :, 4:8]).view("<u4")[..., 0]           # (n, 8)
    db = f16_at(b, 0)[:, None] * (F32(0.5) + (aux >> 28).astype(F32)) * F32(0.25)
    sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 127
    sg = _sign_bits(tables.KSIGNS[sidx])                                       # (n, 8, 4, 8)
    g = tables.grid("iq2xxs")[idx]                                             # (n, 8, 4, 8)
    return (db[:, :, None, None] * g * sg).reshape(n, 256)


def _iq2_scales(sc: np.ndarray) -> np.ndarray:
    """8 bytes of two 4-bit scales -> (n, 16) per-16-element scales (low nibble first)."""
    n = sc.shape[0]
    return np.stack([sc & 15, sc >> 4], axis=2).reshape(n, 16)


def _iq2_xs(b):
    # d 0, qs u16[32] at 2 (9-bit grid idx | 7-bit sign idx << 9), scales 66..73
    n = b.shape[0]
    qs = u16_at(b, 2, 32)
    db = f16_at(b, 0)[:, None] * (F32(0.5) + _iq2_scales(b[:, 66:74]).astype(F32)) * F32(0.25)
    g = tables.grid("iq2xs")[qs & 511]                                         # (n, 32, 8)
    sg = _sign_bits(tables.KSIGNS[qs >> 9])
    return (db.reshape(n, 16, 1, 1) * (g * sg).reshape(n, 16, 2, 8)).reshape(n, 256)


def _iq2_s(b):
    # d 0, idx low bits 2..33, signs 34..65, qh 66..73 (2 bits per group), scales 74..81
    n = b.shape[0]
    qh = (b[:, 66:74, None] >> np.array([0, 2, 4, 6], dtype=_U8)) & 3         # (n, ib, l)
    idx = b[:, 2:34].astype(np.uint16) | (qh.reshape(n, 32).astype(np.uint16) << 8)
    db = f16_at(b, 0)[:, None] * (F32(0.5) + _iq2_scales(b[:, 74:82]).astype(F32)) * F32(0.25)
    g = tables.grid("iq2s")[idx]
    sg = _sign_bits(b[:, 34:66])
    return (db.reshape(n, 16, 1, 1) * (g * sg).reshape(n, 16, 2, 8)).reshape(n, 256)


def _iq3_xxs(b):
    # d 0, 64 index bytes at 2 (two 4-wide entries per group of 8), u32[8] at 66
    n = b.shape[0]
    aux = u32_at(b, 66, 8)                                                     # (n, 8)
    db = f16_at(b, 0)[:, None] * (F32(0.5) + (aux >> 28).astype(F32)) * F32(0.5)
    sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 127
    sg = _sign_bits(tables.KSIGNS[sidx])                                       # (n, 8, 4, 8)
    g = tables.grid("iq3xxs")[b[:, 2:66]].reshape(n, 8, 4, 8)
    return (db[:, :, None, None] * g * sg).reshape(n, 256)


def _iq3_s(b):
    # d 0, qs 2..65, qh 66..73 (bit k = 9th bit of index k of sub-block), signs 74..105, scales 106..109
    n = b.shape[0]
    hb = ((b[:, 66:74, None] >> _BITS) & 1).reshape(n, 64).astype(np.uint16)
    idx = b[:, 2:66].astype(np.uint16) | (hb << 8)
    sc = np.stack([b[:, 106:110] & 15, b[:, 106:110] >> 4], axis=2).reshape(n, 8)
    db = f16_at(b, 0)[:, None] * (1 + 2 * sc.astype(F32))
    g = tables.grid("iq3s")[idx].reshape(n, 8, 4, 8)
    sg = _sign_bits(b[:, 74:106]).reshape(n, 8, 4, 8)
    return (db[:, :, None, None] * g * sg).reshape(n, 256)


def _iq1_s(b):
    # d 0, qs 2..33 (low 8 index bits), qh u16[8] at 34: bits 3l..3l+2 high index bits of group l,
    # bits 12..14 scale, bit 15 delta sign
    n = b.shape[0]
    qh = u16_at(b, 34, 8)                                                      # (n, 8)
    dl = f16_at(b, 0)[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(F32)
    delta = np.where(qh & 0x8000, F32(-tables.IQ1S_DELTA), F32(tables.IQ1S_DELTA))
    hi = (qh[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint32)) & 7
    idx = b[:, 2:34].astype(np.uint32) | (hi.reshape(n, 32) << 8)
    g = tables.grid("iq1s")[idx].reshape(n, 8, 32)
    return (dl[:, :, None] * (g + delta[:, :, None])).reshape(n, 256)


def iq1_m_d(b: np.ndarray) -> np.ndarray:
    """IQ1_M's fp16 super-scale: the top nibbles of the four u16 scale words, word k giving
    bits 4k..4k+3."""
    w = u16_at(b, 48, 4)
    bits = (w[:, 0] >> 12) | ((w[:, 1] >> 8) & 0xF0) | ((w[:, 2] >> 4) & 0xF00) | (w[:, 3] & 0xF000)
    return bits.astype(np.uint16).view(np.float16).astype(F32)


def _iq1_m(b):
    # qs 0..31, qh 32..47 (one nibble per group of 8: 3 index bits + delta sign), scales u16[4] at 48
    n = b.shape[0]
    w = u16_at(b, 48, 4)
    sc = ((w[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint32)) & 7).reshape(n, 16)
    dl = iq1_m_d(b)[:, None] * (2 * sc + 1).astype(F32)                        # per 16 elements
    nib = np.stack([b[:, 32:48] & 15, b[:, 32:48] >> 4], axis=2).reshape(n, 32)
    idx = b[:, 0:32].astype(np.uint32) | ((nib & 7).astype(np.uint32) << 8)
    delta = np.where(nib & 8, F32(-tables.IQ1S_DELTA), F32(tables.IQ1S_DELTA))
    g = tables.grid("iq1s")[idx]                                               # (n, 32, 8)
    return (dl.reshape(n, 16, 1, 1) * (g + delta[:, :, None]).reshape(n, 16, 2, 8)).reshape(n, 256)


def _iq4_xs(b):
    # d 0, scales_h u16 at 2, scales_l 4..7, qs 8..135 (16 bytes per sub-block, half-split)
    n = b.shape[0]
    sh = u16_at(b, 2, 1)                                                        # (n, 1)
    sl = np.stack([b[:, 4:8] & 15, b[:, 4:8] >> 4], axis=2).reshape(n, 8).astype(np.uint32)
    ls = sl | (((sh >> (2 * np.arange(8, dtype=np.uint32))[None, :]) & 3) << 4)
    dl = f16_at(b, 0)[:, None] * (ls.astype(F32) - F32(32))
    kv = tables.KVALUES_IQ4NL.astype(F32)[nibbles_half_split(b[:, 8:136])]
    return (dl[:, :, None] * kv.reshape(n, 8, 32)).reshape(n, 256)


DECODERS = {16: _iq2_xxs, 17: _iq2_xs, 22: _iq2_s, 18: _iq3_xxs, 21: _iq3_s, 19: _iq1_s,
            29: _iq1_m, 23: _iq4_xs}
