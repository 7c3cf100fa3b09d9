"""Quantize-on-write of the decode step's new K/V row into a QUANTIZED KV cache (formats:
tightfit/kvquant/formats.py), graph-capturable: the row index is the device position status[2]
and every buffer is preallocated (`KVWriteWorkspace`).

`qk_prep_q` (the quantized twin of attn_decode.qk_prep, same arguments plus `ws`) is ONE launch
of `_qkv_write_kernel`, one program per (row, block of outputs), so no program walks a whole
D x D rotation (one program per row did: a 16-step dependent loop of [16, D] loads of R, ~16 us
per layer on the H200 where the FP16 cache's write takes ~3 us, bench/RESULTS.md session 7):
  * q head h, block b of 32 outputs when q is rotated (rotate_q), else the whole row: RMSNorm +
    partial NEOX RoPE (-> q_out fp32), then those 32 rows of R q;
  * K row j, norm block b (G values of its format): RMSNorm + RoPE (fp32, NOT rounded to fp16:
    the quantizer sees the fp32 row like kvquant.reference.write_rows), the G rows of y = R k
    when the format rotates (-> ws.k), quantized into that block's codes and scale;
  * V row j, norm block b: the G rows of y = R v when the format rotates (-> ws.v), quantized.
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
from tightfit.kvquant.formats import DEFAULT_SEED, get_format, rotation_matrix, split_kv_type


@triton.jit
def _norm_rope_at(src, w_ptr, cos_ptr, sin_ptr, pos, eps, d, D: tl.constexpr,
                  HALF: tl.constexpr):
    """attn_decode._norm_rope's values at the indices d only (the RMS still over all D)."""
    x_all = tl.load(src + tl.arange(0, D))
    r = 1.0 / tl.sqrt(tl.sum(x_all * x_all, axis=0) / D + eps)
    xn = tl.load(src + d) * r * tl.load(w_ptr + d)
    partner = tl.where(d < HALF, d + HALF, tl.where(d < 2 * HALF, d - HALF, d))
    xp = tl.load(src + partner) * r * tl.load(w_ptr + partner)
    rot = d < 2 * HALF
    ci = tl.where(d < HALF, d, d - HALF)
    c = tl.load(cos_ptr + pos * HALF + ci, mask=rot, other=1.0)
    sn = tl.load(sin_ptr + pos * HALF + ci, mask=rot, other=0.0)
    sign = tl.where(d < HALF, -1.0, 1.0)
    return xn * c + sign * xp * sn


@triton.jit
def _rot_rows(x, r_ptr, r0, D: tl.constexpr, W: tl.constexpr):
    """Rows r0 .. r0+W-1 of R x for a row x [D] held in registers: a [W, D] tile of R (one
    load, every element in flight at once), each output the full D-long dot."""
    k = tl.arange(0, D)
    i = tl.arange(0, W)
    r = tl.load(r_ptr + (r0 + i)[:, None] * D + k[None, :])
    return tl.sum(r * x[None, :], axis=1)


