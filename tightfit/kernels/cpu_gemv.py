"""Quantized GEMV on the CPU, straight from raw GGUF blocks (host-resident rows read in place from
the read-only mmap), and single-row decode for the host embedding table (seed 004 §1.1).

`gemv` quantizes the activations once per call (int8, one scale per 256, spec §3.8 "Q8_K") and
runs an integer kernel per 256-element weight block (cpu_gemv_kern.py: on AVX2 hosts `gemv_simd`,
explicit vpshufb/vpmaddubsw/vpmaddwd code, for IQ4_XS, Q4_K, Q5_K, Q6_K; the portable numba
kernels gemv_int (K-quants) and gemv_iq (IQ2/IQ3 grids) otherwise; the ternary TQ2_0/TQ1_0 in
cpu_gemv_ternary.py, AVX2 or portable), or an fp32 kernel for the
32-element types (Q8_0, Q4_0, IQ4_NL). Parallel over output
rows with `set_threads(n)` threads (numba's pool); all scratch is preallocated and reused.
Other types (and rows whose K is not a multiple of 256 for the integer types) go through the
NumPy dequantizer `fallback_rows` rows at a time, never the whole matrix.

`Group` runs several matrices that read the same x (a layer's host rows on one input) in ONE
parallel call: x quantized once, the rows of all of them in byte-balanced chunks, each row
bit-identical to `gemv`'s (tightfit.model.placed.HostGroup, the executor's host branch).
The ternary matrices (TQ2_0/TQ1_0) of a group run in a second such call, and all its other
low-bit matrices (IQ2_S/IQ2_XS/IQ3_XXS/IQ3_S/Q2_K/Q3_K: the portable kernels) in a third
(cpu_gemv_lowbit.gemv_lowbit_group), all sharing the quantized x.

`decode_rows` decodes whole rows to fp32 with the per-block formulas of spec §2.3 below.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import numba
from numba import njit, prange

from tightfit.kernels import cpu_gemv_kern as _K
from tightfit.kernels import cpu_gemv_ternary as _T
from tightfit.kernels import cpu_gemv_avx512 as _A
from tightfit.kernels import cpu_gemv_avx512_loop as _AV
from tightfit.kernels import cpu_gemv_lowbit as _L


def _epilogue_env() -> str:
    """TIGHTFIT_CPU_EPILOGUE: 'vector' (default: the row loop in IR, block factors applied to the
    int32 lanes, cpu_gemv_avx512_loop; 1.04-1.39x one thread in cache, session 11) or 'scalar'
    (cpu_gemv_avx512's per-block integer and scalar fp32, bit-identical to the AVX2 kernel)."""
    v = os.environ.get("TIGHTFIT_CPU_EPILOGUE", "vector").strip() or "vector"
    if v not in ("vector", "scalar"):
        raise ValueError(f"TIGHTFIT_CPU_EPILOGUE={v!r}: expected 'vector' or 'scalar'")
    return v


_VEC = _epilogue_env() == "vector"
#: AVX-512 VNNI twins of gemv_simd / gemv_simd_group where the host has avx512f/bw/vnni (2-3x the
#: AVX2 kernels per thread on Zen 4); TIGHTFIT_CPU_AVX512=0 keeps the AVX2 ones
_SIMD_ONE = (_AV.gemv_avx512v if _VEC else _A.gemv_avx512) if _A.ENABLED else _K.gemv_simd
_SIMD_GRP = (_AV.gemv_avx512v_group if _VEC else _A.gemv_avx512_group) if _A.ENABLED \
    else _K.gemv_simd_group

# ggml type ids (spec/quant-formats.md §1)
F32, F16, Q4_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS = 0, 1, 2, 8, 10, 11, 12, 13, 14, 20, 23
IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S = 17, 18, 21, 22
TQ1_0, TQ2_0 = _T.TQ1_0, _T.TQ2_0

#: types decoded by `decode_rows` without the NumPy dequantizer: (elements, bytes) per block
#: (TQ1_0/TQ2_0 by cpu_gemv_ternary.decode_tq, the others by _decode_rows_native)
_DECODE_NATIVE: dict[int, tuple[int, int]] = {
    Q4_0: (32, 18), Q8_0: (32, 34), IQ4_NL: (32, 18), IQ4_XS: (256, 136), Q2_K: (256, 84),
    Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), F16: (1, 2),
    TQ1_0: (256, 54), TQ2_0: (256, 66),
}
#: types with a native (numba) path, in gemv or decode_rows: (elements, bytes) per block
NATIVE: dict[int, tuple[int, int]] = {
    **_DECODE_NATIVE, IQ2_XS: (256, 74), IQ3_XXS: (256, 98), IQ3_S: (256, 110), IQ2_S: (256, 82),
}

