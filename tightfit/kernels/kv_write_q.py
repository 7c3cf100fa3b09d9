"""Quantize-on-write of the decode step's new K/V row into a QUANTIZED KV cache (formats:
tightfit/kvquant/formats.py), graph-capturable: the row index is the device position status[2]
and every buffer is preallocated (`KVWriteWorkspace`).

`qk_prep_q` (the quantized twin of attn_decode.qk_prep, same arguments plus `ws`) is ONE launch
of `_qkv_write_kernel` (grid H + 2*Hkv):
  * programs [0, H): RMSNorm + partial NEOX RoPE of q (-> q_out fp32);
  * programs [H, H+Hkv): the K row: RMSNorm + RoPE (fp32, NOT rounded to fp16: the quantizer
    sees the fp32 row like kvquant.reference.write_rows), y = R k when the format rotates
    (-> ws.k), quantized;
  * programs [H+Hkv, H+2Hkv): the V row: y = R v when the format rotates (-> ws.v), quantized.
  The rotations (and q's, rotate_q) are tightfit.kernels.rht.rotate: the Hadamard transform in
  registers, reading only R's first row and column (a dense R x streamed R from L2 in 16 serial
  tiles per program: ~20 us per layer, session 8).
  Quantization (`_quant_row`) has the numerics of kvquant.reference.quantize (q8_0: d = amax/127,
  round-half-away codes; tqB: block norm g, u = sqrt(G) y / g, the same GAIN_SEARCH candidate
  gains 1/f (fp32, as torch rounds the scalar) with nearest-level codes by counting midpoints
  (= torch.bucketize), the candidate with the largest <y,c>^2/|c|^2 (first on ties), scale
  g / |C[idx]| in fp16), packed into the planar byte row at status[2].
  (Before: 5 launches — prep, 2 rotations, 2 quantizers; its cost per layer is a few us of
  launch gaps, not the 0.4-4.4 ms bench/kv_quant.py used to print: that column timed the torch
  reference `kvquant.reference.quantize`, with its host-side rotation/codebook tensors and
  dozens of small launches, not this kernel.)
`qk_prep_q_ref` is the torch path (CPU executor): kvquant.reference.quantize itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import pdl
from tightfit.kernels.attn_decode import _norm_rope, _rms, _rope_rows
from tightfit.kernels.rht import hadamard_split, rotate
from tightfit.kvquant.formats import DEFAULT_SEED, get_format, rotation_matrix, split_kv_type


@triton.jit
def _quant_row(yv, dst, b, cb_ptr, mid_ptr, invf_ptr, sqrt_g, D: tl.constexpr, W: tl.constexpr,
               BITS: tl.constexpr, G: tl.constexpr, NL: tl.constexpr, SEARCH: tl.constexpr):
    """Quantize yv [W], elements b*W .. b*W+W-1 of one fp32 row (rotated for codebook formats;
    W a multiple of G: the whole row is b = 0, W = D), into their places in the D-wide planar
    byte row at dst."""
    NB: tl.constexpr = W // G
    CB: tl.constexpr = D * BITS // 8
    bi = tl.arange(0, NB)
    gi = tl.arange(0, G)
    y = tl.reshape(yv, [NB, G])
    if BITS == 8:
        d = tl.max(tl.abs(y), axis=1) / 127.0
        inv = tl.where(d > 0, 1.0 / tl.maximum(d, 1e-30), 0.0)
        v = y * inv[:, None]
        q = tl.floor(tl.abs(v) + 0.5)
        q = tl.where(v < 0, -q, q)
        q = tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int32)
        tl.store(dst + b * W + bi[:, None] * G + gi[None, :], (q & 255).to(tl.uint8))
        s = d
    else:
        g = tl.sqrt(tl.sum(y * y, axis=1))                                 # [NB]
        u = y / (tl.maximum(g, 1e-30) / sqrt_g)[:, None]
        best = tl.full([NB], -1.0, tl.float32)
        bidx = tl.zeros([NB, G], tl.int32)
        bcv = tl.zeros([NB, G], tl.float32)
        for c in tl.static_range(SEARCH):
            if SEARCH > 1:
                w = u * tl.load(invf_ptr + c)
            else:
                w = u
            # nearest level by counting midpoints; C[idx] follows by selects (the midpoints
            # increase, so the last one passed names the level): no gather from the codebook
            idx = tl.zeros([NB, G], tl.int32)
            cv = tl.zeros([NB, G], tl.float32) + tl.load(cb_ptr)
            for m in tl.static_range(NL - 1):
                gt = w > tl.load(mid_ptr + m)
                idx += gt.to(tl.int32)
                cv = tl.where(gt, tl.load(cb_ptr + m + 1), cv)
            yc = tl.sum(y * cv, axis=1)
            score = yc * yc / tl.maximum(tl.sum(cv * cv, axis=1), 1e-30)
            better = score > best
            bidx = tl.where(better[:, None], idx, bidx)
            bcv = tl.where(better[:, None], cv, bcv)
            best = tl.where(better, score, best)
        s = g / tl.sqrt(tl.sum(bcv * bcv, axis=1))
        s = tl.minimum(tl.maximum(s, -65504.0), 65504.0)
        flat = tl.reshape(bidx, [W])
        if BITS == 4:
            p2 = tl.reshape(flat, [W // 2, 2])
            c2 = tl.sum(p2 << (tl.arange(0, 2) * 4)[None, :], axis=1)
            tl.store(dst + b * (W // 2) + tl.arange(0, W // 2), c2.to(tl.uint8))
        else:
            p4 = tl.reshape(flat & 3, [W // 4, 4])
            c4 = tl.sum(p4 << (tl.arange(0, 4) * 2)[None, :], axis=1)
            tl.store(dst + b * (W // 4) + tl.arange(0, W // 4), c4.to(tl.uint8))
            if BITS == 3:
                p8 = tl.reshape(flat >> 2, [W // 8, 8])
                h = tl.sum(p8 << tl.arange(0, 8)[None, :], axis=1)
                tl.store(dst + D // 4 + b * (W // 8) + tl.arange(0, W // 8), h.to(tl.uint8))
    s16 = s.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.int32)
    tl.store(dst + CB + 2 * (b * NB + bi), (s16 & 255).to(tl.uint8))
    tl.store(dst + CB + 2 * (b * NB + bi) + 1, (s16 >> 8).to(tl.uint8))


@triton.jit
def _qkv_write_kernel(qg_ptr, k_ptr, v_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, r_ptr, kw_ptr,
                      vw_ptr, qout_ptr, kc_ptr, vc_ptr, kcb_ptr, kmid_ptr, kinvf_ptr, vcb_ptr,
                      vmid_ptr, vinvf_ptr, status_ptr, H, Hkv, eps, ksqrt_g, vsqrt_g,
                      D: tl.constexpr, HALF: tl.constexpr, HA: tl.constexpr,
                      KB: tl.constexpr, KG: tl.constexpr, KNL: tl.constexpr, KROT: tl.constexpr,
                      VB: tl.constexpr, VG: tl.constexpr, VNL: tl.constexpr, VROT: tl.constexpr,
                      SEARCH: tl.constexpr, PDL: tl.constexpr = False,
                      QROT: tl.constexpr = False):
    """One launch: programs [0, H) q norm + RoPE (QROT: then q = R q) -> q_out; [H, H+Hkv) K row j: norm + RoPE
    (+ rotation) -> ws.k, quantized into kcache[pos, j]; [H+Hkv, H+2Hkv) V row j: (rotation)
    -> ws.v, quantized into vcache[pos, j]."""
    p = tl.program_id(0)
    if PDL:      # H + 2 Hkv programs: one wave
        gdc_wait()
        gdc_launch_dependents()
    pos = tl.load(status_ptr + 2).to(tl.int64)
    d = tl.arange(0, D)
    if p < H:
        out = _norm_rope(qg_ptr + p * (2 * D), qn_ptr, cos_ptr, sin_ptr, pos, eps, D, HALF)
        if QROT:
            out = rotate(out, r_ptr, D, HA)
        tl.store(qout_ptr + p * D + d, out)
    elif p < H + Hkv:
        j = p - H
        y = _norm_rope(k_ptr + j * D, kn_ptr, cos_ptr, sin_ptr, pos, eps, D, HALF)
        if KROT:
            y = rotate(y, r_ptr, D, HA)
        tl.store(kw_ptr + j * D + d, y)
        KRB: tl.constexpr = (D // KG) * (KG * KB // 8 + 2)
        _quant_row(y, kc_ptr + (pos * Hkv + j) * KRB, 0, kcb_ptr, kmid_ptr, kinvf_ptr, ksqrt_g,
                   D, D, KB, KG, KNL, SEARCH)
    else:
        j = p - H - Hkv
        y = tl.load(v_ptr + j * D + d)
        if VROT:
            y = rotate(y, r_ptr, D, HA)
        tl.store(vw_ptr + j * D + d, y)
        VRB: tl.constexpr = (D // VG) * (VG * VB // 8 + 2)
        _quant_row(y, vc_ptr + (pos * Hkv + j) * VRB, 0, vcb_ptr, vmid_ptr, vinvf_ptr, vsqrt_g,
                   D, D, VB, VG, VNL, SEARCH)


# ---- host side -----------------------------------------------------------------------------------
@dataclass
class KVWriteWorkspace:
    kv_type: str
    R: torch.Tensor            # [D, D] fp32 (attn_decode_q's workspace R may be shared)
    tabs: tuple                # per K, V: (codebook [16], midpoints [16], 1/f gains [SEARCH])
    k: torch.Tensor            # [Hkv, D] fp32: normed + roped (+ rotated) K row
    v: torch.Tensor            # [Hkv, D] fp32: rotated V row (rotating V formats)
    search: int
    seed: int = DEFAULT_SEED

    @property
    def nbytes(self) -> int:
        ts = [self.k, self.v, *(t for tab in self.tabs for t in tab)]
        return sum(t.numel() * t.element_size() for t in ts)


def make_write_workspace(kv_type: str, n_head_kv: int, head_dim: int,
                         R: torch.Tensor | None = None, seed: int = DEFAULT_SEED,
                         device: str | torch.device = "cpu") -> KVWriteWorkspace:
    from tightfit.kvquant import reference as KR
    search = int(KR.GAIN_SEARCH)
    invf = torch.tensor([1.0 / f for f in torch.linspace(1 - KR.GAIN_SPAN, 1 + KR.GAIN_SPAN,
                                                          search).tolist()], dtype=torch.float32)
    tabs = []
    for name in split_kv_type(kv_type):
        f = get_format(name)
        f.check_dim(head_dim)
        cb, mid = torch.zeros(16), torch.zeros(16)
        if f.rotate:
            c = f.codebook()
            cb[:c.numel()] = c
            mid[:c.numel() - 1] = (c[1:] + c[:-1]) * 0.5
        tabs.append((cb.to(device), mid.to(device), invf.to(device)))
    if R is None:
        R = rotation_matrix(head_dim, seed, torch.float32, device).contiguous()
    z = torch.zeros(n_head_kv, head_dim, dtype=torch.float32, device=device)
    return KVWriteWorkspace(kv_type, R, tuple(tabs), z, z.clone(), search, seed)


def qk_prep_q(qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status, eps,
              ws: KVWriteWorkspace, rotate_q: bool = False):
    """qg [H, 2D], k, v [Hkv*D] fp32; byte caches [cap, Hkv, row_bytes] of ws.kv_type;
    q_out [H, D] fp32. Writes the K/V row at status[2]. One kernel launch,
    no host work beyond it (graph-capturable).
    rotate_q: when the K format rotates, q_out = R q (ws.R, the rotation attn_decode_q's
    workspace uses), so the attention can be called with q_rotated=True and skip its q-rotation
    launch (the H q programs do it next to the K programs' own R k; a non-rotating K format
    leaves q as is, as attn_decode_q would)."""
    H, D = q_out.shape
    Hkv = kcache.shape[1]
    kf, vf = (get_format(n) for n in split_kv_type(ws.kv_type))
    (kcb, kmid, kinvf), (vcb, vmid, vinvf) = ws.tabs
    on = pdl.enabled(q_out.device)
    _qkv_write_kernel[(H + 2 * Hkv,)](
        qg, k, v, qn_w, kn_w, cos, sin, ws.R, ws.k, ws.v, q_out, kcache, vcache,
        kcb, kmid, kinvf, vcb, vmid, vinvf, status, H, Hkv, float(eps),
        math.sqrt(kf.group), math.sqrt(vf.group), D=D, HALF=cos.shape[1],
        HA=hadamard_split(D) if kf.rotate or vf.rotate else 1,
        KB=kf.bits, KG=kf.group, KNL=1 << kf.bits if kf.rotate else 1, KROT=kf.rotate,
        VB=vf.bits, VG=vf.group, VNL=1 << vf.bits if vf.rotate else 1, VROT=vf.rotate,
        SEARCH=ws.search, PDL=on, QROT=bool(rotate_q and kf.rotate),
        launch_pdl=on, num_warps=4)
    return q_out


def qk_prep_q_ref(qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status, eps,
                  ws: KVWriteWorkspace, rotate_q: bool = False):
    """Torch version of `qk_prep_q` (kvquant.reference.quantize on the fp32 rows)."""
    from tightfit.kvquant.reference import quantize
    H, D = q_out.shape
    Hkv = kcache.shape[1]
    pos = int(status[2])
    c, s = cos[pos], sin[pos]
    qq = _rope_rows(_rms(qg.reshape(H, 2 * D)[:, :D], qn_w, eps), c, s)
    kk = _rope_rows(_rms(k.reshape(Hkv, D), kn_w, eps), c, s)
    kn, vn = split_kv_type(ws.kv_type)
    if rotate_q and get_format(kn).rotate:
        qq = qq @ ws.R.to(qq.device, qq.dtype).T
    q_out.copy_(qq)
    kcache[pos].copy_(quantize(kk, kn, ws.seed, search=ws.search))
    vcache[pos].copy_(quantize(v.reshape(Hkv, D), vn, ws.seed, search=ws.search))
    return q_out