@triton.jit
def _rot_block(x, r_ptr, stage, b, D: tl.constexpr, W: tl.constexpr):
    """Elements b*W .. b*W+W-1 of R x. W = 32: straight from registers; wider blocks (the
    `_128` formats) in 32-row tiles through `stage` (this row's fp32 workspace), so no tile
    holds more than 32 x D values in registers."""
    if W == 32:
        y = _rot_rows(x, r_ptr, b * W, D, 32)
    else:
        for t in tl.static_range(W // 32):
            tl.store(stage + b * W + t * 32 + tl.arange(0, 32),
                     _rot_rows(x, r_ptr, b * W + t * 32, D, 32))
        tl.debug_barrier()                    # the block is read back by other threads
        y = tl.load(stage + b * W + tl.arange(0, W))
    return y


@triton.jit
def _levels(idx, cb_ptr, NL: tl.constexpr):
    """C[idx] by selects over the NL codebook levels (scalar loads with no dependence on the
    codes, so they are in flight from the start) instead of a gather that waits for the codes:
    in the step the table is cold in cache and every dependent round trip to HBM counts."""
    cv = tl.zeros(idx.shape, tl.float32)
    for lv in tl.static_range(NL):
        cv = tl.where(idx == lv, tl.load(cb_ptr + lv), cv)
    return cv


@triton.jit
def _quant_row(yv, dst, b, cb_ptr, mid_ptr, invf_ptr, sqrt_g, D: tl.constexpr, W: tl.constexpr,
               BITS: tl.constexpr, G: tl.constexpr, NL: tl.constexpr, SEARCH: tl.constexpr):
    """Quantize yv [W], elements b*W .. b*W+W-1 of one fp32 row (rotated for codebook formats),
    into their places in the D-wide planar byte row at dst (W a multiple of G)."""
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
        for c in tl.static_range(SEARCH):
            if SEARCH > 1:
                w = u * tl.load(invf_ptr + c)
            else:
                w = u
            idx = tl.zeros([NB, G], tl.int32)
            for m in tl.static_range(NL - 1):
                idx += (w > tl.load(mid_ptr + m)).to(tl.int32)
            cv = _levels(idx, cb_ptr, NL)
            yc = tl.sum(y * cv, axis=1)
            score = yc * yc / tl.maximum(tl.sum(cv * cv, axis=1), 1e-30)
            better = score > best
            bidx = tl.where(better[:, None], idx, bidx)
            best = tl.where(better, score, best)
        cv = _levels(bidx, cb_ptr, NL)
        s = g / tl.sqrt(tl.sum(cv * cv, axis=1))
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
                      D: tl.constexpr, HALF: tl.constexpr,
                      KB: tl.constexpr, KG: tl.constexpr, KNL: tl.constexpr, KROT: tl.constexpr,
                      VB: tl.constexpr, VG: tl.constexpr, VNL: tl.constexpr, VROT: tl.constexpr,
                      SEARCH: tl.constexpr, PDL: tl.constexpr = False,
                      QROT: tl.constexpr = False, QW: tl.constexpr = 32,
                      QSPLIT: tl.constexpr = True, KW: tl.constexpr = 32,
                      VW: tl.constexpr = 32):
    """One launch, one program per (row, block of outputs): [0, H*QS) q head h, outputs block b
    of QW (QS = D/QW with QROT, else 1 block of D): norm + RoPE (QROT: then rows of R q) ->
    q_out; then Hkv*D/KG programs, K row j, norm block b (KG values): norm + RoPE (+ rotation
    rows) -> ws.k, quantized into kcache[pos, j]; then Hkv*D/VG programs for the V rows."""
    p = tl.program_id(0)
    if PDL:      # H*QS + Hkv*(D/KG + D/VG) programs: one wave
        gdc_wait()
        gdc_launch_dependents()
    pos = tl.load(status_ptr + 2).to(tl.int64)
    QS: tl.constexpr = D // QW if (QROT and QSPLIT) else 1
    KS: tl.constexpr = D // KW
    VS: tl.constexpr = D // VW
    if p < H * QS:
        h = p // QS
        out = _norm_rope(qg_ptr + h * (2 * D), qn_ptr, cos_ptr, sin_ptr, pos, eps, D, HALF)
        if QROT and QSPLIT:
            b = p % QS
            tl.store(qout_ptr + h * D + b * QW + tl.arange(0, QW),
                     _rot_rows(out, r_ptr, b * QW, D, QW))
        elif QROT:
            for t in tl.static_range(D // QW):
                tl.store(qout_ptr + h * D + t * QW + tl.arange(0, QW),
                         _rot_rows(out, r_ptr, t * QW, D, QW))
        else:
            tl.store(qout_ptr + h * D + tl.arange(0, D), out)
    elif p < H * QS + Hkv * KS:
        j = (p - H * QS) // KS
        b = (p - H * QS) % KS
        if KROT:
            x = _norm_rope(k_ptr + j * D, kn_ptr, cos_ptr, sin_ptr, pos, eps, D, HALF)
            yk = _rot_block(x, r_ptr, kw_ptr + j * D, b, D, KW)
        else:
            yk = _norm_rope_at(k_ptr + j * D, kn_ptr, cos_ptr, sin_ptr, pos, eps,
                               b * KW + tl.arange(0, KW), D, HALF)
        tl.store(kw_ptr + j * D + b * KW + tl.arange(0, KW), yk)
        KRB: tl.constexpr = (D // KG) * (KG * KB // 8 + 2)
        _quant_row(yk, kc_ptr + (pos * Hkv + j) * KRB, b, kcb_ptr, kmid_ptr, kinvf_ptr, ksqrt_g,
                   D, KW, KB, KG, KNL, SEARCH)
    else:
        j = (p - H * QS - Hkv * KS) // VS
        b = (p - H * QS - Hkv * KS) % VS
        if VROT:
            x = tl.load(v_ptr + j * D + tl.arange(0, D))
            yv = _rot_block(x, r_ptr, vw_ptr + j * D, b, D, VW)
        else:
            yv = tl.load(v_ptr + j * D + b * VW + tl.arange(0, VW))
        tl.store(vw_ptr + j * D + b * VW + tl.arange(0, VW), yv)
        VRB: tl.constexpr = (D // VG) * (VG * VB // 8 + 2)
        _quant_row(yv, vc_ptr + (pos * Hkv + j) * VRB, b, vcb_ptr, vmid_ptr, vinvf_ptr, vsqrt_g,
                   D, VW, VB, VG, VNL, SEARCH)


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


QROT_W = 32         # outputs of R q per tile (rotate_q): a [32, D] tile of R
ENV_SPLIT = "TIGHTFIT_KVWRITE"   # block (default) | kvblock | row: see _split_mode


def _split_mode() -> tuple[bool, bool]:
    """(q rotation split over programs, K/V split by norm block). "block": both; "kvblock": q
    one program per head (its rotation in 32-row tiles), K/V per block; "row": one program per
    q head and per K/V row (the rotation in tiles, the row staged through ws.k / ws.v)."""
    import os
    mode = os.environ.get(ENV_SPLIT, "block")
    if mode not in ("block", "kvblock", "row"):
        raise ValueError(f"{ENV_SPLIT}={mode!r}: expected block, kvblock or row")
    return mode == "block", mode != "row"


def qk_prep_q(qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status, eps,
              ws: KVWriteWorkspace, rotate_q: bool = False):
    """qg [H, 2D], k, v [Hkv*D] fp32; byte caches [cap, Hkv, row_bytes] of ws.kv_type;
    q_out [H, D] fp32. Writes the K/V row at status[2]. One kernel launch, no host work beyond
    the launch (graph-capturable).
    rotate_q: when the K format rotates, q_out = R q (ws.R, the rotation attn_decode_q's
    workspace uses), so the attention can be called with q_rotated=True and skip its q-rotation
    launch (the H q programs do it next to the K programs' own R k; a non-rotating K format
    leaves q as is, as attn_decode_q would)."""
    H, D = q_out.shape
    Hkv = kcache.shape[1]
    kf, vf = (get_format(n) for n in split_kv_type(ws.kv_type))
    (kcb, kmid, kinvf), (vcb, vmid, vinvf) = ws.tabs
    on = pdl.enabled(q_out.device)
    qrot = bool(rotate_q and kf.rotate)
    qw = min(QROT_W, D)
    qsplit, kvblock = _split_mode()
    kw, vw = (kf.group, vf.group) if kvblock else (D, D)
    n_prog = H * (D // qw if qrot and qsplit else 1) + Hkv * (D // kw + D // vw)
    _qkv_write_kernel[(n_prog,)](
        qg, k, v, qn_w, kn_w, cos, sin, ws.R, ws.k, ws.v, q_out, kcache, vcache,
        kcb, kmid, kinvf, vcb, vmid, vinvf, status, H, Hkv, float(eps),
        math.sqrt(kf.group), math.sqrt(vf.group), D=D, HALF=cos.shape[1],
        KB=kf.bits, KG=kf.group, KNL=1 << kf.bits if kf.rotate else 1, KROT=kf.rotate,
        VB=vf.bits, VG=vf.group, VNL=1 << vf.bits if vf.rotate else 1, VROT=vf.rotate,
        SEARCH=ws.search, PDL=on, QROT=qrot, QW=qw, QSPLIT=qsplit, KW=kw, VW=vw,
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
