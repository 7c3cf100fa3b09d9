"""Quantizers of the grid ("i-quant") types: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
IQ1_M. Layouts as in spec/quant-formats.md §2.3-2.4.

Method (simple, not llama.cpp's): signs are taken from the data (for the parity-coded types the
smallest element of an odd group has its sign flipped and its target magnitude set to 0), a
first sub-block scale comes from the sub-block's max (or rms for IQ1), and then the scale code is
chosen among l0-1, l0, l0+1 by the error of a nearest-grid-entry search at each. The grid search
is a chunked matmul argmax: |t - g|^2 = |t|^2 - 2(t.g - |g|^2/2).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from tightfit.quant import tables
from tightfit.quant.quantize import F32, U8, fp16_scale, safe_inv

_SCORE_BUDGET = 1 << 21          # floats per chunk of the (targets x grid) score matrix
EXHAUSTIVE = False               # full grid search instead of the neighbour lists (slow)
NEIGHBOURS = 16                  # grid entries tried per rounded level pattern
_BIT8 = np.arange(8, dtype=np.uint32)


def nearest_grid_exhaustive(t: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of t (m, k) -> index of the nearest row of g (N, k) and the squared distance, by a
    full search (chunked matmul). Exact but ~50x slower than `nearest_grid`; kept for tuning."""
    m, n_entries = t.shape[0], g.shape[0]
    gt = np.ascontiguousarray(g.T)
    half_sq = F32(0.5) * (g * g).sum(axis=1)
    idx = np.empty(m, dtype=np.int32)
    dist = np.empty(m, dtype=F32)
    step = max(1, _SCORE_BUDGET // n_entries)
    for i in range(0, m, step):
        tc = t[i:i + step]
        sc = tc @ gt
        sc -= half_sq
        j = sc.argmax(axis=1)
        idx[i:i + step] = j
        dist[i:i + step] = np.maximum((tc * tc).sum(axis=1) - 2 * sc[np.arange(len(j)), j], 0)
    return idx, dist


@lru_cache(maxsize=None)
def _neighbour_table(gname: str, k: int):
    """For every pattern of per-element levels (L^e of them), the k grid entries nearest to it.
    A target is first rounded element-wise to its pattern; its nearest grid entry is almost
    always among the pattern's neighbours, so only k entries need exact distances."""
    g = tables.grid(gname).astype(np.float64)
    levels = np.unique(g)
    n_lv, e = len(levels), g.shape[1]
    ids = np.arange(n_lv ** e)
    codes = (ids[:, None] // (n_lv ** np.arange(e))[None, :]) % n_lv
    v = levels[codes]
    d2 = (v * v).sum(1)[:, None] - 2 * v @ g.T + (g * g).sum(1)[None, :]
    near = np.argpartition(d2, k, axis=1)[:, :k]
    order = np.take_along_axis(d2, near, axis=1).argsort(axis=1, kind="stable")
    near = np.take_along_axis(near, order, axis=1).astype(np.int32)
    mids = ((levels[1:] + levels[:-1]) / 2).astype(F32)
    place = (n_lv ** np.arange(e)).astype(np.int32)
    vecs = tables.grid(gname)[near]                               # (patterns, k, e)
    return near, np.ascontiguousarray(vecs), (vecs * vecs).sum(-1), mids, place


def nearest_grid(t: np.ndarray, gname: str, k: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Rows of t (m, e) -> index of the (nearly always) nearest entry of grid `gname` and the
    squared distance, searching the k neighbours of t's rounded level pattern."""
    near, vecs, vsq, mids, place = _neighbour_table(gname, k)
    m, e = t.shape
    idx = np.empty(m, dtype=np.int32)
    dist = np.empty(m, dtype=F32)
    step = max(1, _SCORE_BUDGET // (k * e))
    for i in range(0, m, step):
        tc = t[i:i + step]
        code = np.zeros(tc.shape, dtype=np.int32)
        for mid in mids:
            code += tc > mid
        pid = (code * place).sum(axis=1)
        # |g - t|^2 = |g|^2 - 2 g.t + |t|^2; the last term does not change the argmin.
        sc = vsq[pid] - 2 * np.matmul(vecs[pid], tc[:, :, None])[..., 0]
        j = sc.argmin(axis=1)
        rows = np.arange(len(j))
        idx[i:i + step] = near[pid, j]
        dist[i:i + step] = np.maximum(sc[rows, j] + (tc * tc).sum(axis=1), 0)
    return idx, dist


def search_scales(vals, d, l0, lmax, mult, gname, deltas=(0.0,), delta_per_group=False, spread=1):
    """Approximate vals (n, S, k, e) by dl*(g[idx] + delta), dl = d*mult(l) per (n, S).
    Tries l in l0-spread..l0+spread. Returns l (n, S), idx (n, S, k), delta choice (n, S, k) and
    the squared error (n, S)."""
    n, S, k, e = vals.shape
    best_err = np.full((n, S), np.inf, dtype=F32)
    best_l = l0.copy()
    best_idx = np.zeros((n, S, k), dtype=np.int32)
    best_ds = np.zeros((n, S, k), dtype=np.int8)
    for off in range(-spread, spread + 1):
        l = np.clip(l0 + off, 0, lmax)
        dl = (d[:, None] * mult(l)).astype(F32)
        inv = safe_inv(dl)[..., None, None]
        errs, idxs = [], []
        for delta in deltas:
            t = (vals * inv - F32(delta)).reshape(-1, e)
            if EXHAUSTIVE:
                idx, dist = nearest_grid_exhaustive(t, tables.grid(gname))
            else:
                idx, dist = nearest_grid(t, gname, NEIGHBOURS)
            errs.append(dist.reshape(n, S, k) * (dl * dl)[..., None])
            idxs.append(idx.reshape(n, S, k))
        E, I = np.stack(errs), np.stack(idxs)
        if delta_per_group:
            ds = E.argmin(axis=0)
            err = E.min(axis=0).sum(axis=-1)
        else:
            tot = E.sum(axis=-1)
            ds = np.broadcast_to(tot.argmin(axis=0)[..., None], (n, S, k))
            err = tot.min(axis=0)
        idx = np.take_along_axis(I, ds[None], axis=0)[0]
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_l = np.where(better, l, best_l)
        best_idx = np.where(better[..., None], idx, best_idx)
        best_ds = np.where(better[..., None], ds, best_ds).astype(np.int8)
    return best_l.astype(np.int64), best_idx, best_ds, best_err


def signs_and_magnitudes(x8: np.ndarray, even_parity: bool):
    """x8 (..., 8) -> (negative bits (..., 8) bool, target magnitudes). With even parity, an odd
    group flips the sign bit of its smallest element, whose target becomes 0 (the sign is then
    wrong, so the least harm is the smallest magnitude)."""
    a = np.abs(x8)
    neg = x8 < 0
    if even_parity:
        odd = (neg.sum(axis=-1) & 1).astype(bool)
        flip = (np.arange(8) == a.argmin(axis=-1)[..., None]) & odd[..., None]
        neg = neg ^ flip
        a = np.where(flip, F32(0), a)
    return neg, a


def bits_to_int(bits: np.ndarray) -> np.ndarray:
    """(..., 8) bool -> (...) uint32, bit j = element j."""
    return (bits.astype(np.uint32) << _BIT8).sum(axis=-1).astype(np.uint32)


def _init_scales(dl0, lmax, mult, sub):
    """Super-scale d so the largest sub-scale is reachable, and the nearest code l0 per
    sub-block for dl0. `mult` must be increasing in l."""
    db, d = fp16_scale(dl0.max(axis=1) / mult(lmax), sub)
    levels = mult(np.arange(lmax + 1))
    ratio = dl0 * safe_inv(d)[:, None]
    l0 = np.abs(ratio[..., None] - levels).argmin(axis=-1)
    return db, d, l0


def search_blocks(vals, amax_sub, fits, lmax, mult, gname, sub, **kw):
    """Run the scale search once per hypothesis `fit` (sub-block scale = its max / fit; the
    first hypothesis gets l0+-1, the others l0 only) and keep, per block, the hypothesis with
    the least total error. The first fit suits bell-shaped data; a fit equal to the smallest
    grid level rescues flat blocks. Returns d bytes, l, idx, delta choice."""
    best = None
    for h, fit in enumerate(fits):
        db, d, l0 = _init_scales(amax_sub / F32(fit), lmax, mult, sub)
        l, idx, ds, err = search_scales(vals, d, l0, lmax, mult, gname, spread=1 if h == 0 else 0,
                                        **kw)
        tot = err.sum(axis=1)
        if best is None:
            best = [db, l, idx, ds, tot]
            continue
        w = tot < best[4]
        for i, new in enumerate((db, l, idx, ds, tot)):
            best[i] = np.where(w.reshape((-1,) + (1,) * (new.ndim - 1)), new, best[i])
    return best[0], best[1], best[2], best[3]


def _mult_iq2(l):
    return (2 * np.asarray(l, dtype=F32) + 1) / 8


def _mult_iq3xxs(l):
    return (2 * np.asarray(l, dtype=F32) + 1) / 4


def _mult_odd(l):
    return 2 * np.asarray(l, dtype=F32) + 1


def _iq2_common(x, sub, gname, per16, parity, fit=34.0):
    """Shared IQ2 search. Returns d bytes, l (n, S), idx (n, 32 groups), negative bits (n, 32, 8)."""
    n = x.shape[0]
    neg, a = signs_and_magnitudes(x.reshape(n, 32, 8), parity)
    S = 16 if per16 else 8
    av = a.reshape(n, S, 32 // S, 8)
    db, l, idx, _ = search_blocks(av, av.max(axis=(2, 3)), (fit, 8.0), 15, _mult_iq2, gname, sub)
    return db, l, idx.reshape(n, 32), neg


def _iq2_xxs(x, sub):
    n = x.shape[0]
    db, l, idx, neg = _iq2_common(x, sub, "iq2xxs", False, True)
    s7 = (bits_to_int(neg) & 127).reshape(n, 8, 4)
    aux = (s7 << (7 * np.arange(4, dtype=np.uint32))).sum(axis=-1) | (l.astype(np.uint32) << 28)
    sub_bytes = np.concatenate([idx.reshape(n, 8, 4).astype(U8),
                                aux.astype("<u4").view(U8).reshape(n, 8, 4)], axis=2)
    return np.concatenate([db, sub_bytes.reshape(n, 64)], axis=1)


def _iq2_scales_bytes(l):
    return (l[:, 0::2] | (l[:, 1::2] << 4)).astype(U8)


def _iq2_xs(x, sub):
    n = x.shape[0]
    db, l, idx, neg = _iq2_common(x, sub, "iq2xs", True, True)
    w = idx.astype(np.uint32) | ((bits_to_int(neg) & 127) << 9)
    return np.concatenate([db, w.astype("<u2").view(U8).reshape(n, 64), _iq2_scales_bytes(l)],
                          axis=1)


def _iq2_s(x, sub):
    n = x.shape[0]
    db, l, idx, neg = _iq2_common(x, sub, "iq2s", True, False)
    idx = idx.astype(np.uint32)
    hi = (idx >> 8).reshape(n, 8, 4)
    qh = (hi << (2 * np.arange(4, dtype=np.uint32))).sum(axis=-1).astype(U8)
    return np.concatenate([db, (idx & 255).astype(U8), bits_to_int(neg).astype(U8), qh,
                           _iq2_scales_bytes(l)], axis=1)


def _iq3_common(x, sub, gname, parity, mult, fit):
    n = x.shape[0]
    neg, a = signs_and_magnitudes(x.reshape(n, 32, 8), parity)
    av = a.reshape(n, 8, 8, 4)                                  # sub-block, quad, element
    low = float(tables.grid(gname).min())
    db, l, idx, _ = search_blocks(av, av.max(axis=(2, 3)), (fit, low), 15, mult, gname, sub)
    return db, l, idx, neg


def _iq3_xxs(x, sub):
    n = x.shape[0]
    db, l, idx, neg = _iq3_common(x, sub, "iq3xxs", True, _mult_iq3xxs, 56.0)
    s7 = (bits_to_int(neg) & 127).reshape(n, 8, 4)
    aux = (s7 << (7 * np.arange(4, dtype=np.uint32))).sum(axis=-1) | (l.astype(np.uint32) << 28)
    return np.concatenate([db, idx.reshape(n, 64).astype(U8),
                           aux.astype("<u4").view(U8).reshape(n, 32)], axis=1)


def _iq3_s(x, sub):
    n = x.shape[0]
    db, l, idx, neg = _iq3_common(x, sub, "iq3s", False, _mult_odd, 14.0)
    idx = idx.astype(np.uint32)                                 # (n, 8, 8)
    qh = bits_to_int((idx >> 8).astype(bool)).astype(U8)        # bit k: quad k of sub-block
    sc = (l[:, 0::2] | (l[:, 1::2] << 4)).astype(U8)
    return np.concatenate([db, (idx & 255).reshape(n, 64).astype(U8), qh,
                           bits_to_int(neg).astype(U8), sc], axis=1)


_IQ1_DELTAS = (tables.IQ1S_DELTA, -tables.IQ1S_DELTA)


def _iq1_scale0(xv):
    # The +-1 level sits near 1.2 rms for bell-shaped data (ternary Lloyd optimum).
    return F32(1.2) * np.sqrt((xv * xv).mean(axis=(2, 3)))


def _iq1_s(x, sub):
    n = x.shape[0]
    xv = x.reshape(n, 8, 4, 8)
    db, d, l0 = _init_scales(_iq1_scale0(xv), 7, _mult_odd, sub)
    l, idx, ds, _ = search_scales(xv, d, l0, 7, _mult_odd, "iq1s", _IQ1_DELTAS)
    idx = idx.astype(np.uint32)
    hi = ((idx >> 8) << (3 * np.arange(4, dtype=np.uint32))).sum(axis=-1)
    qh = hi | (l.astype(np.uint32) << 12) | (ds[:, :, 0].astype(np.uint32) << 15)
    return np.concatenate([db, (idx & 255).reshape(n, 32).astype(U8),
                           qh.astype("<u2").view(U8).reshape(n, 16)], axis=1)


def _iq1_m(x, sub):
    n = x.shape[0]
    xv = x.reshape(n, 16, 2, 8)
    db, d, l0 = _init_scales(_iq1_scale0(xv), 7, _mult_odd, sub)
    l, idx, ds, _ = search_scales(xv, d, l0, 7, _mult_odd, "iq1s", _IQ1_DELTAS,
                               delta_per_group=True)
    idx = idx.reshape(n, 32).astype(np.uint32)
    nib = (idx >> 8) | (ds.reshape(n, 32).astype(np.uint32) << 3)
    qh = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(U8)
    dbits = db.view("<u2").reshape(n).astype(np.uint32)         # fp16 bits, spread by nibble
    words = (l.astype(np.uint32).reshape(n, 4, 4) << (3 * np.arange(4, dtype=np.uint32))).sum(-1)
    words |= ((dbits[:, None] >> (4 * np.arange(4, dtype=np.uint32))) & 15) << 12
    return np.concatenate([(idx & 255).astype(U8), qh,
                           words.astype("<u2").view(U8).reshape(n, 8)], axis=1)


ENCODERS = {16: _iq2_xxs, 17: _iq2_xs, 22: _iq2_s, 18: _iq3_xxs, 21: _iq3_s, 19: _iq1_s,
            29: _iq1_m}
