"""Full-attention decode for one token reading a QUANTIZED KV cache directly (formats:
tightfit/kvquant/formats.py; q8_0, tq2/tq3/tq4, tq3_128/tq4_128, K and V formats independent).

Caches are `uint8 [cap, Hkv, row_bytes]` (one byte row per token and KV head, written by
tightfit.kvquant.reference.write_rows). Same buffers and conventions as attn_decode.py: q [H, D]
fp32 already normed + roped, qg [H, 2D] with the output gate in the second half of each head,
T = status[2] + 1 rows, grouped GQA (query head h reads KV head h // (H/Hkv)).

Steps (spec quant-formats §6.4, "keep the codebook domain rotated"):
  1. `_rowmat_kernel`: q_rot = R q once per head (only if the K format rotates);
  2. `_attn_q_kernel`, one program per (KV head, chunk) holding the whole query group (padded to
     16 rows for tl.dot): per tile of BT rows the K codes are decoded to C[idx] * block scale (or
     int8 * d for q8_0) in registers, scores = q_rot . k_rot; V rows likewise, accumulated in the
     rotated domain. The decoded fp32 values and q / p are split into fp16 hi + lo parts and each
     product takes three fp16 tensor-core dots (hi.hi + lo.hi + hi.lo) with fp32 accumulation, so
     the kernel matches float64 on the same quantized data to ~1e-6 relative.
     - single pass (n_chunks = 1): writes o_rot = acc / l;
     - split-K (n_chunks > 1): chunk c covers rows [c*chunk, (c+1)*chunk); partial (max, denom,
       acc) to the workspace, `_reduce_q_kernel` merges the valid chunks into o_rot;
  3. `_rowmat_kernel`: out = (R^T o_rot) * sigmoid(gate) once per head (rotation only if the V
     format rotates).
R is the [D, D] float32 rotation matrix (D2 H D1 / sqrt(D)); both rotations read it, with
transposed strides for step 1.

Workspace (`QuantAttnWorkspace`): R (D*D*4 B), two codebooks (16 floats each), q_rot and o_rot
(H*D*4 B each) and, for split-K, m, l [H, n_chunks] + acc [H, n_chunks, D] fp32, the same
H * n_chunks * (D + 2) * 4 bytes as attn_decode.py's split-K.

`attn_decode_q_ref` is the torch version (same signature); the float64 oracle is
tightfit.kvquant.reference.attention_quant_f64 (dequantizes everything to the original basis).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tightfit.kvquant.formats import DEFAULT_SEED, get_format, rotation_matrix, split_kv_type

SINGLE_PASS_MAX = 1024
DEFAULT_CHUNK = 512
LOG2E = 1.4426950408889634


@triton.jit
def _decode_tile(c_ptr, row, tm, d, cb_ptr, D: tl.constexpr, BITS: tl.constexpr,
                 G: tl.constexpr):
    """fp32 [BT, D] values of BT byte rows (byte offsets `row`, valid where tm), in the rotated
    domain for codebook formats."""
    m2 = tm[:, None]
    base = c_ptr + row[:, None]
    if BITS == 8:
        raw = tl.load(base + d[None, :], mask=m2, other=0)
        v = raw.to(tl.int8, bitcast=True).to(tl.float32)
    else:
        if BITS == 4:
            b = tl.load(base + (d // 2)[None, :], mask=m2, other=0).to(tl.int32)
            idx = (b >> ((d % 2) * 4)[None, :]) & 15
        else:
            b = tl.load(base + (d // 4)[None, :], mask=m2, other=0).to(tl.int32)
            idx = (b >> ((d % 4) * 2)[None, :]) & 3
            if BITS == 3:
                h = tl.load(base + (D // 4 + d // 8)[None, :], mask=m2, other=0).to(tl.int32)
                idx = idx | (((h >> (d % 8)[None, :]) & 1) << 2)
        v = tl.load(cb_ptr + idx)
    so = (D * BITS // 8 + 2 * (d // G))[None, :]
    lo = tl.load(base + so, mask=m2, other=0).to(tl.int32)
    hi = tl.load(base + so + 1, mask=m2, other=0).to(tl.int32)
    s = (lo | (hi << 8)).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return v * s


@triton.jit
def _split16(x):
    hi = x.to(tl.float16)
    return hi, (x - hi.to(tl.float32)).to(tl.float16)


@triton.jit
def _attn_q_kernel(q_ptr, kc_ptr, vc_ptr, kcb_ptr, vcb_ptr, o_ptr, m_ptr, l_ptr, acc_ptr,
                   status_ptr, Hkv, NCH, CHUNK, qk_scale,
                   D: tl.constexpr, GRP: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr,
                   KB: tl.constexpr, KG: tl.constexpr, VB: tl.constexpr, VG: tl.constexpr,
                   SPLIT: tl.constexpr):
    kvh = tl.program_id(0)
    c = tl.program_id(1)
    T = tl.load(status_ptr + 2) + 1
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, T)
    RBK: tl.constexpr = (D // KG) * (KG * KB // 8 + 2)
    RBV: tl.constexpr = (D // VG) * (VG * VB // 8 + 2)
    gi = tl.arange(0, GP)
    gm = gi < GRP
    heads = kvh * GRP + gi
    d = tl.arange(0, D)
    q = tl.load(q_ptr + heads[:, None] * D + d[None, :], mask=gm[:, None], other=0.0) * qk_scale
    q_hi, q_lo = _split16(q)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    tt = tl.arange(0, BT)
    for t0 in range(start, end, BT):
        t = t0 + tt
        tm = t < end
        r = t.to(tl.int64) * Hkv + kvh
        k_hi, k_lo = _split16(_decode_tile(kc_ptr, r * RBK, tm, d, kcb_ptr, D, KB, KG))
        kt_hi = tl.trans(k_hi)
        s = tl.dot(q_hi, kt_hi) + tl.dot(q_lo, kt_hi) + tl.dot(q_hi, tl.trans(k_lo))
        s = tl.where(tm[None, :], s, float("-inf"))            # [GP, BT], log2 units
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_hi, v_lo = _split16(_decode_tile(vc_ptr, r * RBV, tm, d, vcb_ptr, D, VB, VG))
        p_hi, p_lo = _split16(p)
        acc = acc * alpha[:, None] + tl.dot(p_hi, v_hi) + tl.dot(p_lo, v_hi) + tl.dot(p_hi, v_lo)
        m_i = m_new
    if SPLIT:
        if start < T:
            idx = heads * NCH + c
            tl.store(m_ptr + idx, m_i, mask=gm)
            tl.store(l_ptr + idx, l_i, mask=gm)
            tl.store(acc_ptr + idx[:, None] * D + d[None, :], acc, mask=gm[:, None])
    else:
        tl.store(o_ptr + heads[:, None] * D + d[None, :], acc / l_i[:, None], mask=gm[:, None])


@triton.jit
def _reduce_q_kernel(o_ptr, m_ptr, l_ptr, acc_ptr, status_ptr, NCH, CHUNK, D: tl.constexpr):
    h = tl.program_id(0)
    T = tl.load(status_ptr + 2) + 1
    nv = (T + CHUNK - 1) // CHUNK
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
    tl.store(o_ptr + h * D + d, o / L)


@triton.jit
def _rowmat_kernel(x_ptr, m_ptr, sk, sj, gate_ptr, gate_stride, y_ptr,
                   D: tl.constexpr, BK: tl.constexpr, ROT: tl.constexpr, GATE: tl.constexpr):
    """y[h, j] = sum_k x[h, k] * M[k*sk + j*sj] (if ROT, else x[h, j]), times sigmoid(gate[h, j])
    if GATE. Reads all of x[h] before writing y[h], so y may alias x."""
    h = tl.program_id(0)
    j = tl.arange(0, D)
    if ROT:
        y = tl.zeros([D], tl.float32)
        kk = tl.arange(0, BK)
        for k0 in range(0, D, BK):
            xk = tl.load(x_ptr + h * D + k0 + kk)
            mk = tl.load(m_ptr + (k0 + kk)[:, None] * sk + j[None, :] * sj)
            y += tl.sum(xk[:, None] * mk, axis=0)
    else:
        y = tl.load(x_ptr + h * D + j)
    if GATE:
        g = tl.load(gate_ptr + h * gate_stride + j)
        y = y / (1.0 + tl.exp(-g))
    tl.store(y_ptr + h * D + j, y)


# ---- host side -----------------------------------------------------------------------------------
@dataclass
class QuantAttnWorkspace:
    kv_type: str
    D: int
    R: torch.Tensor            # [D, D] fp32
    kcb: torch.Tensor          # [16] fp32 (unused entries 0; q8_0: dummy)
    vcb: torch.Tensor
    q_rot: torch.Tensor        # [H, D] fp32
    o_rot: torch.Tensor        # [H, D] fp32
    m: torch.Tensor | None = None
    l: torch.Tensor | None = None
    acc: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        ts = [self.R, self.kcb, self.vcb, self.q_rot, self.o_rot, self.m, self.l, self.acc]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def n_chunks_for(max_ctx: int, chunk: int = DEFAULT_CHUNK) -> int:
    return max(1, -(-max_ctx // chunk))


def _cb16(name: str, device) -> torch.Tensor:
    f = get_format(name)
    out = torch.zeros(16, dtype=torch.float32)
    if f.rotate:
        cb = f.codebook()
        out[:cb.numel()] = cb
    return out.to(device)


def make_workspace(kv_type: str, n_head: int, head_dim: int, max_ctx: int,
                   chunk: int = DEFAULT_CHUNK, seed: int = DEFAULT_SEED,
                   device: str | torch.device = "cpu") -> QuantAttnWorkspace:
    kn, vn = split_kv_type(kv_type)
    for n in (kn, vn):
        get_format(n).check_dim(head_dim)
    z = lambda *s: torch.zeros(*s, dtype=torch.float32, device=device)  # noqa: E731
    ws = QuantAttnWorkspace(kv_type, head_dim,
                            rotation_matrix(head_dim, seed, torch.float32, device).contiguous(),
                            _cb16(kn, device), _cb16(vn, device), z(n_head, head_dim),
                            z(n_head, head_dim))
    if max_ctx > SINGLE_PASS_MAX:
        nch = n_chunks_for(max_ctx, chunk)
        ws.m, ws.l, ws.acc = z(n_head, nch), z(n_head, nch), z(n_head, nch, head_dim)
    return ws


def attn_decode_q(q, kcache, vcache, qg, out, status, ws: QuantAttnWorkspace, n_chunks: int = 1,
                  chunk: int = DEFAULT_CHUNK, BT: int = 32):
    """q [H, D] fp32 (normed, roped), byte caches [cap, Hkv, row_bytes] of ws.kv_type, qg [H, 2D]
    -> out [H, D] = softmax(q K^T / sqrt(D)) V * sigmoid(gate) over T = status[2] + 1 rows.
    n_chunks = 1: single pass (meant for T <= SINGLE_PASS_MAX); else split-K over `chunk`-row
    chunks (needs ws made with max_ctx > SINGLE_PASS_MAX and n_chunks <= its chunk count)."""
    H, D = q.shape
    Hkv = kcache.shape[1]
    kf, vf = (get_format(n) for n in split_kv_type(ws.kv_type))
    assert kcache.shape[2] == kf.row_bytes(D) and vcache.shape[2] == vf.row_bytes(D)
    grp = H // Hkv
    GP = max(16, triton.next_power_of_2(grp))
    scale = LOG2E / math.sqrt(D)
    BK = min(16, D)
    _rowmat_kernel[(H,)](q, ws.R, 1, D, q, 0, ws.q_rot, D=D, BK=BK, ROT=kf.rotate, GATE=False,
                         num_warps=4)
    meta = dict(D=D, GRP=grp, GP=GP, BT=BT, KB=kf.bits, KG=kf.group, VB=vf.bits, VG=vf.group,
                num_warps=4)
    if n_chunks <= 1:
        o = ws.o_rot
        _attn_q_kernel[(Hkv, 1)](ws.q_rot, kcache, vcache, ws.kcb, ws.vcb, o, o, o, o, status,
                                 Hkv, 1, 1 << 30, scale, SPLIT=False, **meta)
    else:
        NCH = ws.m.shape[1]
        assert n_chunks <= NCH
        _attn_q_kernel[(Hkv, n_chunks)](ws.q_rot, kcache, vcache, ws.kcb, ws.vcb, ws.o_rot, ws.m,
                                        ws.l, ws.acc, status, Hkv, NCH, chunk, scale, SPLIT=True,
                                        **meta)
        _reduce_q_kernel[(H,)](ws.o_rot, ws.m, ws.l, ws.acc, status, NCH, chunk, D=D,
                               num_warps=2)
    qg2 = qg.reshape(H, 2 * D)
    _rowmat_kernel[(H,)](ws.o_rot, ws.R, D, 1, qg2[:, D:], qg2.stride(0), out, D=D, BK=BK,
                         ROT=vf.rotate, GATE=True, num_warps=4)
    return out


def attn_decode_q_ref(q, kcache, vcache, qg, out, status, ws: QuantAttnWorkspace,
                      n_chunks: int = 1, chunk: int = DEFAULT_CHUNK, BT: int = 32):
    """Torch version of `attn_decode_q` (same buffers, computing in fp32 on q's device)."""
    from tightfit.kvquant.reference import dequantize
    H, D = q.shape
    T = int(status[2]) + 1
    kf, vf = (get_format(n) for n in split_kv_type(ws.kv_type))
    K = dequantize(kcache[:T], kf, D, rotated=True, dtype=torch.float32)
    V = dequantize(vcache[:T], vf, D, rotated=True, dtype=torch.float32)
    qr = q @ ws.R.T if kf.rotate else q
    Hkv = K.shape[1]
    s = torch.einsum("jgd,tjd->jgt", qr.reshape(Hkv, H // Hkv, D), K) / math.sqrt(D)
    o = torch.einsum("jgt,tjd->jgd", torch.softmax(s, -1), V).reshape(H, D)
    if vf.rotate:
        o = o @ ws.R
    gate = qg.reshape(H, 2 * D)[:, D:]
    out.copy_(o * torch.sigmoid(gate))
    return out
