"""Loader of the CUDA C++ decode-attention kernel over the quantized KV cache
(tightfit/kernels/cuda/attn_q.cuh), compiled at run time with NVRTC through cupy.

It replaces only the attention step of attn_decode_q (`_attn_q_kernel`): the q rotation, the
split-K merge (`_reduce_q_kernel`, with BT = 16) and the un-rotation + gate stay the Triton
kernels, so the workspace, its partials and the interface are unchanged. `attn_decode_q` picks
this path when `usable(...)` holds (cupy importable, CUDA tensors, sm_80+, head_dim 128/256,
at most 8 query heads per KV head, row bytes a multiple of 4); else the Triton kernel runs.
TIGHTFIT_ATTNQ=triton forces the Triton kernel, =cuda makes a failure to use CUDA an error.

Launch: on torch's current stream (cupy.cuda.ExternalStream), pointers as numpy.uint64, no
allocation, so it can be captured in a CUDA graph (compile + module load happen on the first,
uncaptured call of each configuration).
"""
from __future__ import annotations

import functools
import os

CUDA_DIR = os.path.join(os.path.dirname(__file__), "cuda")
NW = 4                       # warps per CTA
TILE = 16                    # rows per tile (= BT of the split-K row formula)
SMEM_RING_MAX = 96 << 10     # per-CTA bytes of the cp.async ring (2 CTAs per SM fit)


def row_bytes(bits: int, group: int, D: int) -> int:
    return (D // group) * (group * bits // 8 + 2)


def stages(kb: int, kg: int, vb: int, vg: int, D: int) -> int:
    """cp.async ring depth per warp: as deep as fits SMEM_RING_MAX (2..4)."""
    st = TILE * (row_bytes(kb, kg, D) + row_bytes(vb, vg, D))
    return max(2, min(4, SMEM_RING_MAX // (NW * st)))


def smem_bytes(kb: int, kg: int, vb: int, vg: int, D: int, nst: int) -> int:
    ring = NW * nst * TILE * (row_bytes(kb, kg, D) + row_bytes(vb, vg, D))
    return D * 32 + max(ring, NW * (64 + 32 * D))


def defines(kb: int, kg: int, vb: int, vg: int, D: int, aligned16: bool = True) -> dict:
    """Macros of one build; CPB (bytes per cp.async) is 16 when every row is 16-B aligned."""
    rk, rv = row_bytes(kb, kg, D), row_bytes(vb, vg, D)
    cpb = 16 if (aligned16 and rk % 16 == 0 and rv % 16 == 0) else 4
    return dict(HD=D, KB=kb, KG=kg, VB=vb, VG=vg, NW=NW, NST=stages(kb, kg, vb, vg, D), CPB=cpb)


def shape_ok(kf, vf, H: int, Hkv: int, D: int) -> bool:
    """The shapes the kernel handles (else the Triton kernel runs)."""
    if D not in (128, 256) or H % Hkv or H // Hkv > 8:
        return False
    for f in (kf, vf):
        if f.bits not in (8, 4, 3, 2) or f.row_bytes(D) % 4 or (D // 8) > f.group \
                or f.group % 16:
            return False
    return True


@functools.lru_cache(maxsize=1)
def _cupy():
    try:
        import cupy
        return cupy
    except Exception:            # noqa: BLE001 - any import failure means: no CUDA path
        return None


def available() -> bool:
    return _cupy() is not None


@functools.lru_cache(maxsize=64)
def _kernel(kb: int, kg: int, vb: int, vg: int, D: int, arch: str, aligned16: bool):
    cp = _cupy()
    with open(os.path.join(CUDA_DIR, "attn_q.cuh")) as f:
        src = f.read()
    defs = defines(kb, kg, vb, vg, D, aligned16)
    opts = tuple(f"-D{k}={v}" for k, v in defs.items()) + (
        "--std=c++17", f"--gpu-architecture={arch}")
    mod = cp.RawModule(code=src, options=opts, backend="nvrtc")
    k = mod.get_function("attn_q_kernel")
    sm = smem_bytes(kb, kg, vb, vg, D, defs["NST"])
    if sm > 48 << 10:
        k.max_dynamic_shared_size_bytes = sm
    return k, sm


def _arch(device) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def usable(q, kf, vf, Hkv: int) -> bool:
    mode = os.environ.get("TIGHTFIT_ATTNQ", "auto").lower()
    if mode == "triton" or not q.is_cuda:
        return False
    import torch
    ok = (available() and torch.cuda.get_device_capability(q.device)[0] >= 8
          and shape_ok(kf, vf, q.shape[0], Hkv, q.shape[1]))
    if not ok and mode == "cuda":
        raise RuntimeError("TIGHTFIT_ATTNQ=cuda but the CUDA attention kernel cannot run here")
    return ok


def attn(q_rot, kcache, vcache, kcb, vcb, o, m, l, acc, status, kf, vf, grp: int, nch: int,
         n_launch: int, chunk: int, minr: int, qk_scale: float, split: bool) -> None:
    """One launch of attn_q_kernel over grid (n_launch chunks, Hkv): split-K partials into
    (m, l, acc) [rows per CTA: attn_decode_q._chunk_rows with BT = 16] or o = softmax . V."""
    import numpy as np
    import torch
    cp = _cupy()
    D = q_rot.shape[1]
    Hkv = kcache.shape[1]
    a16 = kcache.data_ptr() % 16 == 0 and vcache.data_ptr() % 16 == 0
    k, sm = _kernel(kf.bits, kf.group, vf.bits, vf.group, D, _arch(q_rot.device), a16)
    p = lambda t: np.uint64(t.data_ptr())  # noqa: E731
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream(q_rot.device).cuda_stream)
    with cp.cuda.Device(q_rot.device.index or 0), stream:
        k((n_launch, Hkv, 1), (NW * 32, 1, 1),
          (p(q_rot), p(kcache), p(vcache), p(kcb), p(vcb), p(o), p(m), p(l), p(acc), p(status),
           np.int32(Hkv), np.int32(grp), np.int32(nch), np.int32(chunk), np.int32(minr),
           np.float32(qk_scale), np.int32(1 if split else 0)),
          shared_mem=sm)
