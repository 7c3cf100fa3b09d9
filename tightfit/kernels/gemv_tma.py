"""Opt-in CUDA GEMV whose weights are staged through shared memory by the bulk-copy engine
(cuda/gemv_tma.cuh, sm_90): one warp per row, TF_TMA_STAGES chunks of the row in flight per warp,
the unchanged per-format `F::dot` code on the staged bytes. Same contract as gemv_cuda.gemv_cuda
(layout-0 QuantAct in, fp32 [N, n_out] out); the A/B against the register-fed kernels is
bench/gemv_tma_ab.py. Not routed into the decode step until a device measurement says it pays."""
from __future__ import annotations

import threading

import numpy as np
import torch

from tightfit.kernels import cuda_runtime as _rt
from tightfit.kernels.cuda_source import CUDA_DIR, format_list, formats_source
from tightfit.quant.traits import traits

THREADS, WARPS = 256, 8
NCS = (1, 2, 4, 8)
_lock = threading.Lock()
_mods: dict[tuple, dict[int, object]] = {}


def _formats() -> dict[int, str]:
    return {t: name for name, t in format_list()}


def geometry(qtype: int, stages: int, chunk_bytes: int) -> tuple[int, int]:
    """(blocks per chunk, bytes per stage): the formulas of tf_tma_geom in gemv_tma.cuh."""
    from tightfit.kernels.gemv_cuda import parts
    tr = traits(qtype)
    bb, p = tr.type_size, parts(qtype)
    minb = 32 // p
    cb = chunk_bytes // bb // minb * minb or minb
    return cb, (cb * bb + 16 + 15) // 16 * 16


def smem_bytes(qtype: int, stages: int = 3, chunk_bytes: int = 1536) -> int:
    return WARPS * stages * geometry(qtype, stages, chunk_bytes)[1]


def _module(qtype: int, device: int, stages: int, chunk_bytes: int, pdl: bool):
    key = (int(qtype), device, stages, chunk_bytes, pdl)
    m = _mods.get(key)
    if m is not None:
        return m
    with _lock:
        if key not in _mods:
            cp = _rt.cupy()
            name = _formats()[int(qtype)]
            src = (f"#define TF_TMA_STAGES {stages}\n#define TF_TMA_CHUNK_BYTES {chunk_bytes}\n"
                   + ("#define TF_TMA_PDL 1\n" if pdl else "")
                   + formats_source(False) + (CUDA_DIR / "gemv_tma.cuh").read_text())
            names = [f"tf_gemv_tma<{name}, {nc}>" for nc in NCS]
            with cp.cuda.Device(device):
                mod = cp.RawModule(code=src, options=("-std=c++17",),
                                   name_expressions=names)
                fns = {nc: mod.get_function(n) for nc, n in zip(NCS, names)}
                need = smem_bytes(qtype, stages, chunk_bytes)
                for f in fns.values():
                    if need > 48 * 1024:
                        f.max_dynamic_shared_size_bytes = need
            _mods[key] = fns
    return _mods[key]


def gemv_tma(act, w_raw: torch.Tensor, qtype: int, n_out: int, out: torch.Tensor,
             stages: int = 3, chunk_bytes: int = 1536, pdl: bool = False) -> torch.Tensor:
    """out[N, n_out] = x . W^T with N in NCS (the A/B covers these widths)."""
    n, k = int(act.n), int(act.k)
    if n not in NCS:
        raise ValueError(f"gemv_tma: N={n} not in {NCS}")
    tr = traits(qtype)
    rb = k // tr.block_size * tr.type_size
    if w_raw.numel() != n_out * rb or not w_raw.is_contiguous() or w_raw.data_ptr() % 16:
        raise ValueError("gemv_tma: weights must be contiguous, 16-byte aligned, n_out rows")
    dev = w_raw.device
    fn = _module(qtype, dev.index, stages, chunk_bytes, pdl)[n]
    stream = _rt.stream(torch.cuda.current_stream(dev).cuda_stream, dev.index)
    with stream:
        fn(((n_out + WARPS - 1) // WARPS, 1, 1), (THREADS, 1, 1),
           (np.uint64(w_raw.data_ptr()), np.uint64(act.q.data_ptr()), np.uint64(act.d.data_ptr()),
            np.uint64(act.s16.data_ptr()), np.uint64(out.data_ptr()), np.int32(n_out), np.int32(k),
            np.int32(0)),
           shared_mem=smem_bytes(qtype, stages, chunk_bytes))
    return out
