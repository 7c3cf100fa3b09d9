"""Full-attention decode for one token over the FP16 KV cache (spec/qwen35.md §3.5, §3.6).

* `qk_prep`: per head, RMSNorm of q (from the interleaved attn_q output, per head [q | gate])
  and of k, partial NEOX RoPE on the first n_rot dims (cos/sin read from a table precomputed in
  float64, [max_ctx, n_rot/2] each, so large positions lose no accuracy), q -> q_out (fp32), and
  k, v rounded to fp16 into the cache row at the device position `status[2]`.
* `attn_decode`: softmax(q K^T / sqrt(D)) V over T = status[2] + 1 cached rows, GQA (query head
  h reads KV head h // (H/Hkv)), times sigmoid(gate). One program per (KV head, chunk) takes the
  whole group of query heads (padded to 16 rows for the tensor-core dot) so every K/V row is read
  once. q and p are split into fp16 hi + lo parts and each dot is done twice with fp32
  accumulation: K/V are exact fp16, so the scores and outputs keep ~fp32 accuracy.
  - single pass (`n_chunks=1`, used while T <= 1024): the program walks all T rows and writes
    the gated output;
  - split-K (`n_chunks>1`): chunk c covers rows [c*chunk, (c+1)*chunk); programs past T do
    nothing; each writes its (max, denominator, unnormalised output) to the workspace, and
    `_reduce_kernel` merges the valid chunks with a safe max/denominator merge.
  T comes from the device, so a captured graph serves every position of its mode.

Workspace (priced by the planner): split-K needs m, l [H, n_chunks] and acc [H, n_chunks, D]
fp32 = H * n_chunks * (D + 2) * 4 bytes, n_chunks = ceil(max_ctx / chunk); q_out is H*D*4 bytes;
the RoPE tables max_ctx * n_rot * 4 bytes.

`qk_prep_ref` / `attn_decode_ref` are torch references with the same signatures (the executor's
CPU path); `attention_f64` is the float64 oracle for tests.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import pdl

SINGLE_PASS_MAX = 1024       # cached tokens up to which one pass per KV head is used
DEFAULT_CHUNK = 512          # rows per split-K chunk
LOG2E = 1.4426950408889634

#: launch configuration of the split-K pass: rows per tile, warps, software-pipeline stages
#: (None = Triton's default), and nl = programs per KV head (0: one per `chunk` rows, as many as
#: the workspace has chunks; nl > 0: min(nl, n_chunks) programs sharing T evenly, rows per
#: program computed on the device from T, at least min(chunk, MIN_ROWS)).
#: bench/attn_f16_sweep.py measures the alternatives on the device: 32 programs per KV head,
#: 64-row tiles, 4 warps, 3 stages beat one program per 512-row chunk (32 rows, 4 warps) at 8K /
#: 32K / 128K by 1.13x / 1.09x / 1.61x per layer (bench/RESULTS.md session 6, call 5).
#: TIGHTFIT_ATTN_F16_CFG="bt=32;nw=4;ns=0;nl=0" (the former launch) overrides it, for A/Bs.
SPLIT_CFG = {"bt": 64, "nw": 4, "ns": 3, "nl": 32}
MIN_ROWS = 128
CFG_ENV = "TIGHTFIT_ATTN_F16_CFG"


def split_cfg() -> dict:
    cfg = dict(SPLIT_CFG)
    for part in os.environ.get(CFG_ENV, "").replace(",", ";").split(";"):
        if "=" in part:
            k, v = (x.strip() for x in part.split("=", 1))
            if k not in cfg:
                raise ValueError(f"{CFG_ENV}: unknown key {k!r} (known: {sorted(cfg)})")
            cfg[k] = int(v)
    if cfg["ns"] == 0:                  # 0 = Triton's default stages, as None
        cfg["ns"] = None
    return cfg


def rope_tables(n_ctx: int, n_rot: int, freq_base: float, rot_mask: torch.Tensor | None = None,
                device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n_ctx, n_rot/2] fp32 from float64 angles p * base^(-2i/n_rot) (* mask)."""
    half = n_rot // 2
    inv = torch.tensor([freq_base ** (-2.0 * i / n_rot) for i in range(half)], dtype=torch.float64)
    if rot_mask is not None:
        inv = inv * rot_mask.to(torch.float64)
    th = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]
    return th.cos().float().to(device), th.sin().float().to(device)


