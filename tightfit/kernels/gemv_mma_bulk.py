"""The tensor-core skinny GEMM with its weights staged by bulk copies (sm_90): `tf_mmb` in
tightfit/kernels/cuda/gemv_mma_bulk.cuh, for N <= 8 columns of Q4_K, Q5_K, Q6_K and IQ4_XS.

Same contract and arithmetic as gemv_mma's tf_mma_rt (it runs through gemv_mma.gemv_mma, which
builds the launch list; this module holds the geometry, the compile and the switch). Why it exists:
tf_mma_rt waits on the bus's latency with ~9 KB of weights in flight per SM (its registers hold
them); here a CTA's ring of NST stages (64 rows x 4 blocks each) is filled by the copy engine, one
instruction per row, so a whole stage is in flight while the warps compute the one before
(bench/NOTES.md, session 14).

Switch: config {"bulk": 0|1} or env TIGHTFIT_MMA_BULK (default: DEFAULT). Shape of the kernel:
{"nst": n} / env TIGHTFIT_MMA_BULK_NST the ring depth (2 or 3); {"sb": 2|4} / TIGHTFIT_MMA_BULK_SB
blocks per row per stage (2 * sb warps per CTA); {"minb": m} / TIGHTFIT_MMA_BULK_MINB the resident
CTAs per SM the launch bounds ask for (registers: 65536 / (m * 64 * sb)); the grid takes as many
CTAs per SM as both those bounds and the shared memory allow.
"""
from __future__ import annotations

import os
import threading
from functools import lru_cache

import torch

from tightfit.kernels import cuda_runtime as _rt
from tightfit.kernels.cuda_source import CUDA_DIR, COMMON

BULK = "gemv_mma_bulk.cuh"
TYPES = (12, 13, 14, 23)            # every format whose load() takes shared memory (not Q8_0)
NSTS = (2, 3)
SBS = (2, 4)
DEFAULT_SHAPE = (2, 4, 2)           # (nst, sb, minb)
DEFAULT = False                     # measured before it becomes the default (bench/RESULTS.md)
ROWS, OUT, HDR = 64, 512, 128       # TF_MMB_ROWS, TF_MMB_OUT, tf_mmb_geo::HDR
_BB = {12: 144, 13: 176, 14: 210, 23: 136}
_lock = threading.Lock()
_fns: dict[tuple[int, int, int, str], object] = {}


def source() -> str:
    """Translation unit: gemv_common.cuh + gemv_mma.cuh + gemv_mma_bulk.cuh."""
    from tightfit.kernels.gemv_mma import MMA
    return ((CUDA_DIR / COMMON).read_text() + "\n// ---- " + MMA + "\n"
            + (CUDA_DIR / MMA).read_text() + "\n// ---- " + BULK + "\n"
            + (CUDA_DIR / BULK).read_text())


@lru_cache(maxsize=None)
def capable(device: int) -> bool:
    """cp.async.bulk and mbarrier transaction counts need sm_90."""
    return torch.cuda.get_device_capability(device)[0] >= 9


def smem(qtype: int, nst: int, sb: int) -> int:
    """Dynamic shared memory per CTA of tf_mmb<M, nst, sb, *> (mirrors tf_mmb_geo)."""
    cpr = (sb * _BB[int(qtype)] + 30) // 16
    sr = 16 * cpr if cpr & 1 else 16 * cpr + 16
    return HDR + 2 * sb * 8 * 32 * 4 + nst * ROWS * sr


def threads(sb: int) -> int:
    return 64 * sb


def geometry(qtype: int, n_in: int, n_out: int, sms: int, cps: int, sb: int) -> int:
    """CTAs of the stream-K launch: items = 64-row tile groups x stages of sb blocks, one wave of
    at most sms * cps CTAs (every CTA gets ceil(items / CTAs) or one item fewer)."""
    spt = -(-(n_in // 256) // sb)
    items = -(-int(n_out) // ROWS) * spt
    ctas = min(items, sms * cps)
    if items * ctas >= 1 << 32:
        raise ValueError(f"MMA GEMV (bulk): {items} items x {ctas} CTAs >= 2^32")
    return ctas


def choice(qtype: int, config: dict | None) -> tuple[int, int, int] | None:
    """(nst, sb, minb) of the bulk kernel for an N <= 8 call of `qtype`, or None (switch off,
    format not supported)."""
    cfg = config or {}
    on = cfg.get("bulk")
    if on is None:
        env = os.environ.get("TIGHTFIT_MMA_BULK", "").strip()
        on = DEFAULT if env == "" else env not in ("0", "off", "false", "no")
    if not on or int(qtype) not in TYPES:
        return None
    vals = []
    for key, d in zip(("nst", "sb", "minb"), DEFAULT_SHAPE):
        v = cfg.get(key) or os.environ.get(f"TIGHTFIT_MMA_BULK_{key.upper()}", "").strip() or d
        vals.append(int(v))
    nst, sb, minb = vals
    if nst not in NSTS or sb not in SBS or not 1 <= minb <= 8:
        raise ValueError(f"MMA GEMV (bulk): nst {nst} / sb {sb} / minb {minb} not in "
                         f"{NSTS} / {SBS} / 1..8")
    return nst, sb, minb


def fn(qtype: int, device: int, shape: tuple[int, int, int], name: str, options: tuple[str, ...]):
    """The compiled tf_mmb<name, nst, sb, minb> on `device` (cupy's cache makes later processes
    cheap)."""
    nst, sb, minb = shape
    key = (device, int(qtype), shape, options)
    f = _fns.get(key)
    if f is None:
        with _lock:
            f = _fns.get(key)
            if f is None:
                cp = _rt.cupy()
                expr = f"tf_mmb<{name}, {nst}, {sb}, {minb}>"
                with cp.cuda.Device(device):
                    mod = cp.RawModule(code=source(), options=options, name_expressions=[expr])
                    f = mod.get_function(expr)
                    sm = smem(qtype, nst, sb)
                    if sm > 48 << 10:
                        f.max_dynamic_shared_size_bytes = sm
                _fns[key] = f
    return f


def fits_storage(w: torch.Tensor, qtype: int, n_in: int, n_out: int) -> bool:
    """A row's copy window is rounded up to 16 bytes, so the last row may read up to 15 bytes
    past the matrix: only where its storage holds them."""
    end = int(n_out) * (n_in // 256) * _BB[int(qtype)]
    have = w.untyped_storage().nbytes() - w.storage_offset() * w.element_size()
    return have >= -(-end // 16) * 16


__all__ = ["TYPES", "NSTS", "SBS", "DEFAULT", "capable", "smem", "threads", "geometry", "choice",
           "fn", "fits_storage", "source"]
