"""CPU test harness of the CUDA GEMV format code (CONTRACT.md, 'Host test harness').

The same headers the GPU compiles (gemv_common.cuh, tables, gemv_fmt_main.cuh, gemv_fmt_lowbit.cuh)
are compiled as plain C++ with g++ into a cached shared library; `host_gemv` calls every format's
`dot<NC>` for every (row, block, part) in plain loops, so CI without a GPU tests the decoding and
the integer/float arithmetic of the device kernel bit for bit (up to fp32 summation order).

    host_available() -> bool
    host_gemv(qtype, w uint8 (rows, row_bytes), x_q (N, K), x_d (N, K/32), x_s16 (N, K/16))
        -> float32 (N, rows)
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from tightfit.kernels.cuda_source import format_list, formats_source, source_hash

_DRIVER = r"""
// ---- host driver (cuda_host.py)
template <class F, int NC>
static void tf_run_nc(const uint8_t* w, int rows, int row_bytes, const int8_t* xq, const float* xd,
                      const int32_t* xs, int K, int col0, float* y) {
  const int nb = K / F::QK;
  for (int r = 0; r < rows; ++r) {
    float acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = 0.f;
    for (int b = 0; b < nb; ++b)
      for (int p = 0; p < F::PARTS; ++p)
        F::template dot<NC>(w + (size_t)r * row_bytes + (size_t)b * F::BB, p,
                            xq + (size_t)col0 * K + (size_t)b * F::QK,
                            xd + (size_t)col0 * (K / 32) + b * (F::QK / 32),
                            (const int*)xs + (size_t)col0 * (K / 16) + b * (F::QK / 16), K, acc);
    for (int c = 0; c < NC; ++c) y[(size_t)(col0 + c) * rows + r] = acc[c];
  }
}

template <class F>
static int tf_run(const uint8_t* w, int rows, int row_bytes, const int8_t* xq, const float* xd,
                  const int32_t* xs, int N, int K, float* y) {
  if (K % F::QK || row_bytes != (K / F::QK) * F::BB) return -2;
  int col0 = 0;
  while (col0 < N) {
    int n = N - col0 == 16 ? 16 : (N - col0 > 8 ? 8 : N - col0);
    switch (n) {
#define TF_NC_CASE(k) case k: tf_run_nc<F, k>(w, rows, row_bytes, xq, xd, xs, K, col0, y); break;
      TF_NC_CASE(1) TF_NC_CASE(2) TF_NC_CASE(3) TF_NC_CASE(4) TF_NC_CASE(5) TF_NC_CASE(6)
      TF_NC_CASE(7) TF_NC_CASE(8) TF_NC_CASE(16)
#undef TF_NC_CASE
    }
    col0 += n;
  }
  return 0;
}

extern "C" int tf_host_gemv(int qtype, const uint8_t* w, int rows, int row_bytes, const int8_t* xq,
                            const float* xd, const int32_t* xs, int N, int K, float* y) {
  switch (qtype) {
#define TF_TYPE_CASE(F, T) case T: return tf_run<F>(w, rows, row_bytes, xq, xd, xs, N, K, y);
    TF_MAIN_FORMATS(TF_TYPE_CASE)
    TF_LOWBIT_FORMATS(TF_TYPE_CASE)
#undef TF_TYPE_CASE
  }
  return -1;
}

