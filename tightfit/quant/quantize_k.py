"""Quantizers of the K-quants (Q2_K..Q6_K); byte layouts as in spec/quant-formats.md §2.3.

Affine types (Q2_K, Q4_K, Q5_K; y = d*sc*q - dmin*m) fit a per-sub-block (scale, min) by a
couple of least-squares passes starting from min/max; symmetric types (Q3_K, Q6_K; signed
sub-scales) start from the largest element mapped to the most negative code and refine the
scale by least squares. Then the sub-scales are expressed in units of the fp16 super-scales.
"""
from __future__ import annotations

import numpy as np

from tightfit.quant.quantize import (F32, U8, fp16_scale, pack_crumb_planes, safe_inv,
                                     signed_absmax)


def _affine_fit(xs: np.ndarray, top: int, iters: int = 2):
    """Per row of xs (n, S, B): scale >= 0 and offset lo <= 0 with x ~ scale*q + lo,
    q in 0..top."""
    lo = np.minimum(xs.min(axis=-1), 0)
    scale = (xs.max(axis=-1) - lo) / top
    B = xs.shape[-1]
    for _ in range(iters):
        q = np.clip(np.rint((xs - lo[..., None]) * safe_inv(scale)[..., None]), 0, top)
        sq, sqq = q.sum(-1), (q * q).sum(-1)
        sx, sxq = xs.sum(-1), (xs * q).sum(-1)
        det = B * sqq - sq * sq
        ok = det > 0
        a = np.where(ok, (B * sxq - sq * sx) / np.where(ok, det, 1), scale)
        b = np.where(ok, (sx - a * sq) / B, lo)
        # Keep lo <= 0 (mins are stored as non-negative amounts to subtract).
        pos = b > 0
        a = np.where(pos, np.where(sqq > 0, sxq / np.where(sqq > 0, sqq, 1), a), a)
        b = np.where(pos, 0, b)
        good = a > 0
        scale, lo = np.where(good, a, scale).astype(F32), np.where(good, b, lo).astype(F32)
    return scale, -lo


def _affine_k(x, n_sub, top, smax, sub):
    """Shared by Q2_K/Q4_K/Q5_K. Returns d bytes, dmin bytes, sc, m (n, n_sub), q (n, n_sub, B)."""
    n = x.shape[0]
    xs = x.reshape(n, n_sub, -1)
    scale, mins = _affine_fit(xs, top)
    db, d = fp16_scale(scale.max(axis=1) / smax, sub)
    dmb, dmin = fp16_scale(mins.max(axis=1) / smax, sub)
    # Nearest min code (rounding up instead would, with a super-scale raised to the fp16 normal
    # range, shift near-zero sub-blocks by a whole dmin).
    m = np.clip(np.rint(mins * safe_inv(dmin)[:, None]), 0, smax)
    eff_min = dmin[:, None] * m
    sc = np.clip(np.rint(scale * safe_inv(d)[:, None]), 0, smax)
    eff = d[:, None] * sc
    q = np.clip(np.rint((xs + eff_min[..., None]) * safe_inv(eff)[..., None]), 0, top)
    return db, dmb, sc.astype(U8), m.astype(U8), q.astype(U8)


def _q2_k(x, sub):
    db, dmb, sc, m, q = _affine_k(x, 16, 3, 15, sub)
    n = x.shape[0]
    return np.concatenate([sc | (m << 4), pack_crumb_planes(q.reshape(n, 256)), db, dmb], axis=1)


def k4_pack(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins -> the 12-byte K4 layout (inverse of spec §2.3 Q4_K)."""
    s = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
                        m[:, :4] | ((m[:, 4:] >> 4) << 6),
                        (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)], axis=1)
    return s.astype(U8)


def _q4_k(x, sub):
    db, dmb, sc, m, q = _affine_k(x, 8, 15, 63, sub)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(x.shape[0], 128)   # chunk c: sub-blocks 2c, 2c+1
    return np.concatenate([db, dmb, k4_pack(sc, m), qs], axis=1)


def _q5_k(x, sub):
    db, dmb, sc, m, q = _affine_k(x, 8, 31, 63, sub)
    n = x.shape[0]
    lo = q & 15
    qs = (lo[:, 0::2] | (lo[:, 1::2] << 4)).reshape(n, 128)
    hb = (q >> 4).astype(np.uint32)                                   # (n, 8 sub-blocks, 32)
    qh = (hb << np.arange(8, dtype=np.uint32)[None, :, None]).sum(axis=1).astype(U8)
    return np.concatenate([db, dmb, k4_pack(sc, m), qh, qs], axis=1)


def _sym_k(x, n_sub, half, lmax, sub, iters=2):
    """Signed sub-scales l*d (|l| <= lmax, l >= -lmax-1) and codes in -half..half-1."""
    n = x.shape[0]
    xs = x.reshape(n, n_sub, -1)
    s = signed_absmax(xs) / -half
    for _ in range(iters):
        q = np.clip(np.rint(xs * safe_inv(s)[..., None]), -half, half - 1)
        qq = (q * q).sum(-1)
        s = np.where(qq > 0, (xs * q).sum(-1) / np.where(qq > 0, qq, 1), s).astype(F32)
    db, d = fp16_scale(np.abs(s).max(axis=1) / lmax, sub)
    l = np.clip(np.rint(s * safe_inv(d)[:, None]), -lmax - 1, lmax)
    eff = d[:, None] * l
    q = np.clip(np.rint(xs * safe_inv(eff)[..., None]), -half, half - 1)
    return db, l.astype(np.int16), q.astype(np.int16).reshape(n, -1)


def _q3_k(x, sub):
    db, l, q = _sym_k(x, 16, 4, 31, sub)
    n = x.shape[0]
    u = (q + 4).astype(U8)                                           # 0..7
    hb = (u >> 2).reshape(n, 8, 32).astype(np.uint32)                # set bit = no -4 offset
    hmask = (hb << np.arange(8, dtype=np.uint32)[None, :, None]).sum(axis=1).astype(U8)
    qs = pack_crumb_planes(u & 3)
    v = (l + 32).astype(U8)                                          # 6-bit biased scales
    lo = (v[:, 0:8] & 15) | ((v[:, 8:16] & 15) << 4)
    hi = ((v >> 4) & 3).reshape(n, 4, 4)                             # [s/4, s%4]
    hi = hi[:, 0] | (hi[:, 1] << 2) | (hi[:, 2] << 4) | (hi[:, 3] << 6)
    return np.concatenate([hmask, qs, lo, hi, db], axis=1)


def _q6_k(x, sub):
    db, l, q = _sym_k(x, 16, 32, 127, sub)
    n = x.shape[0]
    u = (q + 32).astype(U8).reshape(n, 2, 4, 32)                     # [half, g, t]
    low, high = u & 15, u >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4),
                         low[:, :, 1] | (low[:, :, 3] << 4)], axis=2).reshape(n, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4)
          | (high[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, l.astype(np.int8).view(U8), db], axis=1)


ENCODERS = {10: _q2_k, 11: _q3_k, 12: _q4_k, 13: _q5_k, 14: _q6_k}