# every IEEE binary16 bit pattern -> float32: a 256 KiB table beats bit-twiddling in numba
_F16 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
# kvalues_iq4nl (spec/quant-formats.md §2.2)
_KV4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                dtype=np.float32)


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


@njit(parallel=True, cache=True)
def _decode_rows_native(qt, bs, ts, w, rows, out, tab, kv4):
    """out[i, :] = dequantized row rows[i] of the raw matrix w."""
    nb = w.shape[1] // ts
    for i in prange(rows.shape[0]):
        r = rows[i]
        for ib in range(nb):
            _decode_block(qt, w, r, ib * ts, out[i], ib * bs, tab, kv4)


# ---- integer/fp32 GEMV kernels (cpu_gemv_kern.py): tables and reusable scratch ----------------
_POOL = numba.config.NUMBA_NUM_THREADS
_threads = _POOL
_KV4_16 = _KV4.astype(np.int16)


def _sign_rows(n: int) -> np.ndarray:
    """(n, 8) int16 +-1: bit j of the sign byte set = element j negative; for n = 128 the 7-bit
    index is first expanded with its parity bit (ksigns_iq2xs, spec §2.2)."""
    i = np.arange(n)
    if n == 128:
        i = i | ((np.array([bin(v).count("1") for v in i]) & 1) << 7)
    return (1 - 2 * ((i[:, None] >> np.arange(8)) & 1)).astype(np.int16)


def _grids() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    from tightfit.quant import tables
    g = {n: np.ascontiguousarray(tables.grid(n).astype(np.uint8)) for n in
         ("iq2xs", "iq2s", "iq3xxs", "iq3s")}
    s7, s8 = _sign_rows(128), _sign_rows(256)
    return {IQ2_XS: (g["iq2xs"], s7), IQ2_S: (g["iq2s"], s8), IQ3_XXS: (g["iq3xxs"], s7),
            IQ3_S: (g["iq3s"], s8)}


_GRIDS = _grids()
_IQ = _K.iq_tables(_GRIDS, _KV4)
_IQT = _L.iq_tuple(_IQ)
_tls = threading.local()
#: timing sink (tightfit.model.placed.HostProfile) while a profiled decode step runs, else None:
#: the only cost of the hooks below when profiling is off is this one test per call
_PROF = None


def set_profile(sink) -> None:
    """Report x-quantization and kernel times to `sink` (gemv_quant(t0), gemv_kernel(label,
    nbytes, t0)); None stops it."""
    global _PROF
    _PROF = sink
#: types run by the AVX2 kernel gemv_simd (empty without AVX2, or with TIGHTFIT_CPU_SIMD=0 for A/B
#: timing against the portable gemv_int / gemv_iq kernels)
SIMD = _K.SIMD_TYPES if os.environ.get("TIGHTFIT_CPU_SIMD", "1") != "0" else ()
#: TQ2_0/TQ1_0 block sums in AVX2 IR (gemv_tq_simd); else the portable gemv_tq (same integers)
TQ_SIMD = _K.HAVE_AVX2 and os.environ.get("TIGHTFIT_CPU_SIMD", "1") != "0"
#: gemv_simd re-decodes each block per activation row: past this batch the K-quants are faster in
#: gemv_int (decode once, 16-bit dot per row); IQ4_XS is faster in gemv_simd at every batch
#: (1 thread, 2048 x 5120: Q5_K B=1 7.8 vs 3.4 GB/s, B=4 1.8 vs 2.1, B=8 0.9 vs 1.4)
SIMD_MAX_BATCH_K = 3


