"""Quantize-on-write of the decode step's new K/V row into a QUANTIZED KV cache (formats:
tightfit/kvquant/formats.py), graph-capturable: the row index is the device position status[2]
and every buffer is preallocated (`KVWriteWorkspace`).

`qk_prep_q` (the quantized twin of attn_decode.qk_prep, same arguments plus `ws`):
  1. `_prep_kernel`: RMSNorm + partial NEOX RoPE of q (-> q_out fp32) and of k (-> ws.k fp32,
     NOT rounded to fp16: the quantizer sees the fp32 row like kvquant.reference.write_rows);
  2. `_rowmat_kernel` (attn_decode_q): k <- R k and v -> ws.v = R v when the format rotates;
  3. `_write_q_kernel`, one program per KV head, K then V: the numerics of
     kvquant.reference.quantize (q8_0: d = amax/127, round-half-away codes; tqB: block norm g,
     u = sqrt(G) y / g, the same GAIN_SEARCH candidate gains 1/f (fp32, as torch rounds the
     scalar) with nearest-level codes by counting midpoints (= torch.bucketize), the candidate
     with the largest <y,c>^2/|c|^2 (first on ties), scale g / |C[idx]| in fp16), packed into
     the planar byte row at status[2].
`qk_prep_q_ref` is the torch path (CPU executor): kvquant.reference.quantize itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tightfit.kernels.attn_decode import _norm_rope, _rms, _rope_rows
from tightfit.kernels.attn_decode_q import _rowmat_kernel
from tightfit.kvquant.formats import DEFAULT_SEED, get_format, rotation_matrix, split_kv_type


@triton.jit
def _prep_kernel(qg_ptr, k_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kout_ptr, qout_ptr, status_ptr,
                 H, eps, D: tl.constexpr, HALF: tl.constexpr):
    p = tl.program_id(0)
    pos = tl.load(status_ptr + 2).to(tl.int64)
    d = tl.arange(0, D)
    if p < H:
        out = _norm_rope(qg_ptr + p * (2 * D), qn_ptr, cos_ptr, sin_ptr, pos, eps, D, HALF)
        tl.store(qout_ptr + p * D + d, out)
    else:
        j = p - H
        out = _norm_rope(k_ptr + j * D, kn_ptr, cos_ptr, sin_ptr, pos, eps, D, HALF)
        tl.store(kout_ptr + j * D + d, out)


@triton.jit
def _write_q_kernel(src_ptr, c_ptr, cb_ptr, mid_ptr, invf_ptr, status_ptr, Hkv, sqrt_g,
                    D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr, NL: tl.constexpr,
                    SEARCH: tl.constexpr):
    j = tl.program_id(0)
    pos = tl.load(status_ptr + 2).to(tl.int64)
    NB: tl.constexpr = D // G
    CB: tl.constexpr = D * BITS // 8
    RB: tl.constexpr = NB * (G * BITS // 8 + 2)
    bi = tl.arange(0, NB)
    gi = tl.arange(0, G)
    y = tl.load(src_ptr + j * D + bi[:, None] * G + gi[None, :])           # [NB, G] fp32
    dst = c_ptr + (pos * Hkv + j) * RB
    if BITS == 8:
        d = tl.max(tl.abs(y), axis=1) / 127.0
        inv = tl.where(d > 0, 1.0 / tl.maximum(d, 1e-30), 0.0)
        v = y * inv[:, None]
        q = tl.floor(tl.abs(v) + 0.5)
        q = tl.where(v < 0, -q, q)
        q = tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int32)
        tl.store(dst + bi[:, None] * G + gi[None, :], (q & 255).to(tl.uint8))
        s = d
    else:
        g = tl.sqrt(tl.sum(y * y, axis=1))                                 # [NB]
        u = y / (tl.maximum(g, 1e-30) / sqrt_g)[:, None]
        best = tl.full([NB], -1.0, tl.float32)
        bidx = tl.zeros([NB, G], tl.int32)
        for c in tl.static_range(SEARCH):
            if SEARCH > 1:
                w = u * tl.load(invf_ptr + c)
            else:
                w = u
            idx = tl.zeros([NB, G], tl.int32)
            for m in tl.static_range(NL - 1):
                idx += (w > tl.load(mid_ptr + m)).to(tl.int32)
            cv = tl.load(cb_ptr + idx)
            yc = tl.sum(y * cv, axis=1)
            score = yc * yc / tl.maximum(tl.sum(cv * cv, axis=1), 1e-30)
            better = score > best
            bidx = tl.where(better[:, None], idx, bidx)
            best = tl.where(better, score, best)
        cv = tl.load(cb_ptr + bidx)
        s = g / tl.sqrt(tl.sum(cv * cv, axis=1))
        s = tl.minimum(tl.maximum(s, -65504.0), 65504.0)
        flat = tl.reshape(bidx, [D])
        if BITS == 4:
            p2 = tl.reshape(flat, [D // 2, 2])
            b = tl.sum(p2 << (tl.arange(0, 2) * 4)[None, :], axis=1)
            tl.store(dst + tl.arange(0, D // 2), b.to(tl.uint8))
        else:
            p4 = tl.reshape(flat & 3, [D // 4, 4])
            b = tl.sum(p4 << (tl.arange(0, 4) * 2)[None, :], axis=1)
            tl.store(dst + tl.arange(0, D // 4), b.to(tl.uint8))
            if BITS == 3:
                p8 = tl.reshape(flat >> 2, [D // 8, 8])
                h = tl.sum(p8 << tl.arange(0, 8)[None, :], axis=1)
                tl.store(dst + D // 4 + tl.arange(0, D // 8), h.to(tl.uint8))
    s16 = s.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.int32)
    tl.store(dst + CB + 2 * bi, (s16 & 255).to(tl.uint8))
    tl.store(dst + CB + 2 * bi + 1, (s16 >> 8).to(tl.uint8))


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
              ws: KVWriteWorkspace):
    """qg [H, 2D], k, v [Hkv*D] fp32; byte caches [cap, Hkv, row_bytes] of ws.kv_type;
    q_out [H, D] fp32. Writes the K/V row at status[2]."""
    H, D = q_out.shape
    Hkv = kcache.shape[1]
    _prep_kernel[(H + Hkv,)](qg, k, qn_w, kn_w, cos, sin, ws.k, q_out, status, H, float(eps),
                             D=D, HALF=cos.shape[1], num_warps=2)
    BK = min(16, D)
    srcs = [ws.k, v]
    for i, (name, cache) in enumerate(zip(split_kv_type(ws.kv_type), (kcache, vcache))):
        f = get_format(name)
        src = srcs[i]
        if f.rotate:          # y = R x (row-wise); for K in place, V into ws.v
            dst = ws.k if i == 0 else ws.v
            _rowmat_kernel[(Hkv,)](src, ws.R, 1, D, src, 0, dst, D=D, BK=BK, ROT=True,
                                   GATE=False, num_warps=4)
            src = dst
        cb, mid, invf = ws.tabs[i]
        _write_q_kernel[(Hkv,)](src, cache, cb, mid, invf, status, Hkv, math.sqrt(f.group),
                                D=D, BITS=f.bits, G=f.group, NL=1 << f.bits if f.rotate else 1,
                                SEARCH=ws.search, num_warps=2)
    return q_out


def qk_prep_q_ref(qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status, eps,
                  ws: KVWriteWorkspace):
    """Torch version of `qk_prep_q` (kvquant.reference.quantize on the fp32 rows)."""
    from tightfit.kvquant.reference import quantize
    H, D = q_out.shape
    Hkv = kcache.shape[1]
    pos = int(status[2])
    c, s = cos[pos], sin[pos]
    q_out.copy_(_rope_rows(_rms(qg.reshape(H, 2 * D)[:, :D], qn_w, eps), c, s))
    kk = _rope_rows(_rms(k.reshape(Hkv, D), kn_w, eps), c, s)
    kn, vn = split_kv_type(ws.kv_type)
    kcache[pos].copy_(quantize(kk, kn, ws.seed, search=ws.search))
    vcache[pos].copy_(quantize(v.reshape(Hkv, D), vn, ws.seed, search=ws.search))
    return q_out