# ---- q/k norm + RoPE + KV append ----------------------------------------------------------------
@triton.jit
def _norm_rope(src, w_ptr, cos_ptr, sin_ptr, pos, eps, D: tl.constexpr, HALF: tl.constexpr):
    d = tl.arange(0, D)
    x = tl.load(src + d)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    xn = x * r * tl.load(w_ptr + d)
    partner = tl.where(d < HALF, d + HALF, tl.where(d < 2 * HALF, d - HALF, d))
    xp = tl.load(src + partner) * r * tl.load(w_ptr + partner)
    rot = d < 2 * HALF
    ci = tl.where(d < HALF, d, d - HALF)
    c = tl.load(cos_ptr + pos * HALF + ci, mask=rot, other=1.0)
    s = tl.load(sin_ptr + pos * HALF + ci, mask=rot, other=0.0)
    sign = tl.where(d < HALF, -1.0, 1.0)
    return xn * c + sign * xp * s


@triton.jit
def _qk_prep_kernel(qg_ptr, k_ptr, v_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr,
                    qout_ptr, status_ptr, H, Hkv, eps, D: tl.constexpr, HALF: tl.constexpr,
                    PDL: tl.constexpr = False):
    p = tl.program_id(0)
    if PDL:      # H + Hkv programs: one wave
        gdc_wait()
        gdc_launch_dependents()
    pos = tl.load(status_ptr + 2).to(tl.int64)
    d = tl.arange(0, D)
    if p < H:
        out = _norm_rope(qg_ptr + p * (2 * D), qn_ptr, cos_ptr, sin_ptr, pos, eps, D, HALF)
        tl.store(qout_ptr + p * D + d, out)
    else:
        j = p - H
        out = _norm_rope(k_ptr + j * D, kn_ptr, cos_ptr, sin_ptr, pos, eps, D, HALF)
        row = (pos * Hkv + j) * D
        tl.store(kc_ptr + row + d, out.to(tl.float16))
        tl.store(vc_ptr + row + d, tl.load(v_ptr + j * D + d).to(tl.float16))


def qk_prep(qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status, eps):
    """qg [H, 2D], k, v [Hkv*D] fp32; kcache/vcache [cap, Hkv, D] fp16; q_out [H, D] fp32."""
    H, D = q_out.shape
    Hkv = kcache.shape[1]
    on = pdl.enabled(q_out.device)
    _qk_prep_kernel[(H + Hkv,)](qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status,
                                H, Hkv, float(eps), D=D, HALF=cos.shape[1], PDL=on,
                                launch_pdl=on, num_warps=2)
    return q_out


def _rms(x, w, eps):
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype) * w


def _rope_rows(x, c, s):
    half = c.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, rest], dim=-1)


def qk_prep_ref(qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status, eps):
    H, D = q_out.shape
    Hkv = kcache.shape[1]
    pos = int(status[2])
    c, s = cos[pos], sin[pos]
    q_out.copy_(_rope_rows(_rms(qg.reshape(H, 2 * D)[:, :D], qn_w, eps), c, s))
    kcache[pos].copy_(_rope_rows(_rms(k.reshape(Hkv, D), kn_w, eps), c, s).to(kcache.dtype))
    vcache[pos].copy_(v.reshape(Hkv, D).to(vcache.dtype))
    return q_out


