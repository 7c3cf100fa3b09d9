"""Loader of the CUDA C++ decode-attention kernel over the quantized KV cache
(tightfit/kernels/cuda/attn_q.cuh), compiled at run time with NVRTC through cupy.

It replaces only the attention step of attn_decode_q (`_attn_q_kernel`): the q rotation, the
split-K merge (`_reduce_q_kernel`, with BT = 16) and the un-rotation + gate stay the Triton
kernels, so the workspace, its partials and the interface are unchanged. `attn_decode_q` picks
this path when `usable(...)` holds (cupy importable, CUDA tensors, sm_80+, head_dim 128/256,
at most 8 query heads per KV head, row bytes a multiple of 4); else the Triton kernel runs.
TIGHTFIT_ATTNQ=triton forces the Triton kernel, =cuda makes a failure to use CUDA an error.

Launch: on torch's current stream (cuda_runtime.launch), pointers as numpy.uint64, no
allocation, so it can be captured in a CUDA graph (compile + module load happen on the first,
uncaptured call of each configuration). With PDL on (tightfit/kernels/pdl.py: TIGHTFIT_PDL=1,
sm_90) the kernel is built with TF_PDL (griddepcontrol.wait before its first read) and launched
with the programmatic-serialization attribute.
"""
from __future__ import annotations

import functools
import os

from tightfit.kernels import cuda_runtime as _rt
from tightfit.kernels import pdl as _pdl

CUDA_DIR = os.path.join(os.path.dirname(__file__), "cuda")
NW = 4                       # default warps per CTA (8 when the grid is smaller than the SMs: choose())
TILE = 16                    # rows per tile (= BT of the split-K row formula)
SMEM_SM = 228 << 10          # shared memory per SM (sm_90: 228 KiB; 1 KiB reserved per CTA)
N_SM_DEFAULT = 132
ENV_NW, ENV_NST, ENV_NL = "TIGHTFIT_ATTNQ_NW", "TIGHTFIT_ATTNQ_NST", "TIGHTFIT_ATTNQ_NL"
ENV_SPREAD = "TIGHTFIT_ATTNQ_SPREAD"


