"""Skinny GEMM on bf16 tensor cores with a shared-memory byte table ("mmh" path), IQ4_XS.

tightfit/kernels/cuda/gemv_mmh.cuh holds the kernels and says why: one PRMT and one shared-memory
load turn a byte of IQ4_XS codes into a bf16x2 mma operand, where the int8 tensor-core GEMV
(gemv_mma) spends ~6 ALU operations per 8 codes plus a per-group int -> fp32 epilogue. Two kinds:
"table" (tf_mmh_iq4<RT>) reads x as fp32 [N, K] (no activation quantization) and applies each
group's scale in fp32; "foldp" (tf_mmh2_iq4<RT>) reads x packed to bf16 pairs (xpack; in the
verify block the norm writes them, norm.PACK_LAYOUT) and folds the scale into bf16 weights. y is
fp32 [N, n_out]; N <= 8.
The work split and the deterministic fixup are gemv_mma's (stream-K over 16 * RT-row tile groups
x blocks, one wave of resident warps, its per-device workspace), so results are bitwise
repeatable. gemv_route.mmh_routed says where it runs (IQ4_XS, 4..8 columns, wide matrices).

Reference: `gemv_mmh_ref` (tightfit.quant's dequantization, or for "foldp" its bf16 rounding
`fold_weights`; float64 products of the bf16-rounded x), which tests/test_gemv_mmh_device.py
compares with the kernels; `host_lane` / `host_lane_fold` run the header's decode functions on the
CPU (g++), which tests/test_gemv_mmh.py compares with gguf-py.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from tightfit.kernels import cuda_runtime as _rt
from tightfit.kernels import gemv_mma as _mma
from tightfit.kernels.cuda_source import CUDA_DIR, COMMON

MMH = "gemv_mmh.cuh"
BB = 136                       # IQ4_XS block bytes
THREADS = 256
WARPS = THREADS // 32
LUT_BYTES = 65536              # the table (dynamic shared memory per CTA)
MINB = 2                       # resident CTAs per SM (launch bounds: 128 registers)
TYPES = (23,)                  # IQ4_XS
RTS = (1, 2)                   # 16-row tiles per warp (within 5 % of each other at N = 5)
DEFAULT_RT = 1
# kernel per kind (gemv_mmh.cuh says why each exists): "table" = tf_mmh_iq4, fp32 x, exact codes,
# the group scale applied in fp32 after each group's products; "foldp" = tf_mmh2_iq4, x packed to
# bf16 pairs (xpack, or a producer's norm.PACK_LAYOUT), the group scale folded into bf16 weights
# and one accumulation per row (faster where x arrives packed: session 18)
KINDS = {"table": "tf_mmh_iq4<{rt}>", "foldp": "tf_mmh2_iq4<{rt}>"}
DEFAULT_KIND = "table"
MAX_N = 8
_lock = threading.Lock()
_fns: dict[tuple[int, int, str], object] = {}
_geom: dict[tuple, int] = {}


def source() -> str:
    return ((CUDA_DIR / COMMON).read_text() + "\n// ---- gemv_mma.cuh\n"
            + (CUDA_DIR / _mma.MMA).read_text() + "\n// ---- " + MMH + "\n"
            + (CUDA_DIR / MMH).read_text())


def supported(qtype: int) -> bool:
    return int(qtype) in TYPES


def available() -> bool:
    return torch.cuda.is_available() and _rt.cupy() is not None


def _fn(device: int, rt: int, kind: str = DEFAULT_KIND):
    key = (device, rt, kind)
    fn = _fns.get(key)
    if fn is None:
        with _lock:
            fn = _fns.get(key)
            if fn is None:
                cp = _rt.cupy()
                name = KINDS[kind].format(rt=rt)
                with cp.cuda.Device(device):
                    mod = cp.RawModule(code=source(), options=("-std=c++17",),
                                       name_expressions=[name])
                    fn = mod.get_function(name)
                    fn.max_dynamic_shared_size_bytes = LUT_BYTES
                _fns[key] = fn
    return fn


def geometry(n_in: int, n_out: int, sms: int, rt: int = DEFAULT_RT, ctas_per_sm: int = MINB) -> int:
    """CTAs of the stream-K launch: items = (16 * rt-row tile groups) x blocks per row, one wave of
    at most sms * ctas_per_sm CTAs of 8 warps (as gemv_mma.geometry with one block per item)."""
    items = ((n_out + 16 * rt - 1) // (16 * rt)) * (n_in // 256)
    ctas = -(-min(items, sms * ctas_per_sm * WARPS) // WARPS)
    if items * ctas * WARPS >= 1 << 32:
        raise ValueError(f"MMH GEMV: {items} work items too many for a 32-bit split")
    return ctas


def gemv_mmh(x: torch.Tensor, w_raw: torch.Tensor, qtype: int, n_out: int, out: torch.Tensor,
             rt: int | None = None, kind: str | None = None) -> torch.Tensor:
    """out[N, n_out] (fp32) = x[N, K] (fp32, contiguous; kind "foldp": xpack(x), int32 [N, K / 2])
    . W^T, W = IQ4_XS raw blocks [n_out, K].
    Launched on torch's current stream; nothing allocated per call (CUDA-graph capturable after
    one eager call of the shape: it compiles the module and sizes gemv_mma's fixup workspace)."""
    if not supported(qtype):
        raise ValueError(f"MMH GEMV: GGML type {qtype} is not supported (IQ4_XS only)")
    rt = DEFAULT_RT if rt is None else int(rt)
    kind = DEFAULT_KIND if kind is None else kind
    if kind not in KINDS:
        raise ValueError(f"MMH GEMV: kind {kind!r} not in {tuple(KINDS)}")
    if rt not in RTS:
        raise ValueError(f"MMH GEMV: rt {rt} not in {RTS}")
    if kind == "foldp":   # x: xpack's int32 [N, K / 2]
        if x.dtype != torch.int32 or not x.is_contiguous() or x.dim() != 2:
            raise ValueError("MMH GEMV: packed x must be xpack's contiguous int32 [N, K / 2]")
        n, k = x.shape[0], 2 * x.shape[1]
    elif x.dtype != torch.float32 or not x.is_contiguous() or x.dim() != 2:
        raise ValueError("MMH GEMV: x must be a contiguous fp32 [N, K] tensor")
    else:
        n, k = x.shape
    if not 1 <= n <= MAX_N:
        raise ValueError(f"MMH GEMV: {n} columns (1..{MAX_N})")
    if k % 256 or w_raw.numel() != int(n_out) * (k // 256) * BB:
        raise ValueError(f"MMH GEMV: weights of {w_raw.numel()} B do not hold {n_out} rows of "
                         f"{k} IQ4_XS weights")
    if out.dtype != torch.float32 or out.shape != (n, int(n_out)) or not out.is_contiguous():
        raise ValueError("MMH GEMV: out must be a contiguous fp32 [N, n_out] tensor")
    if w_raw.data_ptr() % 16 or x.data_ptr() % 16:
        raise ValueError("MMH GEMV: weights and x must be 16-byte aligned")
    dev = w_raw.device
    key = (k, int(n_out), dev.index, rt)
    ctas = _geom.get(key)
    if ctas is None:
        ctas = _geom[key] = geometry(k, int(n_out), _mma._sms(dev.index), rt)
    ws = _mma._workspace(dev.index, -(-int(n_out) // 16), ctas * WARPS)
    fn = _fn(dev.index, rt, kind)
    stream = _rt.stream(torch.cuda.current_stream(dev).cuda_stream, dev.index)
    with stream:
        fn((ctas, 1, 1), (THREADS, 1, 1),
           (np.uint64(w_raw.data_ptr()), np.uint64(x.data_ptr()), np.uint64(out.data_ptr()),
            np.int32(n_out), np.int32(k), np.int32(n), np.uint64(ws.cnt), np.uint64(ws.part)),
           shared_mem=LUT_BYTES)
    return out


def xpack(x: torch.Tensor) -> torch.Tensor:
    """fp32 [N, K] -> the packed operand of kind "foldp": int32 [N, K / 2], per group of 32 the 16
    words (x[i], x[i + 16]) as bf16x2 (low half = x[i]), rounded to nearest even."""
    n, k = x.shape
    b = x.to(torch.bfloat16).view(torch.int16).reshape(n, k // 32, 2, 16).to(torch.int32) & 0xFFFF
    return (b[:, :, 0] | (b[:, :, 1] << 16)).reshape(n, k // 2).contiguous()


def bf16_round(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 -> fp32, round to nearest even (cvt.rn.bf16x2.f32), as float64."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                   np.float32)   # kvalues_iq4nl


def fold_weights(w_raw: np.ndarray, n_out: int, k: int, rounded: bool = True) -> np.ndarray:
    """IQ4_XS weights [n_out, k] as the "foldp" kernel forms them: per group s = bf16(d * (ls -
    32)) (fp32 product, rounded to nearest even), weight = bf16(kvalue * s). rounded=False gives
    d * (ls - 32) * kvalue unrounded (= the GGUF dequantization, which the tests check)."""
    b = np.asarray(w_raw, dtype=np.uint8).reshape(-1, BB)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    sh = b[:, 2:4].copy().view(np.uint16)[:, 0].astype(np.int32)
    j = np.arange(8)
    ls = ((b[:, 4 + j // 2].astype(np.int32) >> (4 * (j % 2))) & 15) | (((sh[:, None] >> (2 * j)) & 3) << 4)
    s = d[:, None] * (ls - 32).astype(np.float32)                       # [nblk, 8], exact in fp32
    q = b[:, 8:].reshape(-1, 8, 16)
    codes = np.concatenate([KVALUES[q & 15], KVALUES[q >> 4]], axis=2)   # [nblk, 8 groups, 32]
    if rounded:
        s = bf16_round(s).astype(np.float32)
        w = bf16_round(codes * s[:, :, None])
    else:
        w = codes.astype(np.float64) * s[:, :, None]
    return w.reshape(n_out, k)


def gemv_mmh_ref(x: np.ndarray, w_raw: np.ndarray, n_out: int, kind: str = DEFAULT_KIND) -> np.ndarray:
    """What the kernel computes, in float64: the GGUF dequantization of W (tightfit.quant's
    reference; "foldp": rounded as fold_weights) against x rounded to bf16."""
    from tightfit.quant import dequantize
    k = x.shape[1]
    if kind == "foldp":
        w = fold_weights(w_raw, n_out, k)
    else:
        w = dequantize(np.asarray(w_raw, dtype=np.uint8).reshape(-1), 23, (n_out, k))
    return bf16_round(x) @ w.astype(np.float64).T


# ---------------------------------------------------------------- host harness (g++, no GPU)
_HOST_DRIVER = r"""
// ---- host driver (gemv_mmh.py)
// Lane (g, t)'s decode of one IQ4_XS block, by the header's own functions: for group j and byte m
// of the lane's word, the table row and word its PRMT address names (row[j][m], word[j][m]), the
// entry of that row (entry[j][m]: bf16 low / high halves), and the group's ls - 32 (f[j]).
extern "C" void tf_mmh_host_lane(const uint8_t* blk, int g, int t, uint32_t* row, uint32_t* word,
                                 uint32_t* entry, float* f) {
  const int lane = 4 * g + t;
  uint32_t h0, h1, ue, uo;
  memcpy(&h0, blk, 4); memcpy(&h1, blk + 4, 4);
  tf_mmh_iq4_ls(h0, h1, ue, uo);
  for (int j = 0; j < 8; ++j) {
    uint32_t w; memcpy(&w, blk + 8 + 16 * j + 4 * t, 4);
    for (int m = 0; m < 4; ++m) {
      const uint32_t a = tf_mmh_addr(w, 4u * (uint32_t)lane, m);
      row[4 * j + m] = a >> 8;
      word[4 * j + m] = (a & 255u) >> 2;
      entry[4 * j + m] = tf_mmh_iq4_entry(a >> 8);
    }
    f[j] = tf_mmh_ls_f32(j & 1 ? uo : ue, j >> 1);
  }
}
// The foldp kernel's weights of lane (g, t): for segment s and byte m of the lane's 8 bytes, the
// bf16x2 (element e_m, e_m + 16) it multiplies into the mma: the table entry times the group scale.
extern "C" void tf_mmh2_host_lane(const uint8_t* blk, int g, int t, uint32_t* wpair) {
  const int lane = 4 * g + t;
  uint32_t h0, h1, ue, uo;
  memcpy(&h0, blk, 4); memcpy(&h1, blk + 4, 4);
  tf_mmh_iq4_ls(h0, h1, ue, uo);
  const float d = tf_h2f((uint16_t)h0);
  for (int s = 0; s < 4; ++s) {
    const uint32_t sc = tf_mmh2_scale((t >> 1) ? uo : ue, s, d);
    for (int wi = 0; wi < 2; ++wi) {
      uint32_t w; memcpy(&w, blk + 8 + 32 * s + 8 * t + 4 * wi, 4);
      for (int m = 0; m < 4; ++m) {
        const uint32_t a = tf_mmh_addr(w, 4u * (uint32_t)lane, m);
        wpair[8 * s + 4 * wi + m] = tf_mmh_mul(tf_mmh_iq4_entry(a >> 8), sc);
      }
    }
  }
}
"""
_host_lib: list = []


def _host():
    import ctypes
    from tightfit.kernels.cuda_host import compile_host
    with _lock:
        if not _host_lib:
            src = ((CUDA_DIR / COMMON).read_text() + "\n" + (CUDA_DIR / _mma.MMA).read_text()
                   + "\n" + (CUDA_DIR / MMH).read_text() + _HOST_DRIVER)
            lib = ctypes.CDLL(str(compile_host(src)))
            P = ctypes.c_void_p
            lib.tf_mmh_host_lane.argtypes = [P, ctypes.c_int, ctypes.c_int, P, P, P, P]
            lib.tf_mmh_host_lane.restype = None
            lib.tf_mmh2_host_lane.argtypes = [P, ctypes.c_int, ctypes.c_int, P]
            lib.tf_mmh2_host_lane.restype = None
            _host_lib.append(lib)
    return _host_lib[0]


def host_lane(blk: np.ndarray, g: int, t: int) -> dict[str, np.ndarray]:
    """The header's decode of one 136-byte IQ4_XS block for lane (g, t), on the CPU: per group j
    and byte m (arrays [8, 4]) the table row / word its address names and that row's entry (uint32:
    bf16 low half | high half << 16), and per group the scale factor ls - 32 (float32 [8])."""
    buf = np.zeros(BB + 8, np.uint8)
    buf[:BB] = np.asarray(blk, dtype=np.uint8).reshape(-1)[:BB]
    row, word, entry = (np.zeros(32, np.uint32) for _ in range(3))
    f = np.zeros(8, np.float32)
    _host().tf_mmh_host_lane(buf.ctypes.data, int(g), int(t), row.ctypes.data, word.ctypes.data,
                             entry.ctypes.data, f.ctypes.data)
    return dict(row=row.reshape(8, 4), word=word.reshape(8, 4), entry=entry.reshape(8, 4), f=f)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint32) << 16).astype(np.uint32).view(np.float32)


def host_lane_fold(blk: np.ndarray, g: int, t: int) -> np.ndarray:
    """The foldp kernel's weights of lane (g, t) for one IQ4_XS block, on the CPU (the header's own
    functions): uint32 [4 segments, 8 bytes], bf16 pairs (element e, e + 16) with e = 32 * (2s +
    t // 2) + 8 * (t % 2) + m."""
    buf = np.zeros(BB + 8, np.uint8)
    buf[:BB] = np.asarray(blk, dtype=np.uint8).reshape(-1)[:BB]
    out = np.zeros(32, np.uint32)
    _host().tf_mmh2_host_lane(buf.ctypes.data, int(g), int(t), out.ctypes.data)
    return out.reshape(4, 8)
