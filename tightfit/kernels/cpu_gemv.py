"""Quantized GEMV on the CPU, straight from raw GGUF blocks (host-resident rows read in place from
the read-only mmap), and single-row decode for the host embedding table (seed 004 §1.1).

One numba function per job, parallel over output rows (prange over row chunks). Each block is
decoded into a 256-float local buffer with the formulas of spec/quant-formats.md §2.3, then dotted
with every activation row (batch B for speculative verify). Decoding into a tiny buffer keeps the
inner dot a plain vectorizable loop; the weight bytes are read exactly once per GEMV, which is what
a memory-bound kernel needs. Types without a numba decoder fall back to the NumPy dequantizer one
chunk of rows at a time (never the whole matrix).

Accumulation is float32 per block, summed in float32 per row (like ggml's CPU path).
"""
from __future__ import annotations

import numpy as np
import numba
from numba import njit, prange

# ggml type ids (spec/quant-formats.md §1)
F32, F16, Q4_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS = 0, 1, 2, 8, 10, 11, 12, 13, 14, 20, 23

#: (elements per block, bytes per block) of the types decoded natively here.
NATIVE: dict[int, tuple[int, int]] = {
    Q4_0: (32, 18), Q8_0: (32, 34), IQ4_NL: (32, 18), IQ4_XS: (256, 136), Q2_K: (256, 84),
    Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), F16: (1, 2),
}

# every IEEE binary16 bit pattern -> float32: a 256 KiB table beats bit-twiddling in numba
_F16 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
# kvalues_iq4nl (spec/quant-formats.md §2.2)
_KV4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                dtype=np.float32)
ROW_CHUNK = 16   # rows per parallel work item: enough to amortize scheduling, small for balance


@njit(inline="always")
def _h(w, r, o, tab):
    return tab[np.int32(w[r, o]) | (np.int32(w[r, o + 1]) << 8)]


@njit(inline="always")
def _s8(v):
    v = np.int32(v)
    return v - ((v >> 7) << 8)


@njit(inline="always")
def _k4(w, r, o, j):
    """6-bit scale and min j (0..7) of the Q4_K/Q5_K 12-byte packing starting at o."""
    if j < 4:
        sc = np.int32(w[r, o + j]) & 63
        m = np.int32(w[r, o + j + 4]) & 63
    else:
        sc = (np.int32(w[r, o + j + 4]) & 15) | ((np.int32(w[r, o + j - 4]) >> 6) << 4)
        m = (np.int32(w[r, o + j + 4]) >> 4) | ((np.int32(w[r, o + j]) >> 6) << 4)
    return sc, m