# ---- attention ----------------------------------------------------------------------------------
@triton.jit
def _attn_kernel(q_ptr, kc_ptr, vc_ptr, qg_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, status_ptr,
                 Hkv, NCH, CHUNK, qk_scale,
                 D: tl.constexpr, GRP: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr,
                 SPLIT: tl.constexpr, PDL: tl.constexpr = False, EVEN: tl.constexpr = False,
                 MINR: tl.constexpr = 128):
    kvh = tl.program_id(0)
    c = tl.program_id(1)
    if PDL:      # Hkv x n_chunks programs: one wave
        gdc_wait()
        gdc_launch_dependents()
    T = tl.load(status_ptr + 2) + 1
    ch = CHUNK
    if EVEN:
        ch = _even_rows(T, tl.num_programs(1), CHUNK, BT, MINR)
    start = c * ch
    end = tl.minimum(start + ch, T)
    gi = tl.arange(0, GP)
    gm = gi < GRP
    heads = kvh * GRP + gi
    d = tl.arange(0, D)
    q = tl.load(q_ptr + heads[:, None] * D + d[None, :], mask=gm[:, None], other=0.0) * qk_scale
    q_hi = q.to(tl.float16)
    q_lo = (q - q_hi.to(tl.float32)).to(tl.float16)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    tt = tl.arange(0, BT)
    for t0 in range(start, end, BT):
        t = t0 + tt
        tm = t < end
        row = (t.to(tl.int64) * Hkv + kvh) * D
        kk = tl.load(kc_ptr + row[:, None] + d[None, :], mask=tm[:, None], other=0.0)
        kt = tl.trans(kk)
        s = tl.dot(q_hi, kt) + tl.dot(q_lo, kt)                 # [GP, BT], log2 units
        s = tl.where(tm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vv = tl.load(vc_ptr + row[:, None] + d[None, :], mask=tm[:, None], other=0.0)
        p_hi = p.to(tl.float16)
        p_lo = (p - p_hi.to(tl.float32)).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p_hi, vv) + tl.dot(p_lo, vv)
        m_i = m_new
    if SPLIT:
        if start < T:
            idx = heads * NCH + c
            tl.store(m_ptr + idx, m_i, mask=gm)
            tl.store(l_ptr + idx, l_i, mask=gm)
            tl.store(acc_ptr + idx[:, None] * D + d[None, :], acc, mask=gm[:, None])
    else:
        o = acc / l_i[:, None]
        gate = tl.load(qg_ptr + heads[:, None] * (2 * D) + D + d[None, :], mask=gm[:, None],
                       other=0.0)
        o = o / (1.0 + tl.exp(-gate))
        tl.store(out_ptr + heads[:, None] * D + d[None, :], o, mask=gm[:, None])