def row_bytes(bits: int, group: int, D: int) -> int:
    return (D // group) * (group * bits // 8 + 2)


def ring_stride(bits: int, group: int, D: int) -> int:
    """Bytes of one row in the shared-memory ring (padded to 16: every row 16-B aligned)."""
    return -(-row_bytes(bits, group, D) // 16) * 16


def smem_sm_for(arch: str) -> int:
    """Shared memory per SM of an architecture (sm_90: 228 KiB, sm_80: 164 KiB, else 100)."""
    return {"sm_90": 228 << 10, "sm_80": 164 << 10, "sm_87": 164 << 10}.get(arch, 100 << 10)


def _target_ctas(nw: int) -> int:
    """CTAs per SM the build aims at: 16 warps per SM (4 x 4 or 2 x 8 warps), which is what
    128 registers per thread allow."""
    return max(1, 16 // nw)


def stages(kb: int, kg: int, vb: int, vg: int, D: int, nw: int = NW,
           smem_sm: int = SMEM_SM) -> int:
    """cp.async ring depth per warp: as deep as fits the target CTAs per SM (2..4)."""
    env = os.environ.get(ENV_NST)
    if env:
        return max(2, min(4, int(env)))
    st = TILE * (ring_stride(kb, kg, D) + ring_stride(vb, vg, D))
    budget = min(smem_sm // _target_ctas(nw), 100 << 10) - 1024 - D * 32
    return max(2, min(4, budget // (nw * st)))


def acc_row_stride(D: int, vb: int) -> int:
    """Floats per accumulator row of the kernel's closing merge (TF_ACC_RS in attn_q.cuh): dim d
    at d + d // 32, rows padded so one fragment store of a warp hits 32 distinct banks."""
    base = D + D // 32
    if D == 128 and vb >= 4:
        return base + (6 - base % 4) % 4
    return base + (20 - base % 16) % 16


def smem_bytes(kb: int, kg: int, vb: int, vg: int, D: int, nst: int, nw: int = NW) -> int:
    """Shared memory of one CTA (TF_SMEM_BYTES in attn_q.cuh): q fragments, then the cp.async
    ring or, reusing it after the loop, the warps' max / sum / accumulator rows."""
    ring = nw * nst * TILE * (ring_stride(kb, kg, D) + ring_stride(vb, vg, D))
    return D * 32 + max(ring, nw * (64 + 32 * acc_row_stride(D, vb)))


def ctas_per_sm(kb: int, kg: int, vb: int, vg: int, D: int, nw: int = NW, regs: int = 128,
                smem_sm: int = SMEM_SM) -> int:
    """Resident CTAs per SM from shared memory (and registers: `regs` per thread)."""
    sm = smem_bytes(kb, kg, vb, vg, D, stages(kb, kg, vb, vg, D, nw, smem_sm), nw)
    by_regs = 65536 // (-(-regs // 8) * 8 * 32 * nw)
    return max(0, min(smem_sm // (sm + 1024), by_regs, 2048 // (32 * nw), 32))


def defines(kb: int, kg: int, vb: int, vg: int, D: int, aligned16: bool = True,
            nw: int = NW, smem_sm: int = SMEM_SM) -> dict:
    """Macros of one build; CPB (bytes per cp.async) is 16 when every row is 16-B aligned.
    MINB (__launch_bounds__ min CTAs per SM, i.e. a register cap) is set when shared memory
    allows 16+ warps per SM: then 128 registers per thread keep that occupancy."""
    rk, rv = row_bytes(kb, kg, D), row_bytes(vb, vg, D)
    cpb = 16 if (aligned16 and rk % 16 == 0 and rv % 16 == 0) else 4
    nst = stages(kb, kg, vb, vg, D, nw, smem_sm)
    d = dict(HD=D, KB=kb, KG=kg, VB=vb, VG=vg, NW=nw, NST=nst, CPB=cpb)
    by_smem = smem_sm // (smem_bytes(kb, kg, vb, vg, D, nst, nw) + 1024)
    minb = min(by_smem, _target_ctas(nw))
    if minb * nw >= 12:
        d["MINB"] = minb
    return d


def spread_smem(sm: int, n_ctas: int, n_sm: int, fit: int, smem_sm: int = SMEM_SM) -> int:
    """Dynamic shared memory to launch with so that at most ceil(n_ctas / n_sm) CTAs fit on an
    SM (`fit`: what registers and `sm` would allow): every SM then gets its even share however
    busy the GPU is when the grid starts. With PDL the grid is placed while the kernels before
    it still hold SMs, and a grid that can stack 4 CTAs on an SM may leave others idle: the
    chain q-rotation -> attention -> merge at 32K took 71.4 us per layer with PDL vs 46.1
    without (session 9, bench/kv_quant.py --pieces). TIGHTFIT_ATTNQ_SPREAD=0 launches with `sm`."""
    if os.environ.get(ENV_SPREAD, "1").strip() in ("0", "off", "false", "no"):
        return sm
    want = -(-n_ctas // max(1, n_sm))
    if want >= fit:
        return sm
    padded = smem_sm // (want + 1) - 1024 + 16       # (want + 1) such CTAs no longer fit
    return max(sm, min(padded, smem_sm - 1024))


def choose(kb: int, kg: int, vb: int, vg: int, D: int, n_ctas: int,
           n_sm: int = N_SM_DEFAULT, smem_sm: int = SMEM_SM) -> int:
    """Warps per CTA for a grid of n_ctas: 4, or 8 when the grid leaves SMs empty (n_ctas < SMs:
    more warps per CTA are then the only way to more warps per SM), if such a build fits.
    Measured (session 8, tq3 at 32K, 64 chunks x 4 KV heads = 256 CTAs on 132 SMs, PDL off):
    NW = 4 36.8 us per layer vs 46.8 with NW = 8, and 10.0 vs 14.0 us at depth 0 (the CTA's
    closing merge of its warps' accumulators grows with NW). The former rule (most warps on the
    busiest SM) chose 8 there. TIGHTFIT_ATTNQ_NW=4|8 overrides."""
    env = os.environ.get(ENV_NW)
    if env:
        return int(env)
    if n_ctas < n_sm and ctas_per_sm(kb, kg, vb, vg, D, 8, 128, smem_sm) > 0:
        return 8
    return NW


#: split-K CTAs per KV head at most, whatever the context the graph was captured for: the rows
#: per CTA come from T on the device, so a state made for 128K positions launched 257 CTAs per head
#: and merged 257 partials even at T = 8K (session 6 call 6: q8_0 / tq3 decode 5-8 % slower at 8K
#: and 32K with max_ctx 131584 than with 33408). 64 is what the 32K per-layer figures used.
MAX_LAUNCH = 64


def n_launch_for(n_chunks: int, nch: int) -> int:
    """Chunks launched: min(n_chunks, MAX_LAUNCH), or TIGHTFIT_ATTNQ_NL (capped by the
    workspace's nch)."""
    env = os.environ.get(ENV_NL)
    if env and n_chunks > 1:
        return max(2, min(nch, int(env)))
    return min(n_chunks, MAX_LAUNCH) if n_chunks > 1 else n_chunks


def shape_ok(kf, vf, H: int, Hkv: int, D: int) -> bool:
    """The shapes the kernel handles (else the Triton kernel runs)."""
    if D not in (128, 256) or H % Hkv or H // Hkv > 8:
        return False
    for f in (kf, vf):
        if f.bits not in (8, 4, 3, 2) or f.row_bytes(D) % 4 or (D // 8) > f.group \
                or f.group % 32:
            return False
    return True


def _cupy():
    return _rt.cupy()


def available() -> bool:
    return _cupy() is not None


@functools.lru_cache(maxsize=64)
def _kernel(kb: int, kg: int, vb: int, vg: int, D: int, arch: str, aligned16: bool, nw: int,
            nst_env: str | None, pdl: bool = False):
    cp = _cupy()
    with open(os.path.join(CUDA_DIR, "attn_q.cuh")) as f:
        src = f.read()
    defs = defines(kb, kg, vb, vg, D, aligned16, nw, smem_sm_for(arch))
    opts = tuple(f"-D{k}={v}" for k, v in defs.items()) + (("-DTF_PDL=1",) if pdl else ()) + (
        "--std=c++17", f"--gpu-architecture={arch}")
    mod = cp.RawModule(code=src, options=opts, backend="nvrtc")
    k = mod.get_function("attn_q_kernel")
    sm = smem_bytes(kb, kg, vb, vg, D, defs["NST"], nw)
    # opt in to the SM's whole shared memory: spread_smem() may launch with more than sm
    k.max_dynamic_shared_size_bytes = smem_sm_for(arch) - 1024
    return k, sm, defs


last_config: dict = {}       # the latest launch's build + grid (bench/kv_quant.py prints it)


def config(kf, vf, D: int, Hkv: int, n_launch: int, n_sm: int = N_SM_DEFAULT,
           arch: str = "sm_90") -> dict:
    """The build + grid a launch would use (offline: bench/kv_quant.py --sass)."""
    ss = smem_sm_for(arch)
    nw = choose(kf.bits, kf.group, vf.bits, vf.group, D, n_launch * Hkv, n_sm, ss)
    d = defines(kf.bits, kf.group, vf.bits, vf.group, D, True, nw, ss)
    return dict(d, smem=smem_bytes(kf.bits, kf.group, vf.bits, vf.group, D, d["NST"], nw),
                ctas_per_sm=ctas_per_sm(kf.bits, kf.group, vf.bits, vf.group, D, nw, 128, ss))


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
    (m, l, acc) [rows per CTA: attn_decode_q._chunk_rows with BT = 16] or o = softmax . V.
    Warps per CTA from `choose` (grid vs resident CTAs), ring depth from `stages`."""
    import numpy as np
    import torch
    cp = _cupy()
    D = q_rot.shape[1]
    Hkv = kcache.shape[1]
    a16 = kcache.data_ptr() % 16 == 0 and vcache.data_ptr() % 16 == 0
    n_sm = _n_sm(q_rot.device)
    arch = _arch(q_rot.device)
    nw = choose(kf.bits, kf.group, vf.bits, vf.group, D, n_launch * Hkv, n_sm, smem_sm_for(arch))
    on = _pdl.enabled(q_rot.device, "attnq_cuda")
    k, sm, defs = _kernel(kf.bits, kf.group, vf.bits, vf.group, D, arch, a16, nw,
                          os.environ.get(ENV_NST), on)
    regs = _regs(k)
    fit = ctas_per_sm(kf.bits, kf.group, vf.bits, vf.group, D, nw, regs or 128, smem_sm_for(arch))
    sm_launch = spread_smem(sm, n_launch * Hkv, n_sm, fit, smem_sm_for(arch))
    last_config.clear()
    last_config.update(defs, n_launch=n_launch, grid=n_launch * Hkv, smem=sm,
                       smem_launch=sm_launch, regs=regs, sms=n_sm, pdl=on)
    p = lambda t: np.uint64(t.data_ptr())  # noqa: E731
    dev = q_rot.device.index or 0
    sptr = torch.cuda.current_stream(q_rot.device).cuda_stream
    with cp.cuda.Device(dev):
        _rt.launch(k, (n_launch, Hkv, 1), (nw * 32, 1, 1),
                   (p(q_rot), p(kcache), p(vcache), p(kcb), p(vcb), p(o), p(m), p(l), p(acc),
                    p(status), np.int32(Hkv), np.int32(grp), np.int32(nch), np.int32(chunk),
                    np.int32(minr), np.float32(qk_scale), np.int32(1 if split else 0)),
                   shared_mem=sm_launch, stream_ptr=sptr, device=dev, pdl=on)


@functools.lru_cache(maxsize=8)
def _n_sm(device) -> int:
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count


def _regs(k) -> int | None:
    try:
        return int(k.num_regs)
    except Exception:            # noqa: BLE001 - informational only
        return None