@njit(inline="always")
def _decode_block(qt, w, r, o, buf, k0, tab, kv4):
    """Decode the block at byte o of row r into buf[k0 + k0:k0 + block_size]."""
    if qt == Q8_0:
        d = _h(w, r, o, tab)
        for i in range(32):
            buf[k0 + i] = d * _s8(w[r, o + 2 + i])
    elif qt == Q4_0:
        d = _h(w, r, o, tab)
        for j in range(16):
            b = np.int32(w[r, o + 2 + j])
            buf[k0 + j] = d * ((b & 15) - 8)
            buf[k0 + j + 16] = d * ((b >> 4) - 8)
    elif qt == IQ4_NL:
        d = _h(w, r, o, tab)
        for j in range(16):
            b = np.int32(w[r, o + 2 + j])
            buf[k0 + j] = d * kv4[b & 15]
            buf[k0 + j + 16] = d * kv4[b >> 4]
    elif qt == IQ4_XS:
        d = _h(w, r, o, tab)
        sh = np.int32(w[r, o + 2]) | (np.int32(w[r, o + 3]) << 8)
        for ib in range(8):
            ls = ((np.int32(w[r, o + 4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
            dl = d * (ls - 32)
            q0 = o + 8 + 16 * ib
            for j in range(16):
                b = np.int32(w[r, q0 + j])
                buf[k0 + 32 * ib + j] = dl * kv4[b & 15]
                buf[k0 + 32 * ib + j + 16] = dl * kv4[b >> 4]
    elif qt == Q2_K:
        d = _h(w, r, o + 80, tab)
        dmin = _h(w, r, o + 82, tab)
        for h in range(2):
            for g in range(4):
                for half in range(2):
                    s = 8 * h + 2 * g + half
                    sc = np.int32(w[r, o + s])
                    dl = d * (sc & 15)
                    ml = dmin * (sc >> 4)
                    e0 = 128 * h + 32 * g + 16 * half
                    q0 = o + 16 + 32 * h + 16 * half
                    for t in range(16):
                        buf[k0 + e0 + t] = dl * ((np.int32(w[r, q0 + t]) >> (2 * g)) & 3) - ml
    elif qt == Q3_K:
        d = _h(w, r, o + 108, tab)
        for h in range(2):
            for g in range(4):
                for half in range(2):
                    s = 8 * h + 2 * g + half
                    sc = (((np.int32(w[r, o + 96 + s % 8]) >> (4 * (s // 8))) & 15)
                          | (((np.int32(w[r, o + 104 + s % 4]) >> (2 * (s // 4))) & 3) << 4)) - 32
                    dl = d * sc
                    e0 = 128 * h + 32 * g + 16 * half
                    hb = 4 * h + g          # hmask bit keeps counting over both halves
                    for t in range(16):
                        m = 16 * half + t
                        low = (np.int32(w[r, o + 32 + 32 * h + m]) >> (2 * g)) & 3
                        hi = (np.int32(w[r, o + m]) >> hb) & 1
                        buf[k0 + e0 + t] = dl * (low - 4 + 4 * hi)
    elif qt == Q4_K or qt == Q5_K:
        d = _h(w, r, o, tab)
        dmin = _h(w, r, o + 2, tab)
        qs = o + 16 if qt == Q4_K else o + 48
        for j in range(8):
            sc, m = _k4(w, r, o + 4, j)
            dl = d * sc
            ml = dmin * m
            c0 = qs + 32 * (j // 2)
            sh = 4 * (j % 2)
            if qt == Q4_K:
                for t in range(32):
                    buf[k0 + 32 * j + t] = dl * ((np.int32(w[r, c0 + t]) >> sh) & 15) - ml
            else:
                for t in range(32):
                    q = ((np.int32(w[r, c0 + t]) >> sh) & 15) | (((np.int32(w[r, o + 16 + t]) >> j) & 1) << 4)
                    buf[k0 + 32 * j + t] = dl * q - ml
    elif qt == Q6_K:
        d = _h(w, r, o + 208, tab)
        for h in range(2):
            for g in range(4):
                for half in range(2):
                    e0 = 128 * h + 32 * g + 16 * half
                    dl = d * _s8(w[r, o + 192 + e0 // 16])
                    for u in range(16):
                        t = 16 * half + u
                        low = (np.int32(w[r, o + 64 * h + t + 32 * (g & 1)]) >> (4 * (g >> 1))) & 15
                        hi = (np.int32(w[r, o + 128 + 32 * h + t]) >> (2 * g)) & 3
                        buf[k0 + e0 + u] = dl * ((low | (hi << 4)) - 32)
    elif qt == F16:
        buf[k0 + 0] = _h(w, r, o, tab)


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_native(qt, bs, ts, w, x, y, tab, kv4):
    """y[b, r] = sum_k W[r, k] x[b, k] for every row r of the raw matrix w (M, row_bytes)."""
    M = w.shape[0]
    B = x.shape[0]
    nb = w.shape[1] // ts
    nchunks = (M + ROW_CHUNK - 1) // ROW_CHUNK
    for c in prange(nchunks):
        # decode a whole row first (stores only, no dependency chain), then one long dot per
        # activation row: LLVM vectorizes long loops but leaves 16/32-trip reductions scalar
        buf = np.empty(nb * bs, np.float32)
        for r in range(c * ROW_CHUNK, min(M, (c + 1) * ROW_CHUNK)):
            for ib in range(nb):
                _decode_block(qt, w, r, ib * ts, buf, ib * bs, tab, kv4)
            for b in range(B):
                s = np.float32(0.0)
                for k in range(nb * bs):
                    s += buf[k] * x[b, k]
                y[b, r] = s


@njit(parallel=True, cache=True)
def _decode_rows_native(qt, bs, ts, w, rows, out, tab, kv4):
    """out[i, :] = dequantized row rows[i] of the raw matrix w."""
    nb = w.shape[1] // ts
    for i in prange(rows.shape[0]):
        r = rows[i]
        for ib in range(nb):
            _decode_block(qt, w, r, ib * ts, out[i], ib * bs, tab, kv4)


# ---- public API ------------------------------------------------------------------------------
def _sizes(qtype: int) -> tuple[int, int]:
    try:
        from tightfit.quant.traits import traits
        t = traits(int(qtype))
        return t.block_size, t.type_size
    except ImportError:  # pragma: no cover
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        return GGML_QUANT_SIZES[GGMLQuantizationType(int(qtype))]


def _dequant_rows(raw2d: np.ndarray, qtype: int) -> np.ndarray:
    """Reference dequantizer for the fallback path (project table first, gguf-py otherwise)."""
    bs, ts = _sizes(qtype)
    k = raw2d.shape[1] // ts * bs
    try:
        from tightfit.quant.dequant import dequantize
        return np.asarray(dequantize(raw2d, int(qtype), (raw2d.shape[0], k)),
                          dtype=np.float32).reshape(raw2d.shape[0], k)
    except (ImportError, TypeError):
        import gguf.quants
        from gguf.constants import GGMLQuantizationType
        return gguf.quants.dequantize(raw2d, GGMLQuantizationType(int(qtype))).astype(
            np.float32).reshape(raw2d.shape[0], k)


def as_rows(raw: np.ndarray | memoryview | bytes, row_bytes: int, n_rows: int | None = None,
            offset: int = 0) -> np.ndarray:
    """Zero-copy (n_rows, row_bytes) uint8 view of raw bytes (e.g. a slice of the mmap)."""
    buf = np.frombuffer(raw, dtype=np.uint8, count=-1 if n_rows is None else n_rows * row_bytes,
                        offset=offset)
    return buf.reshape(-1, row_bytes)


def gemv(w: np.ndarray, qtype: int, x: np.ndarray, out: np.ndarray | None = None,
         fallback_rows: int = 256) -> np.ndarray:
    """W (raw rows, shape (M, row_bytes) uint8) times x ((K,) or (B, K)); returns (M,) or (B, M)
    float32. Never materializes W dequantized, except `fallback_rows` rows at a time for types
    without a native decoder."""
    qtype = int(qtype)
    x = np.asarray(x, dtype=np.float32)
    vec = x.ndim == 1
    x2 = np.ascontiguousarray(x.reshape(1, -1) if vec else x)
    bs, ts = _sizes(qtype)
    M, rb = w.shape
    if rb % ts or rb // ts * bs != x2.shape[1]:
        raise ValueError(f"row of {rb} B of type {qtype} does not hold K={x2.shape[1]} elements")
    y = out if out is not None else np.empty((x2.shape[0], M), dtype=np.float32)
    y2 = y.reshape(x2.shape[0], M)
    if qtype == F32:
        y2[:] = x2 @ w.view(np.float32).T
    elif qtype in NATIVE:
        _gemv_native(qtype, bs, ts, w, x2, y2, _F16, _KV4)
    else:
        for r0 in range(0, M, fallback_rows):
            blk = _dequant_rows(w[r0:r0 + fallback_rows], qtype)
            y2[:, r0:r0 + blk.shape[0]] = x2 @ blk.T
    return y2[0] if vec else y2


def decode_rows(w: np.ndarray, qtype: int, rows) -> np.ndarray:
    """Dequantize the given rows of raw matrix w to float32 (n, K): the host embedding lookup."""
    qtype = int(qtype)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    M, rb = w.shape
    if rows.size and (rows.min() < 0 or rows.max() >= M):
        raise IndexError(f"row id out of range 0..{M - 1}")
    bs, ts = _sizes(qtype)
    out = np.empty((rows.size, rb // ts * bs), dtype=np.float32)
    if qtype == F32:
        out[:] = w.view(np.float32)[rows]
    elif qtype in NATIVE:
        _decode_rows_native(qtype, bs, ts, w, rows, out, _F16, _KV4)
    else:
        for i, r in enumerate(rows):
            out[i] = _dequant_rows(w[r:r + 1], qtype)[0]
    return out


def n_threads() -> int:
    return numba.get_num_threads()