extern "C" int tf_host_info(int qtype, int* out) {  // QK, BB, PARTS
  switch (qtype) {
#define TF_TYPE_CASE(F, T) case T: out[0] = F::QK; out[1] = F::BB; out[2] = F::PARTS; return 0;
    TF_MAIN_FORMATS(TF_TYPE_CASE)
    TF_LOWBIT_FORMATS(TF_TYPE_CASE)
#undef TF_TYPE_CASE
  }
  return -1;
}
"""

_lock = threading.Lock()
_lib: dict[str, ctypes.CDLL] = {}


def host_source() -> str:
    return formats_source(False) + _DRIVER


def _cache_dir() -> Path:
    base = os.environ.get("TIGHTFIT_CACHE") or os.path.join(tempfile.gettempdir(), "tightfit-cache")
    d = Path(base) / "cuda_host"
    d.mkdir(parents=True, exist_ok=True)
    return d


def compile_host(src: str | None = None, extra: tuple[str, ...] = ()) -> Path:
    """Compile the harness (or `src`) into a shared library; returns its path (cached by hash)."""
    src = host_source() if src is None else src
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("no C++ compiler (g++) found")
    flags = ["-O2", "-shared", "-fPIC", "-std=c++17", "-Wall", "-Wno-unused-function", *extra]
    h = source_hash(src + cxx + " ".join(flags))
    so = _cache_dir() / f"tf_gemv_host_{h}.so"
    if so.exists():
        return so
    d = _cache_dir()
    cpp = d / f"tf_gemv_host_{h}.{os.getpid()}.cpp"
    tmp = d / f"tf_gemv_host_{h}.{os.getpid()}.so.tmp"
    cpp.write_text(src)
    try:
        r = subprocess.run([cxx, *flags, "-x", "c++", str(cpp), "-o", str(tmp)],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"host compile of the CUDA GEMV source failed:\n{r.stderr[-6000:]}")
        os.replace(tmp, so)
    finally:
        cpp.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return so


def _load() -> ctypes.CDLL:
    with _lock:
        src = host_source()
        key = source_hash(src)
        lib = _lib.get(key)
        if lib is None:
            lib = ctypes.CDLL(str(compile_host(src)))
            P = ctypes.c_void_p
            lib.tf_host_gemv.argtypes = [ctypes.c_int, P, ctypes.c_int, ctypes.c_int, P, P, P,
                                         ctypes.c_int, ctypes.c_int, P]
            lib.tf_host_gemv.restype = ctypes.c_int
            lib.tf_host_info.argtypes = [ctypes.c_int, P]
            lib.tf_host_info.restype = ctypes.c_int
            _lib[key] = lib
        return lib


def host_available() -> bool:
    try:
        _load()
        return True
    except Exception:  # noqa: BLE001 - no compiler / broken source: tests report it separately
        return False


def host_types() -> list[int]:
    return [t for _, t in format_list()]


def host_info(qtype: int) -> tuple[int, int, int]:
    """(QK, BB, PARTS) of a format as the C++ struct declares them."""
    out = np.zeros(3, np.int32)
    if _load().tf_host_info(int(qtype), out.ctypes.data):
        raise ValueError(f"CUDA GEMV: no format for GGML type {qtype}")
    return int(out[0]), int(out[1]), int(out[2])


def host_gemv(qtype: int, w: np.ndarray, x_q: np.ndarray, x_d: np.ndarray,
              x_s16: np.ndarray) -> np.ndarray:
    """y[N, rows] = x . W^T through the formats' dot<NC> on the CPU (module docstring)."""
    lib = _load()
    qk, bb, _ = host_info(qtype)
    w = np.ascontiguousarray(w, dtype=np.uint8)
    if w.ndim != 2:
        raise ValueError(f"w must be (rows, row_bytes), got shape {w.shape}")
    xq = np.ascontiguousarray(np.asarray(x_q), dtype=np.int8)
    if xq.ndim != 2:
        raise ValueError(f"x_q must be (N, K), got shape {xq.shape}")
    n, k = xq.shape
    if k % qk or k % 32:
        raise ValueError(f"K={k} is not a multiple of the block size {qk}")
    rows, rb = w.shape
    if rb != k // qk * bb:
        raise ValueError(f"row_bytes {rb} != K/{qk}*{bb} = {k // qk * bb}")
    xd = np.ascontiguousarray(x_d, dtype=np.float32).reshape(n, -1)
    xs = np.ascontiguousarray(np.rint(np.asarray(x_s16, np.float64)), dtype=np.int32).reshape(n, -1)
    if xd.shape[1] != k // 32 or xs.shape[1] != k // 16:
        raise ValueError(f"x_d / x_s16 shapes {xd.shape} {xs.shape} do not match K={k}")
    y = np.empty((n, rows), np.float32)
    rc = lib.tf_host_gemv(int(qtype), w.ctypes.data, rows, rb, xq.ctypes.data, xd.ctypes.data,
                          xs.ctypes.data, n, k, y.ctypes.data)
    if rc:
        raise ValueError(f"host_gemv failed (rc={rc}) for type {qtype}")
    return y


__all__ = ["host_available", "host_gemv", "host_info", "host_types", "compile_host",
           "host_source"]
