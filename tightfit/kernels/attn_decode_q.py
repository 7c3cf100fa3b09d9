"""Full-attention decode for one token reading a QUANTIZED KV cache directly (formats:
tightfit/kvquant/formats.py; q8_0, tq2/tq3/tq4, tq3_128/tq4_128, K and V formats independent).

Caches are `uint8 [cap, Hkv, row_bytes]` (one byte row per token and KV head, written by
tightfit.kvquant.reference.write_rows). Same buffers and conventions as attn_decode.py: q [H, D]
fp32 already normed + roped, qg [H, 2D] with the output gate in the second half of each head,
T = status[2] + 1 rows, grouped GQA (query head h reads KV head h // (H/Hkv)).

Steps (spec quant-formats §6.4, "keep the codebook domain rotated"):
  1. `_qrot_kernel`: q_rot = R q, grid (H, D / qbn), each program the full D-long dots of its
     qbn outputs in one tile (only if the K format rotates; else the attention reads q itself;
     skipped too with q_rotated=True: the decode step's kv_write_q.qk_prep_q(rotate_q=True)
     writes R q already);
  2. `_attn_q_kernel`, one program per (KV head, chunk) holding the whole query group (padded to
     16 rows for tl.dot): per tile of BT rows the raw planes are read as [BT, D/SUB] words (one
     wide load per plane, the next tile's words prefetched before the current one is decoded);
     each of the SUB sub-tiles (elements SUB*j + r) is decoded to C[idx] * block scale (q8_0:
     int8 * d), rounded once to fp16, and the sub-tiles are interleaved back with register-only
     tl.join + reshape into an fp16 [BT, D] operand. Scores: q (fp16 hi + lo, two dots) . K^T;
     V: p (fp16 hi + lo) . V, fp32 accumulation, online softmax in the rotated domain. Only the
     K/V values are rounded (to fp16, as an FP16 cache rounds them): ~1e-4 .. 5e-4 of max |out|
     vs float64 on the same codes (tests/test_kvquant_kernel.py states the bound).
     - single pass (n_chunks = 1): writes o_rot = acc / l;
     - split-K (n_chunks > 1): the rows per program are computed on the device from T
       (`_chunk_rows`), partial (max, denom, acc) to the workspace.
     The CUDA C++ kernel of attn_decode_q_cuda replaces it when usable (same buffers).
  3. `_merge_out_kernel`, grid (H, D / obn): merges the valid split-K chunks of its head (safe
     max / denominator merge; single pass: reads o_rot) and writes its obn columns of
     out = (R^T o_rot) * sigmoid(gate) (rotation only if the V format rotates).
     XCFG msplit=1 (split-K, rotating V): two launches instead, "merge" (the same kernel with
     ROT=False GATE=False: grid (H, D / mbn), each program merges only its columns into o_rot,
     so the partials are read once per head, not D / obn times) and "out" (SPLIT=False:
     (R^T o_rot) * sigmoid(gate)).
So 2-3 launches (1-2 on the step path with q_rotated), each a one-round-trip grid of 100-200
programs. With TIGHTFIT_PDL=1 (sm_90,
tightfit/kernels/pdl.py) the Triton kernels launch with programmatic dependent launch: R is read
before `gdc_wait`, q / partials / status / gate after it. TIGHTFIT_ATTNQ_EXTRAS=old brings back
the former launches for device A/B: `_rowmat_kernel` (q_rot, grid (H,), D/16 serial steps),
attention, `_reduce_q_kernel` (merge, grid (H,)), `_rowmat_kernel` (un-rotation + gate), no PDL;
measured at 32K on the H200 those three cost ~45 us per layer around a 45 us attention kernel.
TIGHTFIT_ATTNQ_XCFG tunes the new kernels' tiles (XCFG).
R is the [D, D] float32 rotation matrix (D2 H D1 / sqrt(D)); step 1 reads row tiles R[j, :],
step 3 column tiles R[:, j] (dense products; with PDL the merge reads its tile before its wait, so
the L2 reads overlap the attention kernel. The decode step's q rotation is done in registers by
kv_write_q instead (tightfit.kernels.rht): there a dense R streamed from L2 in 16 serial tiles
cost ~20 us per layer, session 8).

Workspace (`QuantAttnWorkspace`): R (D*D*4 B), two codebooks (16 floats each), q_rot and o_rot
(H*D*4 B each) and, for split-K, m, l [H, n_chunks] + acc [H, n_chunks, D] fp32, the same
H * n_chunks * (D + 2) * 4 bytes as attn_decode.py's split-K.

`attn_decode_q_ref` is the torch version (same signature); the float64 oracle is
tightfit.kvquant.reference.attention_quant_f64 (dequantizes everything to the original basis).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import attn_decode_q_cuda as C
from tightfit.kernels import pdl
from tightfit.kvquant.formats import DEFAULT_SEED, get_format, rotation_matrix, split_kv_type

SINGLE_PASS_MAX = 1024
DEFAULT_CHUNK = 512
MIN_CHUNK_ROWS = 128        # split-K: fewest rows a program takes when T spreads thin
ATTN_BT = 32                # rows per tile of the attention kernel
ATTN_WARPS = 4
# Software-pipelining depth of the attention kernel. MUST stay 1: with Triton's default (3) the
# pipeliner turns the codebook gathers `tl.load(cb_ptr + idx)` (their indices come from the
# prefetched, loop-carried words) into per-element 4-byte cp.async (LDGSTS) staged through
# 16 x 2 x 4 KiB of shared memory: 162 KiB per program under Triton 3.6 -> ONE 4-warp program per
# SM, 128 LDGSTS + 16 commit groups + ~40 barriers per tile (measured 0.41 ms per wave of 64
# programs; tq ~15x FP16). The raw words are already prefetched one tile ahead by hand.
ATTN_STAGES = 1
LOG2E = 1.4426950408889634


@triton.jit
def _load_raw(c_ptr, rowb, tm, j, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
              SUB: tl.constexpr):
    """Raw planes of BT byte rows (byte offsets `rowb` [BT], valid where tm) as [BT, D/SUB]
    words: word j holds elements SUB*j .. SUB*j+SUB-1 (q8_0: 4 int8 in an int32; tq4: 8 nibbles
    in an int32; tq3/tq2: 8 low 2-bit fields in a uint16, + tq3's high bits in a byte), and the
    fp16 block scale of those elements (block (SUB*j) // G) as fp32."""
    m2 = tm[:, None]
    base = c_ptr + rowb[:, None]
    # Rows are 2-byte aligned always (fp16 scales), 4-byte aligned only when their byte count is:
    # tq4_128 at D = 128 has 66-byte rows, where an int32 load would fault (misaligned address).
    RB4: tl.constexpr = (D * BITS // 8 + 2 * (D // G)) % 4 == 0
    if (BITS == 8 or BITS == 4) and RB4:
        w = tl.load(base.to(tl.pointer_type(tl.int32)) + j[None, :], mask=m2, other=0)
    elif BITS == 8 or BITS == 4:
        p16 = base.to(tl.pointer_type(tl.uint16)) + 2 * j[None, :]
        w = tl.load(p16, mask=m2, other=0).to(tl.int32) | \
            (tl.load(p16 + 1, mask=m2, other=0).to(tl.int32) << 16)
    else:
        w = tl.load(base.to(tl.pointer_type(tl.uint16)) + j[None, :], mask=m2,
                    other=0).to(tl.int32)
    if BITS == 3:
        h = tl.load(base + (D // 4) + j[None, :], mask=m2, other=0).to(tl.int32)
    else:
        h = w
    CB: tl.constexpr = D * BITS // 8
    sp = base.to(tl.pointer_type(tl.uint16)) + (CB // 2) + (j // (G // SUB))[None, :]
    s = tl.load(sp, mask=m2, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    return w, h, s


@triton.jit
def _val(w, h, s, cb_ptr, r: tl.constexpr, BITS: tl.constexpr):
    """fp16 values of sub-tile r (elements SUB*j + r): C[idx] * scale (q8_0: int8 * d), the
    product rounded once to fp16."""
    if BITS == 8:
        v = ((w << (24 - 8 * r)) >> 24).to(tl.float32)
    else:
        if BITS == 4:
            idx = (w >> (4 * r)) & 15
        else:
            idx = (w >> (2 * r)) & 3
            if BITS == 3:
                idx = idx | (((h >> r) & 1) << 2)
        v = tl.load(cb_ptr + idx)
    return (v * s).to(tl.float16)


@triton.jit
def _decode_tile(w, h, s, cb_ptr, BT: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr):
    """fp16 [BT, D] values (rotated domain for codebook formats) from `_load_raw`'s words:
    the sub-tiles are interleaved back into element order with register-only joins."""
    if BITS == 8:
        a0 = tl.join(_val(w, h, s, cb_ptr, 0, BITS), _val(w, h, s, cb_ptr, 2, BITS))
        a1 = tl.join(_val(w, h, s, cb_ptr, 1, BITS), _val(w, h, s, cb_ptr, 3, BITS))
        out = tl.reshape(tl.join(a0, a1), [BT, D])
    else:
        a0 = tl.join(_val(w, h, s, cb_ptr, 0, BITS), _val(w, h, s, cb_ptr, 4, BITS))
        a1 = tl.join(_val(w, h, s, cb_ptr, 1, BITS), _val(w, h, s, cb_ptr, 5, BITS))
        a2 = tl.join(_val(w, h, s, cb_ptr, 2, BITS), _val(w, h, s, cb_ptr, 6, BITS))
        a3 = tl.join(_val(w, h, s, cb_ptr, 3, BITS), _val(w, h, s, cb_ptr, 7, BITS))
        out = tl.reshape(tl.join(tl.join(a0, a2), tl.join(a1, a3)), [BT, D])
    return out


@triton.jit
def _chunk_rows(T, NL, CHUNK, BT: tl.constexpr, MINR: tl.constexpr):
    """Rows per split-K program: T spread evenly over the NL launched programs (a multiple of
    BT), at least min(CHUNK, MINR). Computed on the device from T, so every position keeps all
    programs busy; NL * rows >= T always."""
    ch = (T + NL - 1) // NL
    ch = ((ch + BT - 1) // BT) * BT
    return tl.maximum(ch, tl.minimum(CHUNK, MINR))


@triton.jit
def _attn_q_kernel(q_ptr, kc_ptr, vc_ptr, kcb_ptr, vcb_ptr, o_ptr, m_ptr, l_ptr, acc_ptr,
                   status_ptr, Hkv, NCH, CHUNK, qk_scale,
                   D: tl.constexpr, GRP: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr,
                   KB: tl.constexpr, KG: tl.constexpr, VB: tl.constexpr, VG: tl.constexpr,
                   SPLIT: tl.constexpr, MINR: tl.constexpr = 128, PDL: tl.constexpr = False):
    kvh = tl.program_id(0)
    c = tl.program_id(1)
    if PDL:                 # q_rot, status and the caches come from earlier kernels
        gdc_wait()
    T = tl.load(status_ptr + 2) + 1
    if SPLIT:
        ch = _chunk_rows(T, tl.num_programs(1), CHUNK, BT, MINR)
        start = c * ch
        end = tl.minimum(start + ch, T)
    else:
        start = 0
        end = T
    RBK: tl.constexpr = (D // KG) * (KG * KB // 8 + 2)
    RBV: tl.constexpr = (D // VG) * (VG * VB // 8 + 2)
    KSUB: tl.constexpr = 4 if KB == 8 else 8
    VSUB: tl.constexpr = 4 if VB == 8 else 8
    gi = tl.arange(0, GP)
    gm = gi < GRP
    heads = kvh * GRP + gi
    d = tl.arange(0, D)
    jk = tl.arange(0, D // KSUB)
    jv = tl.arange(0, D // VSUB)
    # q in fp16 hi + lo (two dots): the scores see q exactly, only K is rounded to fp16
    q = tl.load(q_ptr + heads[:, None] * D + d[None, :], mask=gm[:, None], other=0.0) * qk_scale
    q_hi = q.to(tl.float16)
    q_lo = (q - q_hi.to(tl.float32)).to(tl.float16)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    tt = tl.arange(0, BT)
    # raw words of the first tile; each iteration prefetches the next tile's before decoding
    t = start + tt
    r = t.to(tl.int64) * Hkv + kvh
    kw, kh, ks = _load_raw(kc_ptr, r * RBK, t < end, jk, D, KB, KG, KSUB)
    vw, vh, vs = _load_raw(vc_ptr, r * RBV, t < end, jv, D, VB, VG, VSUB)
    for t0 in range(start, end, BT):
        tm = (t0 + tt) < end
        tn = t0 + BT + tt
        rn = tn.to(tl.int64) * Hkv + kvh
        kw2, kh2, ks2 = _load_raw(kc_ptr, rn * RBK, tn < end, jk, D, KB, KG, KSUB)
        vw2, vh2, vs2 = _load_raw(vc_ptr, rn * RBV, tn < end, jv, D, VB, VG, VSUB)
        kt = tl.trans(_decode_tile(kw, kh, ks, kcb_ptr, BT, D, KB))           # [D, BT] fp16
        s = tl.dot(q_hi, kt) + tl.dot(q_lo, kt)
        s = tl.where(tm[None, :], s, float("-inf"))            # [GP, BT], log2 units
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _decode_tile(vw, vh, vs, vcb_ptr, BT, D, VB)                      # [BT, D] fp16
        p_hi = p.to(tl.float16)
        p_lo = (p - p_hi.to(tl.float32)).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p_hi, v) + tl.dot(p_lo, v)
        m_i = m_new
        kw, kh, ks = kw2, kh2, ks2
        vw, vh, vs = vw2, vh2, vs2
    if SPLIT:
        if start < T:
            idx = heads * NCH + c
            tl.store(m_ptr + idx, m_i, mask=gm)
            tl.store(l_ptr + idx, l_i, mask=gm)
            tl.store(acc_ptr + idx[:, None] * D + d[None, :], acc, mask=gm[:, None])
    else:
        tl.store(o_ptr + heads[:, None] * D + d[None, :], acc / l_i[:, None], mask=gm[:, None])


@triton.jit
def _reduce_q_kernel(o_ptr, m_ptr, l_ptr, acc_ptr, status_ptr, NCH, NL, CHUNK,
                     D: tl.constexpr, BT: tl.constexpr, MINR: tl.constexpr, RC: tl.constexpr):
    """Safe max/denominator merge of the valid chunks of head h, RC chunks per step."""
    h = tl.program_id(0)
    T = tl.load(status_ptr + 2) + 1
    ch = _chunk_rows(T, NL, CHUNK, BT, MINR)
    nv = (T + ch - 1) // ch
    d = tl.arange(0, D)
    cc = tl.arange(0, RC)
    M = tl.full([RC], float("-inf"), tl.float32)
    L = tl.zeros([RC], tl.float32)
    O = tl.zeros([RC, D], tl.float32)
    for c0 in range(0, nv, RC):
        c = c0 + cc
        cm = c < nv
        mc = tl.load(m_ptr + h * NCH + c, mask=cm, other=float("-inf"))
        lc = tl.load(l_ptr + h * NCH + c, mask=cm, other=0.0)
        ac = tl.load(acc_ptr + (h * NCH + c)[:, None] * D + d[None, :], mask=cm[:, None],
                     other=0.0)
        Mn = tl.maximum(M, mc)
        Ms = tl.where(Mn == float("-inf"), 0.0, Mn)
        a = tl.exp2(M - Ms)
        b = tl.exp2(mc - Ms)
        L = L * a + lc * b
        O = O * a[:, None] + ac * b[:, None]
        M = Mn
    Mx = tl.max(M, axis=0)
    w = tl.exp2(M - Mx)
    o = tl.sum(O * w[:, None], axis=0)
    tl.store(o_ptr + h * D + d, o / tl.sum(L * w, axis=0))


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


@triton.jit
def _qrot_kernel(q_ptr, r_ptr, y_ptr, D: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr):
    """y[h, j] = sum_k R[j, k] q[h, k] for the BN outputs j of program (h, jb): the whole
    D-long dot of each output in one [BN, D] tile (one dependent load of q after the wait,
    instead of the old kernel's D / BK serial steps over 24 programs)."""
    h = tl.program_id(0)
    j = tl.program_id(1) * BN + tl.arange(0, BN)
    k = tl.arange(0, D)
    r = tl.load(r_ptr + j[:, None] * D + k[None, :])       # R is immutable: read before the wait
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    x = tl.load(q_ptr + h * D + k)
    tl.store(y_ptr + h * D + j, tl.sum(r * x[None, :], axis=1))


@triton.jit
def _merge_out_kernel(o_ptr, m_ptr, l_ptr, acc_ptr, status_ptr, r_ptr, gate_ptr, gate_stride,
                      out_ptr, NCH, NL, CHUNK, D: tl.constexpr, BN: tl.constexpr,
                      RC: tl.constexpr, BT: tl.constexpr, MINR: tl.constexpr,
                      SPLIT: tl.constexpr, ROT: tl.constexpr, PDL: tl.constexpr,
                      GATE: tl.constexpr = True):
    """out[h, j] = (o_rot[h] R)[j] * sigmoid(gate[h, j]) for the BN outputs j of program (h, jb),
    o_rot merged here from the split-K partials (SPLIT) or read (single pass). With ROT every
    program needs all D columns of o_rot (merges the whole [nv, D] partials of its head: 64 KB
    at 32K, from L2); without it only its own BN columns. GATE=False (with ROT=False): no gate,
    out = the merged o_rot itself (the merge-only first launch of XCFG msplit=1; gate_ptr is
    not read)."""
    h = tl.program_id(0)
    j = tl.program_id(1) * BN + tl.arange(0, BN)
    if ROT:
        cols = tl.arange(0, D)
        rt = tl.load(r_ptr + cols[:, None] * D + j[None, :])        # R[k, j], before the wait
    else:
        cols = j
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    if GATE:
        g = tl.load(gate_ptr + h * gate_stride + j)   # issued early: independent of the merge
    if SPLIT:
        T = tl.load(status_ptr + 2) + 1
        ch = _chunk_rows(T, NL, CHUNK, BT, MINR)
        nv = (T + ch - 1) // ch                 # chunks holding rows (>= 1; m finite in each)
        # one pass, RC chunks per step: lane c keeps a running (max, denominator, [cols] sum)
        # of chunks c, c + RC, ...; the lanes are merged once at the end (at 32K: nv = 64, two
        # steps of RC = 32, no separate pass for the maximum)
        ca = tl.arange(0, RC)
        mv = tl.full([RC], float("-inf"), tl.float32)
        lv = tl.zeros([RC], tl.float32)
        ov = tl.zeros([RC, cols.shape[0]], tl.float32)
        for c0 in range(0, nv, RC):
            c = c0 + ca
            cv = c < nv
            mc = tl.load(m_ptr + h * NCH + c, mask=cv, other=float("-inf"))
            lc = tl.load(l_ptr + h * NCH + c, mask=cv, other=0.0)
            ac = tl.load(acc_ptr + (h * NCH + c)[:, None] * D + cols[None, :], mask=cv[:, None],
                         other=0.0)
            mn = tl.maximum(mv, mc)
            ms = tl.where(mn == float("-inf"), 0.0, mn)       # empty lane: keep 0, not NaN
            a = tl.exp2(mv - ms)
            b = tl.exp2(mc - ms)
            lv = lv * a + lc * b
            ov = ov * a[:, None] + ac * b[:, None]
            mv = mn
        w = tl.exp2(mv - tl.max(mv, axis=0))        # lane 0 always holds chunk 0: finite max
        o = tl.sum(ov * w[:, None], axis=0) / tl.sum(lv * w, axis=0)
    else:
        o = tl.load(o_ptr + h * D + cols)
    if ROT:
        y = tl.sum(o[:, None] * rt, axis=0)
    else:
        y = o
    if GATE:
        y = y / (1.0 + tl.exp(-g))
    tl.store(out_ptr + h * D + j, y)


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


EXTRAS_ENV = "TIGHTFIT_ATTNQ_EXTRAS"    # "old": the former rowmat / reduce / rowmat launches
XCFG_ENV = "TIGHTFIT_ATTNQ_XCFG"        # "key=val,..." over XCFG (device sweeps)
# qbn / qnw: outputs and warps per program of _qrot_kernel (grid H x D/qbn); obn / onw: the same
# for _merge_out_kernel; rc: chunks per step of its merge ([rc, D] partial tile).
# msplit=1 (split-K with a rotating V format only): two launches instead of one, "merge"
# (_merge_out_kernel GATE=False ROT=False, grid H x D/mbn, mnw warps: each program merges only
# its mbn columns, so the [nv, D] partials are read once per head instead of D/obn times) into
# o_rot, then "out" (_merge_out_kernel SPLIT=False: o_rot R * sigmoid(gate), grid H x D/obn)
XCFG = dict(qbn=32, qnw=4, obn=32, onw=8, rc=32, msplit=0, mbn=64, mnw=4)


def extras_mode() -> str:
    m = os.environ.get(EXTRAS_ENV, "").strip().lower() or "new"
    if m not in ("new", "old"):
        raise ValueError(f"{EXTRAS_ENV}={m!r}: expected 'new' or 'old'")
    return m


def extras_config(D: int) -> dict:
    c = dict(XCFG)
    for kv in filter(None, os.environ.get(XCFG_ENV, "").split(",")):
        k, v = kv.split("=")
        if k.strip() not in c:
            raise ValueError(f"{XCFG_ENV}: unknown key {k.strip()!r} (have {sorted(c)})")
        c[k.strip()] = int(v)
    c["qbn"], c["obn"], c["mbn"] = min(c["qbn"], D), min(c["obn"], D), min(c["mbn"], D)
    return c


def attn_decode_q_pieces(q, kcache, vcache, qg, out, status, ws: QuantAttnWorkspace,
                         n_chunks: int = 1, chunk: int = DEFAULT_CHUNK, BT: int = ATTN_BT,
                         num_warps: int = ATTN_WARPS, num_stages: int = ATTN_STAGES,
                         backend: str | None = None, q_rotated: bool = False) -> list:
    """The launches of one `attn_decode_q` call, in order, as (name, fn) pairs: "attn" is the
    attention kernel, the others the work around it (new: "qrot" when K rotates and q is not
    q_rotated, "merge_out" or, XCFG msplit=1 with split-K and a rotating V, "merge" + "out";
    TIGHTFIT_ATTNQ_EXTRAS=old: "rowmat_q", "reduce" when split, "rowmat_out").
    bench/kv_quant.py times them alone to show where the time goes."""
    H, D = q.shape
    Hkv = kcache.shape[1]
    kf, vf = (get_format(n) for n in split_kv_type(ws.kv_type))
    assert kcache.shape[2] == kf.row_bytes(D) and vcache.shape[2] == vf.row_bytes(D)
    grp = H // Hkv
    GP = max(16, triton.next_power_of_2(grp))
    scale = LOG2E / math.sqrt(D)
    old = extras_mode() == "old"
    pk = {} if old else pdl.triton_launch_kwargs(q.device)
    P = bool(pk)
    qg2 = qg.reshape(H, 2 * D)
    split = n_chunks > 1
    NCH = ws.m.shape[1] if split else 1
    assert n_chunks <= NCH
    cfg = extras_config(D)
    pieces = []
    if q.stride() != (D, 1):
        raise ValueError(f"attn_decode_q: q must be a contiguous [H, D] fp32 tensor (the kernels "
                         f"read q[h, d] at h * D + d), got strides {tuple(q.stride())}")
    rot_q = kf.rotate and not q_rotated        # q_rotated: the caller wrote R q (qk_prep_q)
    if old:
        BK = min(16, D)
        pieces.append(("rowmat_q", lambda: _rowmat_kernel[(H,)](
            q, ws.R, 1, D, q, 0, ws.q_rot, D=D, BK=BK, ROT=rot_q, GATE=False, num_warps=4)))
        q_in = ws.q_rot
    elif rot_q:
        qbn = cfg["qbn"]
        pieces.append(("qrot", lambda: _qrot_kernel[(H, D // qbn)](
            q, ws.R, ws.q_rot, D=D, BN=qbn, PDL=P, num_warps=cfg["qnw"], **pk)))
        q_in = ws.q_rot
    else:
        q_in = q          # nothing to rotate (or done already): the attention reads q itself
    o = ws.o_rot
    m, l, acc = (ws.m, ws.l, ws.acc) if split else (o, o, o)
    if backend != "triton" and (backend == "cuda" or C.usable(q, kf, vf, Hkv)):
        # CUDA C++ kernel (attn_decode_q_cuda): same partials, rows per CTA with BT = 16
        nl = C.n_launch_for(n_chunks, NCH) if split else 1   # TIGHTFIT_ATTNQ_NL may change it
        mbt = C.TILE
        pieces.append(("attn", lambda: C.attn(
            q_in, kcache, vcache, ws.kcb, ws.vcb, o, m, l, acc, status, kf, vf, grp, NCH,
            max(1, nl), chunk if split else 1 << 30, MIN_CHUNK_ROWS, scale, split)))
    else:
        nl, mbt = n_chunks, BT
        meta = dict(D=D, GRP=grp, GP=GP, BT=BT, KB=kf.bits, KG=kf.group, VB=vf.bits, VG=vf.group,
                    MINR=MIN_CHUNK_ROWS, num_warps=num_warps, num_stages=num_stages)
        pieces.append(("attn", lambda: _attn_q_kernel[(Hkv, max(1, n_chunks))](
            q_in, kcache, vcache, ws.kcb, ws.vcb, o, m, l, acc, status, Hkv, NCH,
            chunk if split else 1 << 30, scale, SPLIT=split, PDL=P, **meta, **pk)))
    if old:
        if split:
            pieces.append(("reduce", lambda: _reduce_q_kernel[(H,)](
                o, m, l, acc, status, NCH, nl, chunk, D=D, BT=mbt, MINR=MIN_CHUNK_ROWS, RC=16,
                num_warps=4)))
        pieces.append(("rowmat_out", lambda: _rowmat_kernel[(H,)](
            o, ws.R, D, 1, qg2[:, D:], qg2.stride(0), out, D=D, BK=BK, ROT=vf.rotate, GATE=True,
            num_warps=4)))
    elif split and vf.rotate and cfg["msplit"]:
        obn, mbn = cfg["obn"], cfg["mbn"]
        pieces.append(("merge", lambda: _merge_out_kernel[(H, D // mbn)](
            o, m, l, acc, status, ws.R, qg2[:, D:], qg2.stride(0), o, NCH, nl, chunk, D=D,
            BN=mbn, RC=cfg["rc"], BT=mbt, MINR=MIN_CHUNK_ROWS, SPLIT=True, ROT=False, PDL=P,
            GATE=False, num_warps=cfg["mnw"], **pk)))
        pieces.append(("out", lambda: _merge_out_kernel[(H, D // obn)](
            o, m, l, acc, status, ws.R, qg2[:, D:], qg2.stride(0), out, NCH, nl, chunk, D=D,
            BN=obn, RC=cfg["rc"], BT=mbt, MINR=MIN_CHUNK_ROWS, SPLIT=False, ROT=True, PDL=P,
            GATE=True, num_warps=cfg["onw"], **pk)))
    else:
        obn = cfg["obn"]
        pieces.append(("merge_out", lambda: _merge_out_kernel[(H, D // obn)](
            o, m, l, acc, status, ws.R, qg2[:, D:], qg2.stride(0), out, NCH, nl, chunk, D=D,
            BN=obn, RC=cfg["rc"], BT=mbt, MINR=MIN_CHUNK_ROWS, SPLIT=split,
            ROT=vf.rotate, PDL=P, num_warps=cfg["onw"], **pk)))
    return pieces


def attn_decode_q(q, kcache, vcache, qg, out, status, ws: QuantAttnWorkspace, n_chunks: int = 1,
                  chunk: int = DEFAULT_CHUNK, BT: int = ATTN_BT, num_warps: int = ATTN_WARPS,
                  num_stages: int = ATTN_STAGES, backend: str | None = None,
                  q_rotated: bool = False):
    """q [H, D] fp32 (normed, roped), byte caches [cap, Hkv, row_bytes] of ws.kv_type, qg [H, 2D]
    -> out [H, D] = softmax(q K^T / sqrt(D)) V * sigmoid(gate) over T = status[2] + 1 rows.
    n_chunks = 1: single pass (meant for T <= SINGLE_PASS_MAX); else split-K over n_chunks
    programs per KV head (needs ws made with max_ctx > SINGLE_PASS_MAX and n_chunks <= its chunk
    count). The rows per program are chosen on the device from T (`_chunk_rows`: T / n_chunks
    rounded up to BT, at least min(chunk, MIN_CHUNK_ROWS)), so all of T is always covered and a
    short context still spreads over all programs.
    backend: None (auto: the CUDA C++ kernel of attn_decode_q_cuda when `usable`, else Triton),
    "triton" or "cuda" (BT / num_warps / num_stages are the Triton kernel's).
    q_rotated: q is already R q (kv_write_q.qk_prep_q(..., rotate_q=True) with the same R, for a
    rotating K format): the q rotation launch is skipped. False (default): q in the original
    basis, rotated here when the K format rotates.
    Launches: see `attn_decode_q_pieces` (2-3 kernels; TIGHTFIT_ATTNQ_EXTRAS=old: 3-4)."""
    for _, fn in attn_decode_q_pieces(q, kcache, vcache, qg, out, status, ws, n_chunks, chunk,
                                      BT, num_warps, num_stages, backend, q_rotated):
        fn()
    return out


def attn_decode_q_ref(q, kcache, vcache, qg, out, status, ws: QuantAttnWorkspace,
                      n_chunks: int = 1, chunk: int = DEFAULT_CHUNK, BT: int = ATTN_BT,
                      num_warps: int = ATTN_WARPS, num_stages: int = ATTN_STAGES,
                      backend: str | None = None, q_rotated: bool = False):
    """Torch version of `attn_decode_q` (same buffers, computing in fp32 on q's device)."""
    from tightfit.kvquant.reference import dequantize
    H, D = q.shape
    T = int(status[2]) + 1
    kf, vf = (get_format(n) for n in split_kv_type(ws.kv_type))
    K = dequantize(kcache[:T], kf, D, rotated=True, dtype=torch.float32)
    V = dequantize(vcache[:T], vf, D, rotated=True, dtype=torch.float32)
    qr = q @ ws.R.T if kf.rotate and not q_rotated else q
    Hkv = K.shape[1]
    s = torch.einsum("jgd,tjd->jgt", qr.reshape(Hkv, H // Hkv, D), K) / math.sqrt(D)
    o = torch.einsum("jgt,tjd->jgd", torch.softmax(s, -1), V).reshape(H, D)
    if vf.rotate:
        o = o @ ws.R
    gate = qg.reshape(H, 2 * D)[:, D:]
    out.copy_(o * torch.sigmoid(gate))
    return out
