"""Simple, vectorized quantizers for every type in TRAITS (used by the synthetic model generator
and by kernel tests). They aim for valid blocks and decent error, not for llama.cpp's exact
bytes: absmax or small candidate searches for scales, nearest code or nearest grid entry.

fp16 scales: by default a non-zero scale is never an fp16 subnormal (it is raised to the smallest
normal, 2^-14, and the sub-scales absorb the difference), because spec/gguf-synthetic-traps.md
shows realistic weights would otherwise give subnormal Q6_K/IQ4_XS scales in most blocks. Pass
`allow_subnormal=True` to keep the natural (subnormal) scales, e.g. to test a kernel's fp16
decoding on them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tightfit.errors import GGUFError
from tightfit.quant import tables
from tightfit.quant.traits import Q2_0, QTypeLike, traits

F32 = np.float32
U8 = np.uint8
FP16_MIN_NORMAL = 2.0 ** -14
FP16_MAX = 65504.0
Encoder = Callable[[np.ndarray, bool], np.ndarray]   # (n_blocks, block_size) f32 -> bytes


# ---- shared helpers -----------------------------------------------------------------------------

def fp16_scale(d: np.ndarray, allow_subnormal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Round scales to fp16. Returns (the stored bytes (..., 2), the stored value as float32).
    Zero stays zero; unless allowed, non-zero magnitudes below 2^-14 become +-2^-14."""
    d = np.asarray(d, dtype=F32)
    mag = np.minimum(np.abs(d), F32(FP16_MAX))
    if not allow_subnormal:
        mag = np.where((mag > 0) & (mag < FP16_MIN_NORMAL), F32(FP16_MIN_NORMAL), mag)
    h = np.copysign(mag, d).astype(np.float16)
    return h.view(U8).reshape(*d.shape, 2), h.astype(F32)


def safe_inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)


def signed_absmax(x: np.ndarray) -> np.ndarray:
    """The element of largest magnitude along the last axis, with its sign."""
    i = np.argmax(np.abs(x), axis=-1)[..., None]
    return np.take_along_axis(x, i, axis=-1)[..., 0]


def pack_half_split(q: np.ndarray) -> np.ndarray:
    """(n, 32k) codes < 16 -> (n, 16k) bytes, inverse of the half-split nibble order."""
    n = q.shape[0]
    q = q.astype(U8).reshape(n, -1, 2, 16)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, -1)