def _simd_batch(qtype: int, B: int) -> bool:
    """Whether the SIMD block kernel runs a B-row batch of `qtype`: the AVX-512 one at every B
    (it decodes each block once for up to cpu_gemv_avx512.COLS rows: 4 rows cost ~2.2x one in
    cache, single thread), the AVX2 one for IQ4_XS or up to SIMD_MAX_BATCH_K rows."""
    return _A.ENABLED or qtype == IQ4_XS or B <= SIMD_MAX_BATCH_K


#: per-thread scratch rows start on their own 128-byte boundary (two 64-byte lines: the adjacent-
#: line prefetcher pairs them). The kernels read and write their thread's row at every 256-element
#: block; rows packed back to back put 16 threads' accumulators (4 bytes each at B = 1) in ONE
#: cache line, which then ping-pongs between the cores once per block: ~70 ns a block on a
#: 16-core host, i.e. the whole host GEMV serialized at ~2 GB/s whatever the thread count.
LINE = 128


def per_thread(n: int, width: int, dtype) -> np.ndarray:
    """Zeroed (n, >= width) C-contiguous array of `dtype` whose rows each start on a LINE-byte
    boundary and are a whole number of LINEs long (no two threads' rows share a cache line)."""
    item = np.dtype(dtype).itemsize
    row = -(-max(int(width), 1) * item // LINE) * LINE
    raw = np.zeros(n * row + LINE, np.uint8)
    off = (-raw.ctypes.data) % LINE
    return raw[off:off + n * row].view(dtype).reshape(n, row // item)


class _Scratch:
    def __init__(self, B: int, K: int):
        self.xq = np.zeros((B, K), np.int8)
        self.xd = np.zeros((B, K // 256), np.float32)
        self.xs = np.zeros((B, K // 16), np.int32)
        # per-thread rows (T = pool size), each on its own cache lines; the kernels index
        # only [:256], [:16], [:8], [:B] of them
        self.buf = per_thread(_POOL, 256, np.int16)
        self.mins = per_thread(_POOL, 16, np.int16)
        self.fbuf = per_thread(_POOL, 256, np.float32)
        self.dsc = per_thread(_POOL, 8, np.float32)
        self.acc = per_thread(_POOL, B, np.float32)
        self.b64 = per_thread(_POOL, 32, np.uint64)    # gemv_iq codes (also viewed as int8)
        self.b8 = self.b64.view(np.int8)
        self.sc64 = per_thread(_POOL, 64, np.uint64)   # gemv_iq scales (also viewed as int16)
        self.sc = self.sc64.view(np.int16)
        self.xqp = np.zeros((B, K), np.int8)           # IQ4_XS-permuted activations
        self.ssc = per_thread(_POOL, 16, np.int16)     # gemv_simd per-16 block scales
        self.xb = np.zeros((B, K // 256), np.int32)     # ternary kernels: sum of each 256 codes


def _scratch(B: int, K: int) -> _Scratch:
    cache = getattr(_tls, "cache", None)
    if cache is None:
        cache = _tls.cache = {}
    s = cache.get((B, K))
    if s is None:
        if len(cache) > 32:
            cache.clear()
        s = cache[(B, K)] = _Scratch(B, K)
    return s


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
    without a native kernel. Integer-kernel types quantize x to int8 per 256 (about 0.5 % of
    |x|.|W| error, like llama.cpp's CPU path); the 32-element types keep x in fp32."""
    qtype = int(qtype)
    x = np.asarray(x, dtype=np.float32)
    vec = x.ndim == 1
    x2 = np.ascontiguousarray(x.reshape(1, -1) if vec else x)
    bs, ts = _sizes(qtype)
    M, rb = w.shape
    B, K = x2.shape
    if rb % ts or rb // ts * bs != K:
        raise ValueError(f"row of {rb} B of type {qtype} does not hold K={K} elements")
    y = out if out is not None else np.empty((B, M), dtype=np.float32)
    y2 = y.reshape(B, M)
    if M == 0:
        return y2[0] if vec else y2
    p = _PROF
    if p is not None:
        t0 = time.perf_counter_ns()
    if qtype in _K.INT_TYPES or qtype in _K.F32_TYPES or qtype in _T.TQ_TYPES:
        if not w.flags.c_contiguous:
            w = np.ascontiguousarray(w)   # rows must be dense; an mmap row range already is
        if numba.get_num_threads() != _threads:
            numba.set_num_threads(_threads)
        s = _scratch(B, K)
        # dynamic row chunks (~8 per thread): a thread slowed by anything else on its core no
        # longer holds up the whole call as with numba's static equal split
        prev = _chunksize(max(16, M // (8 * _threads)))
        try:
            if p is not None:
                t0 = time.perf_counter_ns()
            _run(qtype, w, x2, y2, s)
        finally:
            _chunksize(prev)
        kind = "gemv"
    elif qtype == F32:
        y2[:] = x2 @ w.view(np.float32).T
        kind = "gemv"
    else:
        for r0 in range(0, M, fallback_rows):
            blk = _dequant_rows(w[r0:r0 + fallback_rows], qtype)
            y2[:, r0:r0 + blk.shape[0]] = x2 @ blk.T
        kind = "fallback"
    if p is not None:              # a per-matrix call: its x quantization counts as kernel
        p.gemv_kernel((kind, (qtype,)), w.nbytes, t0)
    return y2[0] if vec else y2


class Group:
    """Matrices that read the same x (e.g. attn_qkv + attn_gate, ffn_gate + ffn_up), computed
    in ONE parallel call (issue 5): x is quantized once, the rows of all SIMD-kernel matrices
    are cut into chunks of about equal bytes (`CHUNKS_PER_THREAD` per thread, scheduled
    dynamically) and every chunk writes its own matrix's columns of one output (B, n_out), matrix
    i at columns spans[i]. Each row is computed exactly as `gemv` computes it (the same block
    code and running sum: bit-identical). The ternary matrices (TQ2_0, TQ1_0) run the same way
    in one call of their own grouped kernel (gemv_tq_group), and the low-bit types IQ2_S, IQ2_XS,
    IQ3_XXS, IQ3_S, Q2_K, Q3_K in one call of gemv_lowbit_group (gemv_int / gemv_iq's row code).
    Matrices none of them runs (the 32-element types, the NumPy-fallback types, and the SIMD
    types where gemv_simd does not run them, e.g. the K-quants past SIMD_MAX_BATCH_K) go through
    `gemv` one by one.

    mats: (raw rows (M, row_bytes) uint8, ggml type) per matrix, all of the same K."""

    CHUNKS_PER_THREAD = 8

    def __init__(self, mats) -> None:
        self.ws: list[np.ndarray] = []
        self.qtypes: list[int] = []
        self.spans: list[tuple[int, int]] = []
        self.k = None
        col = 0
        for w, qt in mats:
            qt = int(qt)
            w = np.ascontiguousarray(w, dtype=np.uint8)
            if w.flags.writeable:     # one numba array type for all (the mmap rows are read-only)
                w = w.view()
                w.flags.writeable = False
            bs, ts = _sizes(qt)
            if w.shape[1] % ts:
                raise ValueError(f"row of {w.shape[1]} B is not a whole number of type-{qt} blocks")
            k = w.shape[1] // ts * bs
            if self.k is None:
                self.k = k
            elif k != self.k:
                raise ValueError(f"a group shares one x: K={k} vs K={self.k}")
            self.ws.append(w)
            self.qtypes.append(qt)
            self.spans.append((col, col + w.shape[0]))
            col += w.shape[0]
        self.n_out = col
        self._plans: dict = {}
        self._idx: dict = {}

    # which matrices each grouped kernel runs: fixed per group (per batch size for the SIMD one),
    # so derived once instead of on every call (a decode token makes ~100 grouped calls)
    def _grouped(self, B: int) -> tuple[int, ...]:
        key = ("simd", B <= SIMD_MAX_BATCH_K)
        idx = self._idx.get(key)
        if idx is None:
            idx = self._idx[key] = tuple(
                i for i, qt in enumerate(self.qtypes) if self.ws[i].shape[0]
                and qt in SIMD and _simd_batch(qt, B))
        return idx

    def _of_types(self, key: str, types) -> tuple[int, ...]:
        idx = self._idx.get(key)
        if idx is None:
            idx = self._idx[key] = tuple(i for i, qt in enumerate(self.qtypes)
                                         if self.ws[i].shape[0] and qt in types)
        return idx

    def _ternary(self) -> tuple[int, ...]:
        return self._of_types("tq", _T.TQ_TYPES)

    def _lowbit(self) -> tuple[int, ...]:
        return self._of_types("lowbit", _L.LOWBIT_TYPES)

    def _plan(self, idx: tuple[int, ...]):
        """(typed list of the matrices, types, output columns, chunk matrix/row0/row1) for the
        grouped matrices idx at the current thread count."""
        key = (idx, _threads)
        p = self._plans.get(key)
        if p is not None:
            return p
        from numba.typed import List
        ws = List()
        for i in idx:
            ws.append(self.ws[i])
        nbytes = [self.ws[i].nbytes for i in idx]
        target = max(1, sum(nbytes) // (self.CHUNKS_PER_THREAD * _threads))
        cm, c0, c1 = [], [], []
        for j, i in enumerate(idx):
            M = self.ws[i].shape[0]
            n = max(1, min(M, round(nbytes[j] / target)))
            for c in range(n):
                cm.append(j)
                c0.append(M * c // n)
                c1.append(M * (c + 1) // n)
        p = (ws, np.array([self.qtypes[i] for i in idx], np.int64),
             np.array([self.spans[i][0] for i in idx], np.int64),
             np.array(cm, np.int64), np.array(c0, np.int64), np.array(c1, np.int64))
        self._plans[key] = p
        return p

    def gemv(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """All matrices times x ((K,) or (B, K)): (n_out,) or (B, n_out) float32 (into `out`,
        which must then be C-contiguous of that size)."""
        x = np.asarray(x, dtype=np.float32)
        vec = x.ndim == 1
        x2 = np.ascontiguousarray(x.reshape(1, -1) if vec else x)
        B, K = x2.shape
        if K != self.k:
            raise ValueError(f"x has K={K}, the group's matrices K={self.k}")
        y = out if out is not None else np.empty((B, self.n_out), dtype=np.float32)
        if not y.flags.c_contiguous or y.size != B * self.n_out:
            raise ValueError(f"out must be a C-contiguous array of {B} x {self.n_out} floats")
        y2 = y.reshape(B, self.n_out)
        idx, tq, lb = self._grouped(B), self._ternary(), self._lowbit()
        if idx or tq or lb:
            if numba.get_num_threads() != _threads:
                numba.set_num_threads(_threads)
            s = _scratch(B, K)
            p = _PROF
            if p is not None:
                t0 = time.perf_counter_ns()
            _K.quantize_act(x2, s.xq, s.xd, s.xs)
            if p is not None:
                p.gemv_quant(t0)
            prev = _chunksize(1)
            try:
                if idx:
                    ws, qts, cols, cm, c0, c1 = self._plan(idx)
                    if p is not None:
                        t0 = time.perf_counter_ns()
                    _SIMD_GRP(ws, qts, cols, cm, c0, c1, s.xq, s.xd, s.xs, y2, _F16,
                                       s.ssc)
                    if p is not None:
                        p.gemv_kernel(("group", tuple(self.qtypes[i] for i in idx)),
                                      sum(self.ws[i].nbytes for i in idx), t0)
                if tq:
                    ws, qts, cols, cm, c0, c1 = self._plan(tq)
                    if p is not None:
                        t0 = time.perf_counter_ns()
                    _T.block_sums(s.xs, s.xb)
                    kern = _T.gemv_tq_group_simd if TQ_SIMD else _T.gemv_tq_group
                    kern(ws, qts, cols, cm, c0, c1, s.xq, s.xd, s.xb, y2, _F16)
                    if p is not None:
                        p.gemv_kernel(("tq_group", tuple(self.qtypes[i] for i in tq)),
                                      sum(self.ws[i].nbytes for i in tq), t0)
                if lb:
                    ws, qts, cols, cm, c0, c1 = self._plan(lb)
                    if p is not None:
                        t0 = time.perf_counter_ns()
                    _L.gemv_lowbit_group(ws, qts, cols, cm, c0, c1, s.xq, s.xd, s.xs, y2,
                                         _F16, _IQT, s.buf, s.mins, s.b8, s.b64, s.sc, s.sc64,
                                         s.acc)
                    if p is not None:
                        p.gemv_kernel(("lowbit_group", tuple(self.qtypes[i] for i in lb)),
                                      sum(self.ws[i].nbytes for i in lb), t0)
            finally:
                _chunksize(prev)
        for i, (w, qt) in enumerate(zip(self.ws, self.qtypes)):
            if i in idx or i in tq or i in lb or not w.shape[0]:
                continue
            a, b = self.spans[i]
            if B == 1:
                gemv(w, qt, x2, out=y2[:, a:b])      # a contiguous slice: written in place
            else:
                y2[:, a:b] = gemv(w, qt, x2)
        return y2[0] if vec else y2


def gemv_group(mats, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """One-off `Group(mats).gemv(x, out)` (keep the Group to reuse its chunk plan)."""
    return Group(mats).gemv(x, out)


def _chunksize(n: int) -> int:
    f = getattr(numba, "set_parallel_chunksize", None)
    return int(f(n)) if f is not None else 0


def _run(qtype: int, w: np.ndarray, x2: np.ndarray, y2: np.ndarray, s: _Scratch) -> None:
    """The native kernel for qtype (INT_TYPES, F32_TYPES or TQ_TYPES): y2 = x2 . W^T."""
    if qtype in _K.F32_TYPES:
        _K.gemv_f32(qtype, w, x2, y2, _F16, _KV4_16, s.fbuf, s.dsc, s.acc)
    else:
        _K.quantize_act(x2, s.xq, s.xd, s.xs)
        if qtype in _T.TQ_TYPES:
            if w.flags.writeable:   # one compiled signature: that of the read-only mmap rows
                w = w.view()
                w.flags.writeable = False
            _T.block_sums(s.xs, s.xb)
            kern = _T.gemv_tq_simd if TQ_SIMD else _T.gemv_tq
            kern(qtype, w, s.xq, s.xd, s.xb, y2, _F16)
            return
        if qtype in SIMD and _simd_batch(qtype, x2.shape[0]):
            _SIMD_ONE(qtype, w, s.xq, s.xd, s.xs, y2, _F16, s.ssc)
            return
        if qtype in _K.IQ_TYPES:
            g64, m64, p16 = _IQ[qtype]
            xq = _K.permute_iq4(s.xq, s.xqp) if qtype == IQ4_XS else s.xq
            _K.gemv_iq(qtype, w, xq, s.xd, y2, _F16, g64, m64, p16, s.b8, s.b64, s.sc, s.sc64, s.acc)
            return
        _K.gemv_int(qtype, w, s.xq, s.xd, s.xs, y2, _F16, s.buf, s.mins, s.acc)


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
    elif qtype in _DECODE_NATIVE:
        # a few rows (the per-token embedding lookup) are not worth waking the thread pool
        nt = numba.get_num_threads()
        numba.set_num_threads(1 if rows.size <= 4 else _threads)
        try:
            if qtype in _T.TQ_TYPES:
                _T.decode_tq(qtype, w, rows, out, _F16)
            else:
                _decode_rows_native(qtype, bs, ts, w, rows, out, _F16, _KV4)
        finally:
            numba.set_num_threads(nt)
    else:
        for i, r in enumerate(rows):
            out[i] = _dequant_rows(w[r:r + 1], qtype)[0]
    return out


def set_threads(n: int | None = None) -> int:
    """Threads used by gemv from now on (None: all of numba's pool); returns the number set."""
    global _threads
    _threads = _POOL if n is None else max(1, min(int(n), _POOL))
    return _threads


def n_threads() -> int:
    return _threads
