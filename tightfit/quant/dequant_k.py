"""Decoders of the 256-element K-quants and the upstream ternary types TQ1_0 / TQ2_0
(spec/quant-formats.md §2.3). Layout offsets are quoted in each function."""
from __future__ import annotations

import numpy as np

from tightfit.quant.dequant import F32, crumb_planes, f16_at

_U8 = np.uint8


def k4_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """K4 packing of eight 6-bit scales and mins in 12 bytes (Q4_K/Q5_K, spec §2.3):
    j<4: sc = S[j]&63, m = S[j+4]&63; j>=4: low nibbles from S[j+4], high 2 bits from the top
    bits of S[j-4] (scales) and S[j] (mins)."""
    lo_sc, lo_m, mix = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_sc & 63, (mix & 15) | ((lo_sc >> 6) << 4)], axis=1)
    m = np.concatenate([lo_m & 63, (mix >> 4) | ((lo_m >> 6) << 4)], axis=1)
    return sc, m


def _q2_k(b):
    # scales 0..15 (low nibble scale, high nibble min), qs 16..79, d 80, dmin 82
    n = b.shape[0]
    sc = b[:, 0:16]
    dl = (f16_at(b, 80)[:, None] * (sc & 15).astype(F32))[:, :, None]
    ml = (f16_at(b, 82)[:, None] * (sc >> 4).astype(F32))[:, :, None]
    q = crumb_planes(b[:, 16:80]).reshape(n, 16, 16).astype(F32)
    return (dl * q - ml).reshape(n, 256)


def q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Sixteen signed 6-bit scales from 12 bytes: low nibble of S[s%8] (high half for s>=8),
    high 2 bits from S[8 + s%4] bits 2*(s/4)."""
    lo = np.concatenate([s[:, 0:8] & 15, s[:, 0:8] >> 4], axis=1)
    hi = (s[:, 8:12, None] >> np.array([0, 2, 4, 6], dtype=_U8)) & 3      # (n, k, s/4)
    hi = hi.transpose(0, 2, 1).reshape(-1, 16)                               # index s = 4*(s/4)+k
    return (lo | (hi << 4)).astype(np.int16) - 32


def _q3_k(b):
    # hmask 0..31, qs 32..95, scales 96..107, d 108
    n = b.shape[0]
    low = crumb_planes(b[:, 32:96]).astype(np.int16)
    hbit = (b[:, None, 0:32] >> np.arange(8, dtype=_U8)[None, :, None]) & 1   # (n, e/32, e%32)
    q = low - 4 * (1 - hbit.reshape(n, 256).astype(np.int16))               # clear bit: -4
    dl = (f16_at(b, 108)[:, None] * q3_k_scales(b[:, 96:108]).astype(F32))[:, :, None]
    return (dl * q.reshape(n, 16, 16).astype(F32)).reshape(n, 256)


def _nibble_chunks(qs: np.ndarray) -> np.ndarray:
    """(n, 128) -> (n, 256): chunk c of 32 bytes holds sub-block 2c in its low nibbles and
    sub-block 2c+1 in its high nibbles (Q4_K/Q5_K)."""
    n = qs.shape[0]
    q = qs.reshape(n, 4, 1, 32)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(n, 256)


def _k_affine(b, q):
    # d 0, dmin 2, K4 scales 4..15; y = (d*sc)*q - (dmin*m) per 32-element sub-block
    n = b.shape[0]
    sc, m = k4_scale_min(b[:, 4:16])
    dl = (f16_at(b, 0)[:, None] * sc.astype(F32))[:, :, None]
    ml = (f16_at(b, 2)[:, None] * m.astype(F32))[:, :, None]
    return (dl * q.reshape(n, 8, 32).astype(F32) - ml).reshape(n, 256)


def _q4_k(b):
    return _k_affine(b, _nibble_chunks(b[:, 16:144]))


def _q5_k(b):
    # qh 16..47: bit j of qh[e%32] is the fifth bit of element e in sub-block j = e/32
    n = b.shape[0]
    hbit = (b[:, None, 16:48] >> np.arange(8, dtype=_U8)[None, :, None]) & 1
    return _k_affine(b, _nibble_chunks(b[:, 48:176]) | (hbit.reshape(n, 256) << 4))


def _q6_k(b):
    # ql 0..127, qh 128..191, int8 scales 192..207, d 208
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 1, 2, 32)              # (half, -, g&1, t)
    low = np.concatenate([ql & 15, ql >> 4], axis=2)      # axis 2 = g>>1 -> g = 2*(g>>1)+(g&1)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=_U8)[None, None, :, None]
    q = (low.reshape(n, 2, 4, 32) | ((qh & 3) << 4)).astype(np.int16) - 32
    dl = (f16_at(b, 208)[:, None] * b[:, 192:208].view(np.int8).astype(F32))[:, :, None]
    return (dl * q.reshape(n, 16, 16).astype(F32)).reshape(n, 256)


def _tq2_0(b):
    # qs 0..63 crumb planes, d 64; y = d*(q-1)
    return f16_at(b, 64)[:, None] * (crumb_planes(b[:, 0:64]).astype(F32) - F32(1))


def trits(byte_arr: np.ndarray, n_trits: int) -> np.ndarray:
    """(n, m) bytes -> (n, n_trits, m): trit k = (((b * 3^k) mod 256) * 3) >> 8, k=0 first."""
    p = (3 ** np.arange(n_trits)).astype(np.uint16)[None, :, None]
    v = (byte_arr[:, None, :].astype(np.uint16) * p) & 0xFF
    return (v * 3) >> 8


def _tq1_0(b):
    # qs 0..47 (a 32-byte then a 16-byte stage, 5 trits each), qh 48..51 (4 trits), d 52
    n = b.shape[0]
    t = np.concatenate([trits(b[:, 0:32], 5).reshape(n, 160),
                        trits(b[:, 32:48], 5).reshape(n, 80),
                        trits(b[:, 48:52], 4).reshape(n, 16)], axis=1)
    return f16_at(b, 52)[:, None] * (t.astype(F32) - F32(1))


DECODERS = {10: _q2_k, 11: _q3_k, 12: _q4_k, 13: _q5_k, 14: _q6_k, 34: _tq1_0, 35: _tq2_0}