def pack_crumb_planes(q: np.ndarray) -> np.ndarray:
    """(n, 128k) codes < 4 -> (n, 32k) bytes, inverse of the crumb-plane order."""
    n = q.shape[0]
    q = q.astype(U8).reshape(n, -1, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(n, -1)


def pack_bits_le(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits.astype(U8), axis=-1, bitorder="little")


def lut_nearest(levels: np.ndarray, res: int = 8):
    """Nearest-level lookup for values in [min, max] of sorted `levels`, via a table at 1/res
    resolution: much faster than searchsorted on big arrays; a value within 1/(2 res) of a
    midpoint may pick the other neighbour, which costs nothing measurable."""
    levels = np.asarray(levels, dtype=np.float64)
    lo = float(levels.min())
    grid = lo + np.arange(int((levels.max() - lo) * res) + 1) / res
    table = np.abs(grid[:, None] - levels[None, :]).argmin(axis=1).astype(U8)

    def nearest(t: np.ndarray) -> np.ndarray:
        i = np.rint((t - F32(lo)) * F32(res))
        return table[np.clip(i, 0, len(table) - 1).astype(np.int32)]
    return nearest


# ---- float types ------------------------------------------------------------------------------

def _f32(x, sub):
    return x.astype("<f4").view(U8)


def _f16(x, sub):
    return np.clip(x, -FP16_MAX, FP16_MAX).astype("<f2").view(U8)


def _bf16(x, sub):
    u = x.astype(F32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16          # round to nearest even (inputs are finite)
    return u.astype("<u2").view(U8)


# ---- legacy 32-element types -------------------------------------------------------------------

def _q8_0(x, sub):
    db, d = fp16_scale(np.abs(x).max(axis=1) / 127, sub)
    q = np.clip(np.rint(x * safe_inv(d)[:, None]), -127, 127).astype(np.int8)
    return np.concatenate([db, q.view(U8)], axis=1)


def _sym_legacy(x, sub, half):
    # The largest-magnitude element maps to code 0 (value -half*d), so both signs get `half`
    # levels of reach: d = m / -half as in the spec's reference quantizers.
    db, d = fp16_scale(signed_absmax(x) / -half, sub)
    q = np.clip(np.rint(x * safe_inv(d)[:, None]) + half, 0, 2 * half - 1).astype(U8)
    return db, q


def _q4_0(x, sub):
    db, q = _sym_legacy(x, sub, 8)
    return np.concatenate([db, pack_half_split(q)], axis=1)


def _q5_0(x, sub):
    db, q = _sym_legacy(x, sub, 16)
    return np.concatenate([db, pack_bits_le(q >> 4), pack_half_split(q & 15)], axis=1)


def _affine_legacy(x, sub, top):
    mn = x.min(axis=1)
    mb, m = fp16_scale(mn, True)
    # A tiny negative min becomes -2^-14 (still <= every element), a tiny positive one 0.
    if not sub:
        tiny = (m != 0) & (np.abs(m) < FP16_MIN_NORMAL)
        mb, m = fp16_scale(np.where(tiny, np.where(m < 0, F32(-FP16_MIN_NORMAL), F32(0)), m), True)
    db, d = fp16_scale((x.max(axis=1) - m) / top, sub)
    q = np.clip(np.rint((x - m[:, None]) * safe_inv(d)[:, None]), 0, top).astype(U8)
    return db, mb, q


def _q4_1(x, sub):
    db, mb, q = _affine_legacy(x, sub, 15)
    return np.concatenate([db, mb, pack_half_split(q)], axis=1)


def _q5_1(x, sub):
    db, mb, q = _affine_legacy(x, sub, 31)
    return np.concatenate([db, mb, pack_bits_le(q >> 4), pack_half_split(q & 15)], axis=1)


# ---- IQ4_NL / IQ4_XS / MXFP4: non-uniform 16-entry codebooks ----------------------------------

_KV = tables.KVALUES_IQ4NL.astype(F32)
_kv_nearest = lut_nearest(_KV)
# Divisors tried for the block scale: the largest element maps to one of these codebook values.
_IQ4_TARGETS = np.array([-127.0, -119.0, -111.0, 113.0, 105.0], dtype=F32)


def iq4_codes(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return _kv_nearest(x * safe_inv(scale)[..., None])


def iq4_best_scale(x: np.ndarray) -> np.ndarray:
    """Per row of x (..., 32): the scale among m/target for a few codebook targets that gives
    the least squared error."""
    m = signed_absmax(x)
    best, best_err = None, None
    for tgt in _IQ4_TARGETS:
        s = m / tgt
        err = ((x - s[..., None] * _KV[iq4_codes(x, s)]) ** 2).sum(axis=-1)
        if best is None:
            best, best_err = s, err
        else:
            better = err < best_err
            best, best_err = np.where(better, s, best), np.where(better, err, best_err)
    return best


def _iq4_nl(x, sub):
    db, d = fp16_scale(iq4_best_scale(x), sub)
    return np.concatenate([db, pack_half_split(iq4_codes(x, d))], axis=1)


def _iq4_xs(x, sub):
    n = x.shape[0]
    xs = x.reshape(n, 8, 32)
    s = iq4_best_scale(xs)                                     # (n, 8) ideal sub-block scales
    db, d = fp16_scale(np.abs(s).max(axis=1) / 31, sub)
    ls = np.clip(np.rint(s * safe_inv(d)[:, None]), -32, 31)
    codes = iq4_codes(xs, d[:, None] * ls)
    u = (ls + 32).astype(np.uint32)                            # 6-bit biased scale
    sh = ((u >> 4) << (2 * np.arange(8, dtype=np.uint32))).sum(axis=1).astype("<u2")
    sl = (u[:, 0::2] & 15) | ((u[:, 1::2] & 15) << 4)
    return np.concatenate([db, sh.view(U8).reshape(n, 2), sl.astype(U8),
                           pack_half_split(codes.reshape(n, 256))], axis=1)


_FP4 = tables.KVALUES_FP4.astype(F32)
_fp4_levels = np.unique(_FP4)
_fp4_nearest_level = lut_nearest(_fp4_levels)
_fp4_code_of_level = np.array([int(np.flatnonzero(_FP4 == v)[0]) for v in _fp4_levels], dtype=U8)


def _mxfp4(x, sub):
    # value = kv[code] * 2^(E-128), |kv| <= 12. Try the smallest E that fits the max without
    # clipping, and one below it (finer steps, clipped max); keep the better per block.
    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore"):
        e0 = np.ceil(np.log2(np.where(amax > 0, amax, 1) / 12)) + 128
    e0 = np.where(amax > 0, e0, 128)
    best_e, best_lv, best_err = None, None, None
    for e in (np.clip(e0, 1, 254), np.clip(e0 - 1, 1, 254)):
        scale = np.ldexp(F32(1), e.astype(np.int32) - 128).astype(F32)
        lv = _fp4_nearest_level(x / scale[:, None])
        err = ((x - scale[:, None] * _fp4_levels[lv].astype(F32)) ** 2).sum(axis=1)
        if best_e is None:
            best_e, best_lv, best_err = e, lv, err
        else:
            better = err < best_err
            best_e = np.where(better, e, best_e)
            best_lv = np.where(better[:, None], lv, best_lv)
            best_err = np.where(better, err, best_err)
    codes = _fp4_code_of_level[best_lv]
    return np.concatenate([best_e.astype(U8)[:, None], pack_half_split(codes)], axis=1)


# ---- binary / ternary ---------------------------------------------------------------------------

def ls_levels(x: np.ndarray, lo: int, hi: int, d0: np.ndarray, iters: int = 4):
    """Scale d and integer codes c in [lo, hi] for y = d*c, by alternating nearest-code and the
    least-squares scale sum(x c)/sum(c^2) (Lloyd iterations from d0). Returns (d, c)."""
    d = d0.astype(F32)
    for _ in range(iters):
        c = np.clip(np.rint(x * safe_inv(d)[:, None]), lo, hi)
        den = (c * c).sum(axis=1)
        d = np.where(den > 0, (x * c).sum(axis=1) / np.where(den > 0, den, 1), d).astype(F32)
    return d, c


def _ternary(x, sub):
    """d and codes in {0,1,2} (value (c-1)*d) for TQ1_0/TQ2_0; d starts at 1.2*rms, near the
    optimum for bell-shaped data, then Lloyd-refined."""
    rms = np.sqrt((x * x).mean(axis=1))
    d, _ = ls_levels(x, -1, 1, F32(1.2) * rms)
    db, d = fp16_scale(d, sub)
    c = np.clip(np.rint(x * safe_inv(d)[:, None]), -1, 1) + 1
    return db, c.astype(U8)


def _tq2_0(x, sub):
    db, c = _ternary(x, sub)
    return np.concatenate([pack_crumb_planes(c), db], axis=1)


def _base3_bytes(t: np.ndarray, n_trits: int, pre: int = 1) -> np.ndarray:
    """(n, n_trits, m) trits, first most significant -> (n, m) bytes ceil(v*256/243)."""
    w = (3 ** np.arange(n_trits - 1, -1, -1)).astype(np.uint32)[None, :, None]
    v = (t.astype(np.uint32) * w).sum(axis=1) * pre
    return ((v * 256 + 242) // 243).astype(U8)


def _tq1_0(x, sub):
    db, c = _ternary(x, sub)
    n = x.shape[0]
    # element 32k+m -> trit k of qs[m]; 160+16k+m -> trit k of qs[32+m]; 240+4k+m -> trit k of qh[m]
    qs0 = _base3_bytes(c[:, 0:160].reshape(n, 5, 32), 5)
    qs1 = _base3_bytes(c[:, 160:240].reshape(n, 5, 16), 5)
    qh = _base3_bytes(c[:, 240:256].reshape(n, 4, 4), 4, pre=3)   # 4 trits, shifted up one place
    return np.concatenate([qs0, qs1, qh, db], axis=1)


def _q1_0(x, sub):
    db, _ = fp16_scale(np.abs(x).mean(axis=1), sub)   # mean|x| is the L2-optimal sign scale
    return np.concatenate([db, pack_bits_le(x >= 0)], axis=1)


def _q2_0(x, sub):
    # Codes 0..3 mean -1, 0, +1, +2 (times d). Fit both orientations of the asymmetric range
    # (largest element as +2 or as -1) and keep the better; d may not be negative-flipped
    # because the code table is fixed, so the orientation is chosen by the data.
    rms = np.sqrt((x * x).mean(axis=1))
    m = signed_absmax(x)
    best_d, best_err = None, None
    for d0 in (F32(1.2) * rms, np.abs(m) / 2, np.abs(m)):
        d, c = ls_levels(x, -1, 2, d0)
        err = ((x - d[:, None] * c) ** 2).sum(axis=1)
        if best_d is None:
            best_d, best_err = d, err
        else:
            better = err < best_err
            best_d, best_err = np.where(better, d, best_d), np.where(better, err, best_err)
    db, d = fp16_scale(best_d, sub)
    c = (np.clip(np.rint(x * safe_inv(d)[:, None]), -1, 2) + 1).astype(U8)
    n = x.shape[0]
    c = c.reshape(n, 16, 4)
    qs = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
    return np.concatenate([db, qs], axis=1)


# ---- dispatch ---------------------------------------------------------------------------------

_ENCODERS: dict[int, Encoder] | None = None
_CHUNK_ELEMENTS = 1 << 20      # work in ~4 MiB float32 slices: cache-friendly and bounded memory


def _encoders() -> dict[int, Encoder]:
    from tightfit.quant import quantize_iq, quantize_k
    enc = {0: _f32, 1: _f16, 30: _bf16, 2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0,
           20: _iq4_nl, 23: _iq4_xs, 39: _mxfp4, 34: _tq1_0, 35: _tq2_0, 41: _q1_0, Q2_0: _q2_0}
    enc.update(quantize_k.ENCODERS)
    enc.update(quantize_iq.ENCODERS)
    return enc


def quantize(x: np.ndarray, qtype: QTypeLike, *, allow_subnormal: bool = False) -> np.ndarray:
    """Quantize float rows to `qtype`. `x` has shape (..., cols) with cols a multiple of the
    block size; the result is uint8 of shape (..., row_bytes). Deterministic."""
    global _ENCODERS
    if _ENCODERS is None:
        _ENCODERS = _encoders()
    t = traits(qtype)
    x = np.asarray(x, dtype=F32)
    if x.ndim == 0:
        raise ValueError("quantize needs at least a 1-D array of rows")
    cols = x.shape[-1]
    if cols % t.block_size:
        raise GGUFError(f"row length {cols} is not a multiple of the {t.name} block size "
                        f"{t.block_size}")
    if not np.isfinite(x).all():
        raise ValueError(f"cannot quantize non-finite values to {t.name}")
    enc = _ENCODERS[t.type_id]
    blocks = np.ascontiguousarray(x).reshape(-1, t.block_size)
    out = np.empty((blocks.shape[0], t.type_size), dtype=U8)
    step = max(1, _CHUNK_ELEMENTS // t.block_size)
    for i in range(0, blocks.shape[0], step):
        out[i:i + step] = enc(blocks[i:i + step], allow_subnormal).reshape(-1, t.type_size)
    return out.reshape(*x.shape[:-1], cols // t.block_size * t.type_size)