@triton.jit
def _even_rows(T, NL, CHUNK, BT: tl.constexpr, MINR: tl.constexpr):
    """Rows per split-K program when NL programs share T evenly: a multiple of BT, at least
    min(CHUNK, MIN_ROWS); NL * rows >= T always. Computed on the device from T, so a captured
    graph keeps all its programs busy at every position."""
    ch = (T + NL - 1) // NL
    ch = ((ch + BT - 1) // BT) * BT
    return tl.maximum(ch, tl.minimum(CHUNK, MINR))


@triton.jit
def _reduce_kernel(qg_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, status_ptr, NCH, CHUNK,
                   D: tl.constexpr, PDL: tl.constexpr = False, EVEN: tl.constexpr = False,
                   NL=1, BT: tl.constexpr = 32, MINR: tl.constexpr = 128):
    h = tl.program_id(0)
    if PDL:      # H programs: one wave
        gdc_wait()
        gdc_launch_dependents()
    T = tl.load(status_ptr + 2) + 1
    ch = CHUNK
    if EVEN:
        ch = _even_rows(T, NL, CHUNK, BT, MINR)
    nv = (T + ch - 1) // ch
    d = tl.arange(0, D)
    M = float("-inf")
    for c in range(0, nv):
        M = tl.maximum(M, tl.load(m_ptr + h * NCH + c))
    L = 0.0
    o = tl.zeros([D], tl.float32)
    for c in range(0, nv):
        w = tl.exp2(tl.load(m_ptr + h * NCH + c) - M)
        L += tl.load(l_ptr + h * NCH + c) * w
        o += tl.load(acc_ptr + (h * NCH + c) * D + d) * w
    gate = tl.load(qg_ptr + h * (2 * D) + D + d)
    tl.store(out_ptr + h * D + d, o / L / (1.0 + tl.exp(-gate)))


def n_chunks_for(max_ctx: int, chunk: int = DEFAULT_CHUNK) -> int:
    return max(1, -(-max_ctx // chunk))


def workspace_bytes(n_head: int, head_dim: int, max_ctx: int, chunk: int = DEFAULT_CHUNK) -> int:
    return n_head * n_chunks_for(max_ctx, chunk) * (head_dim + 2) * 4


def make_workspace(n_head: int, head_dim: int, max_ctx: int, chunk: int = DEFAULT_CHUNK,
                   device: str | torch.device = "cpu"):
    nch = n_chunks_for(max_ctx, chunk)
    return (torch.zeros(n_head, nch, dtype=torch.float32, device=device),
            torch.zeros(n_head, nch, dtype=torch.float32, device=device),
            torch.zeros(n_head, nch, head_dim, dtype=torch.float32, device=device))


def attn_decode(q, kcache, vcache, qg, out, status, ws=None, n_chunks: int = 1,
                chunk: int = DEFAULT_CHUNK, BT: int | None = None):
    """q [H, D] fp32 (normed, roped), caches [cap, Hkv, D] fp16, qg [H, 2D] (gate = second half)
    -> out [H, D] = softmax(qK^T/sqrt(D)) V * sigmoid(gate) over T = status[2] + 1 rows.
    n_chunks=1: single pass (any T, meant for T <= SINGLE_PASS_MAX); else split-K with
    `ws = make_workspace(...)`, n_chunks = its chunk count, `chunk` rows each. BT (rows per
    tile) defaults to 32 single-pass and to SPLIT_CFG / TIGHTFIT_ATTN_F16_CFG split-K."""
    H, D = q.shape
    Hkv = kcache.shape[1]
    grp = H // Hkv
    GP = max(16, triton.next_power_of_2(grp))
    scale = LOG2E / math.sqrt(D)
    on = pdl.enabled(q.device)
    if n_chunks <= 1:
        dummy = out
        _attn_kernel[(Hkv, 1)](q, kcache, vcache, qg, out, dummy, dummy, dummy, status,
                               Hkv, 1, 1 << 30, scale, D=D, GRP=grp, GP=GP, BT=BT or 32, SPLIT=False,
                               PDL=on, launch_pdl=on, num_warps=4)
        return out
    m, l, acc = ws
    assert m.shape[1] >= n_chunks
    NCH = m.shape[1]
    cfg = split_cfg()
    extra = {} if cfg["ns"] is None else {"num_stages": cfg["ns"]}
    even = cfg["nl"] > 0
    nl = min(cfg["nl"], n_chunks) if even else n_chunks
    bt = BT or cfg["bt"]
    _attn_kernel[(Hkv, nl)](q, kcache, vcache, qg, out, m, l, acc, status, Hkv, NCH, chunk,
                            scale, D=D, GRP=grp, GP=GP, BT=bt, SPLIT=True, PDL=on, EVEN=even,
                            MINR=MIN_ROWS, launch_pdl=on, num_warps=cfg["nw"], **extra)
    _reduce_kernel[(H,)](qg, out, m, l, acc, status, NCH, chunk, D=D, PDL=on, EVEN=even, NL=nl,
                         BT=bt, MINR=MIN_ROWS, launch_pdl=on, num_warps=2)
    return out


def attn_decode_ref(q, kcache, vcache, qg, out, status, ws=None, n_chunks: int = 1,
                    chunk: int = DEFAULT_CHUNK, BT: int = 32):
    """Torch version of `attn_decode` (same buffers), computing in q's dtype."""
    H, D = q.shape
    T = int(status[2]) + 1
    gate = qg.reshape(H, 2 * D)[:, D:]
    out.copy_(attention_f64(q, kcache[:T], vcache[:T], gate, dtype=q.dtype))
    return out


def attention_f64(q, K, V, gate, dtype=torch.float64):
    """Oracle: q [H, D], K/V [T, Hkv, D], gate [H, D] -> [H, D] (grouped GQA, sigmoid gate)."""
    H, D = q.shape
    Hkv = K.shape[1]
    grp = H // Hkv
    qv = q.to(dtype).reshape(Hkv, grp, D)
    s = torch.einsum("jgd,tjd->jgt", qv, K.to(dtype)) / math.sqrt(D)
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("jgt,tjd->jgd", p, V.to(dtype)).reshape(H, D)
    return o * torch.sigmoid(gate.to(dtype))
