"""Quantize-on-write of the new K/V row with ONE WARP per norm block (an alternative layout of
kv_write_q's K/V programs, selected with TIGHTFIT_KVWRITE=warp for a device A/B; not the default
until it measures faster).

Why: session 7 measured the 4-warp write kernel at 24.8 us per layer inside the step (PDL off),
whatever the program layout (per row, per norm block, q split or not), and slower still when the
codebook gather became selects: the time is the chain of block-wide reductions, each a round
trip through shared memory with barriers across 4 warps (norm, rotation, 5 gain candidates x 2
sums, the scale), not the bytes or the arithmetic (bench/NOTES.md, session 7). Here a program is
one warp and one norm block of G values of one K or V row (G = 32: one value per lane), so every
reduction is warp shuffles, and the rotation rows R[bG:(b+1)G, :] are read in [G, 32] tiles
against 32-column chunks of the normed + roped row, each chunk recomputed from the input (L1 hits)
instead of a register tensor sliced across threads.

q (norm + RoPE, its rotation) stays in kv_write_q._qkv_write_kernel, launched for the H q programs
only. Same bytes as kv_write_q (tests/test_kvquant_kernel.py compares them with the torch path).
"""
from __future__ import annotations

import math

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import pdl
from tightfit.kernels.attn_decode import _norm_rope_at
from tightfit.kernels.kv_write_q import _quant_row
from tightfit.kvquant.formats import get_format, split_kv_type

CK = 32          # columns of R per tile (and values of the row per chunk): a launch constexpr


@triton.jit
def _block_values(src, w_ptr, cos_ptr, sin_ptr, r_ptr, pos, eps, b, D: tl.constexpr,
                  G: tl.constexpr, HALF: tl.constexpr, NORM: tl.constexpr, ROT: tl.constexpr,
                  CK: tl.constexpr):
    """Values b*G .. b*G+G-1 of the row to quantize: the row at src (K: RMSNorm + RoPE first),
    rotated (rows of R x) when the format rotates."""
    i = tl.arange(0, G)
    r = 1.0
    if NORM:
        x_all = tl.load(src + tl.arange(0, D))
        r = 1.0 / tl.sqrt(tl.sum(x_all * x_all, axis=0) / D + eps)
    if ROT:
        kk = tl.arange(0, CK)
        y = tl.zeros([G], tl.float32)
        for c in tl.static_range(D // CK):
            if NORM:
                xc = _norm_rope_at(src, w_ptr, cos_ptr, sin_ptr, pos, r, c * CK, CK, HALF)
            else:
                xc = tl.load(src + c * CK + kk)
            t = tl.load(r_ptr + (b * G + i)[:, None] * D + (c * CK + kk)[None, :])
            y += tl.sum(t * xc[None, :], axis=1)
    else:
        if NORM:
            y = _norm_rope_at(src, w_ptr, cos_ptr, sin_ptr, pos, r, b * G, G, HALF)
        else:
            y = tl.load(src + b * G + i)
    return y


@triton.jit
def _write_block(i, src, w_ptr, cos_ptr, sin_ptr, r_ptr, ws_ptr, c_ptr, cb_ptr, mid_ptr, invf_ptr,
                 sqrt_g, pos, eps, Hkv, D: tl.constexpr, HALF: tl.constexpr, B: tl.constexpr,
                 G: tl.constexpr, NL: tl.constexpr, NORM: tl.constexpr, ROT: tl.constexpr,
                 SEARCH: tl.constexpr, CK: tl.constexpr):
    """Program i of one half (K or V): row j = i // (D/G), norm block b = i % (D/G) -> its values
    in the fp32 workspace row and its codes + scale in cache row (pos, j)."""
    j = i // (D // G)
    b = i % (D // G)
    y = _block_values(src + j * D, w_ptr, cos_ptr, sin_ptr, r_ptr, pos, eps, b, D, G, HALF, NORM,
                      ROT, CK)
    tl.store(ws_ptr + j * D + b * G + tl.arange(0, G), y)
    RB: tl.constexpr = (D // G) * (G * B // 8 + 2)
    _quant_row(y, c_ptr + (pos * Hkv + j) * RB, b, cb_ptr, mid_ptr, invf_ptr, sqrt_g, D, G, B, G,
               NL, SEARCH)


@triton.jit
def _kv_block_kernel(k_ptr, v_ptr, kn_ptr, cos_ptr, sin_ptr, r_ptr, kw_ptr, vw_ptr, kc_ptr, vc_ptr,
                     kcb_ptr, kmid_ptr, kinvf_ptr, vcb_ptr, vmid_ptr, vinvf_ptr, status_ptr, Hkv,
                     eps, ksqrt_g, vsqrt_g, D: tl.constexpr, HALF: tl.constexpr,
                     KB: tl.constexpr, KG: tl.constexpr, KNL: tl.constexpr, KROT: tl.constexpr,
                     VB: tl.constexpr, VG: tl.constexpr, VNL: tl.constexpr, VROT: tl.constexpr,
                     SEARCH: tl.constexpr, CK: tl.constexpr, PDL: tl.constexpr = False):
    """Programs [0, Hkv*D/KG): K rows (RMSNorm + RoPE first), then Hkv*D/VG programs: V rows."""
    p = tl.program_id(0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pos = tl.load(status_ptr + 2).to(tl.int64)
    NK: tl.constexpr = D // KG
    if p < Hkv * NK:
        _write_block(p, k_ptr, kn_ptr, cos_ptr, sin_ptr, r_ptr, kw_ptr, kc_ptr, kcb_ptr, kmid_ptr,
                     kinvf_ptr, ksqrt_g, pos, eps, Hkv, D, HALF, KB, KG, KNL, True, KROT, SEARCH,
                     CK)
    else:
        _write_block(p - Hkv * NK, v_ptr, kn_ptr, cos_ptr, sin_ptr, r_ptr, vw_ptr, vc_ptr,
                     vcb_ptr, vmid_ptr, vinvf_ptr, vsqrt_g, pos, eps, Hkv, D, HALF, VB, VG, VNL,
                     False, VROT, SEARCH, CK)


def write_kv_blocks(k, v, kn_w, cos, sin, kcache, vcache, status, eps, ws) -> None:
    """The K/V half of kv_write_q.qk_prep_q, one warp per norm block (same bytes, same ws.k/ws.v)."""
    Hkv = kcache.shape[1]
    D = ws.k.shape[1]
    kf, vf = (get_format(n) for n in split_kv_type(ws.kv_type))
    (kcb, kmid, kinvf), (vcb, vmid, vinvf) = ws.tabs
    on = pdl.enabled(k.device)
    grid = (Hkv * (D // kf.group + D // vf.group),)
    _kv_block_kernel[grid](
        k, v, kn_w, cos, sin, ws.R, ws.k, ws.v, kcache, vcache, kcb, kmid, kinvf, vcb, vmid,
        vinvf, status, Hkv, float(eps), math.sqrt(kf.group), math.sqrt(vf.group), D=D,
        HALF=cos.shape[1], KB=kf.bits, KG=kf.group, KNL=1 << kf.bits if kf.rotate else 1,
        KROT=kf.rotate, VB=vf.bits, VG=vf.group, VNL=1 << vf.bits if vf.rotate else 1,
        VROT=vf.rotate, SEARCH=ws.search, CK=CK, PDL=on, launch_pdl=on, num_warps=1)
