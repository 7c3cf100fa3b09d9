"""Decode-step kernels for a block of M <= 16 consecutive tokens (the speculative verify block),
reading the position and the active recurrent bank on the device so the block can be captured as
a CUDA graph (tightfit.model.verify_graph). Every buffer is caller-given; nothing is allocated.

* `conv_block`: the causal depthwise conv of the Gated DeltaNet over M new pre-conv rows u[t]
  (window: the K-1 rows of the *active* bank, then u[0..M-1]), SiLU -> y [M, C]. Writes no
  state: the conv state after block token j-1 is cut from (bank rows, u rows) at commit time.
* `gdn_block`: the delta rule token after token from the active bank's SSM state (the same math
  as tightfit.kernels.gdn.gdn_step, one program per (V head, value block) keeping its state slice
  in registers across the M tokens); the state after the last token goes to the *staging* bank,
  and for each earlier token t what a partial commit needs to rebuild the state after it (the
  ReplaySSM idea): the head's normalised key k, delta = beta (v - S k) and the decay, 2S + 1
  floats per head and token where the state itself is S * S. o [M, Hv, S].
* `qk_prep_block`: q/k RMSNorm + partial NEOX RoPE at positions status[2] + t, K/V rounded to
  fp16 into cache rows status[2] + t (beyond the committed length: rejected rows are abandoned).
* `attn_block`: M queries at positions p0 + t (p0 = status[2]) against the cache rows
  0..p0+t (the block's own rows included: causal inside the block), GQA, sigmoid gate. One
  program per (KV head, tile of 16 (token, group head) query rows, chunk of keys); K/V are read
  once per tile. Single pass, or split-K over chunks of `chunk` rows with a reduce (m, l, acc
  workspace [M*H, NCH(, D)]), as attn_decode. Scores and P.V use the fp16 hi+lo split of
  attn_decode (~fp32 accuracy on exact fp16 K/V).
* `commit_block`: keep j of the M tokens: staging bank <- conv window after token j-1 and the
  SSM state after token j-1, replayed from the active bank (the state before the block) with j
  rank-one updates, rounded as the block kernel rounds them (one multiply, one fma per token).
  With the default tiling (BV 8, one warp: every thread holds the same reduction results) that
  is bitwise the block's own state (tests/test_block_step_replay.py, on the H200 too); with the
  value block over 4 warps (TIGHTFIT_GDN_BLOCK=32,4) one H200 run found a 1-ulp difference in
  one case (cause not established). j = M: the block already left the state there. Then flip the
  bank and advance the device position by j (unless the sticky non-finite flag is set). Not
  captured (j comes from the host after acceptance); three small launches, no sync. The replay
  reads and writes the state once, as copying a stored per-position state did, and the block no
  longer writes (M - 1) states per layer: the 27B's verify region for 5 tokens is 27 MiB instead
  of 0.58 GiB (session 19).
* `argmax_rows`: each row's argmax and the status words, one small buffer the host reads once.

Each has a torch reference `*_ref` with the same signature (the CPU path and the tests' oracle).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tightfit.kernels.attn_decode import LOG2E, _norm_rope, attention_f64
from tightfit.plan.buffers import ARGMAX_BLOCK


# ---- causal conv over the block -----------------------------------------------------------------
@triton.jit
def _conv_block_kernel(u_ptr, conv_ptr, w_ptr, y_ptr, status_ptr, slot, C, bank_stride, US,
                       KM1: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t = tl.program_id(1)                   # one block token per program: the tokens are independent
    m = c < C
    a = tl.load(status_ptr)
    src = conv_ptr + a.to(tl.int64) * bank_stride + slot * (KM1 * C)
    acc = tl.zeros([BLOCK], tl.float32)
    for jj in tl.static_range(0, KM1 + 1):
        r = c * 0 + (t - KM1 + jj)              # window row: < 0 from the bank, else u[r]
        hs = tl.load(src + (KM1 + r) * C + c, mask=m & (r < 0), other=0.0)
        hu = tl.load(u_ptr + r * US + c, mask=m & (r >= 0), other=0.0)
        acc += tl.where(r < 0, hs, hu) * tl.load(w_ptr + c * (KM1 + 1) + jj, mask=m, other=0.0)
    tl.store(y_ptr + t * C + c, acc / (1.0 + tl.exp(-acc)), mask=m)


def conv_block(u: torch.Tensor, conv_buf: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
               status: torch.Tensor, slot: int) -> torch.Tensor:
    """u [M, C] new pre-conv rows (unit columns, any row stride: the first C columns of a merged
    qkv + gate product's rows), conv_buf [2, n_rec, K-1, C], w [C, K] -> y [M, C]. Grid
    (channel blocks, tokens): the 27B's 10240 channels made 20 programs of 512 looping over the
    tokens, 6.8 us at M = 5 against 2.8 at M = 1 (session 18, verify_profile)."""
    M, C = u.shape
    if u.stride(-1) != 1:
        raise ValueError("conv_block: u needs unit column stride")
    km1 = conv_buf.shape[2]
    BLOCK = 256
    _conv_block_kernel[(triton.cdiv(C, BLOCK), M)](u, conv_buf, w, y, status, slot, C,
                                                   conv_buf.stride(0), u.stride(0), KM1=km1,
                                                   BLOCK=BLOCK, num_warps=2)
    return y


def conv_block_ref(u, conv_buf, w, y, status, slot):
    a = int(status[0])
    M = u.shape[0]
    K = w.shape[1]
    hist = torch.cat([conv_buf[a, slot], u], 0)                          # [K-1+M, C]
    for t in range(M):
        y[t].copy_(F.silu((hist[t:t + K].t() * w).sum(-1)))
    return y


# ---- gated delta rule, token after token ----------------------------------------------------------
@triton.jit
def _gdn_token_inputs(yb, alpha_p, beta_p, kh, h, KD, i, j, dtb, S: tl.constexpr):
    """Raw loads of one token's q, k (key head kh), v (value block j), gate inputs."""
    q = tl.load(yb + kh * S + i)
    k = tl.load(yb + KD + kh * S + i)
    v = tl.load(yb + 2 * KD + h * S + j)
    x = tl.load(alpha_p) + dtb
    b = tl.load(beta_p)
    return q, k, v, x, b


@triton.jit
def _gdn_token_prep(q, k, x, b, ssma, eps, q_scale):
    """The token's normalised q, k, its decay and beta: nothing here depends on the state."""
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + eps) * q_scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + eps)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    decay = tl.exp(sp * ssma)
    beta = 1.0 / (1.0 + tl.exp(-b))
    return q, k, decay, beta


# M (and the replay's j) not specialised: Triton compiles an int argument equal to 1 as a
# constant, and the replay test compares a block of M tokens with one of j = 1 token, which should
# run the same code (the one-ulp mismatch session 19 met on the H200 had another cause: it stayed
# with this and went with the one-warp tiling, see gdn_config)
@triton.jit(do_not_specialize=["M"])
def _gdn_block_kernel(y_ptr, alpha_ptr, beta_ptr, dtb_ptr, ssma_ptr, ssm_ptr, rin_ptr, o_ptr,
                      status_ptr, slot, bank_stride, rin_stride, M, CY, CG, Hv, Hk, eps,
                      q_scale, S: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)
    jb = tl.program_id(1)
    kh = h % Hk
    KD = Hk * S
    i = tl.arange(0, S)
    j = jb * BV + tl.arange(0, BV)
    a = tl.load(status_ptr).to(tl.int64)
    off = slot * (Hv * S * S) + h * (S * S) + i[:, None] * S + j[None, :]
    st = tl.load(ssm_ptr + a * bank_stride + off)
    rb = rin_ptr + h * (2 * S + 1)
    lead = (i * 0 + jb) == 0              # the head's first value block stores k and the decay
    dtb = tl.load(dtb_ptr + h)
    ssma = tl.load(ssma_ptr + h)
    q1, k1, v, x1, b1 = _gdn_token_inputs(y_ptr, alpha_ptr + h, beta_ptr + h, kh, h, KD, i, j,
                                          dtb, S)
    q, k, decay, beta = _gdn_token_prep(q1, k1, x1, b1, ssma, eps, q_scale)
    for t in range(0, M):
        # the next token's loads go out before this token's update (software pipelining by
        # hand): the update chain no longer waits an L2 round trip per token (session 23: the
        # kernel took 8.8 us at M = 5 against 4.4 at M = 1). The last token reloads itself.
        tn = tl.minimum(t + 1, M - 1)
        q1, k1, v1, x1, b1 = _gdn_token_inputs(y_ptr + tn * CY, alpha_ptr + tn * CG + h,
                                               beta_ptr + tn * CG + h, kh, h, KD, i, j, dtb, S)
        st = st * decay
        kv = tl.sum(st * k[:, None], axis=0)
        delta = beta * (v - kv)
        # one explicit fma: _commit_ssm_replay_kernel repeats this update from the stored inputs
        # and must round exactly as here (left to the compiler, either product may be fused)
        st = tl.fma(k[:, None], delta[None, :], st)
        if t < M - 1:
            # what a partial commit replays: k (the normalised key of this head), delta, decay
            rt = rb + t * rin_stride
            tl.store(rt + i, k, mask=lead)
            tl.store(rt + S + j, delta)
            tl.store(rt + 2 * S + i, tl.zeros([S], tl.float32) + decay, mask=lead & (i == 0))
        else:
            tl.store(ssm_ptr + (1 - a) * bank_stride + off, st)
        o = tl.sum(st * q[:, None], axis=0)
        tl.store(o_ptr + t * (Hv * S) + h * S + j, o)
        q, k, decay, beta = _gdn_token_prep(q1, k1, x1, b1, ssma, eps, q_scale)
        v = v1


def gdn_config() -> tuple[int, int]:
    """(value block BV, warps) of the block kernel: TIGHTFIT_GDN_BLOCK="BV,warps" (bench A/B).
    Default 8, 1: one warp per 8 value columns, so the two reductions over the key axis per token
    stay inside a warp. The 27B's shapes on the H200 (bench/gdn_block.py, session 19), us per layer
    at M = 5 / 1: 8,1 10.6 / 5.2; 16,2 11.2 / 4.7; 32,4 (until then) 11.8 / 4.9; 64,4 12.7 / 5.2;
    32,8 16.3 / 5.9. The block is M >= 2 but for rare one-token verifies."""
    import os
    v = os.environ.get("TIGHTFIT_GDN_BLOCK", "").strip()
    if not v:
        return 8, 1
    try:
        bv, nw = (int(x) for x in v.split(","))
    except ValueError:
        raise ValueError(f"TIGHTFIT_GDN_BLOCK={v!r}: expected 'BV,warps', e.g. '32,4'") from None
    return bv, nw


def gdn_block(y, alpha, beta, dt_bias, ssm_a, ssm_buf, rin, o, status, slot, Hk, eps, BV=None,
              num_warps=None):
    """y [M, conv_dim], alpha/beta raw [M, Hv] (one row stride for both: the halves of one
    [M, 2 Hv] merged product, or two contiguous buffers), ssm_buf [2, n_rec, Hv, S, S], rin
    [>= M-1, Hv, 2S+1] (this layer's replay inputs, unit inner strides) -> o [M, Hv, S]."""
    _, _, Hv, S, _ = ssm_buf.shape
    M = y.shape[0]
    if (alpha.stride(-1) != 1 or beta.stride(-1) != 1
            or (M > 1 and alpha.stride(0) != beta.stride(0))):
        raise ValueError("gdn_block: alpha and beta need unit inner strides and one row stride")
    if BV is None or num_warps is None:
        bv, nw = gdn_config()
        BV = min(S, bv) if BV is None else BV
        num_warps = nw if num_warps is None else num_warps
    _gdn_block_kernel[(Hv, S // BV)](y, alpha, beta, dt_bias, ssm_a, ssm_buf, rin, o, status,
                                     slot, ssm_buf.stride(0), rin.stride(0), M, y.stride(0),
                                     alpha.stride(0), Hv, Hk, float(eps), float(S) ** -0.5,
                                     S=S, BV=BV, num_warps=num_warps)
    return o


def gdn_block_ref(y, alpha, beta, dt_bias, ssm_a, ssm_buf, rin, o, status, slot, Hk, eps, BV=None,
                  num_warps=None):
    _, _, Hv, S, _ = ssm_buf.shape
    M = y.shape[0]
    a = int(status[0])
    kd = Hk * S
    r = Hv // Hk
    st = ssm_buf[a, slot].clone()
    for t in range(M):
        q = y[t, :kd].reshape(Hk, S)
        k = y[t, kd:2 * kd].reshape(Hk, S)
        v = y[t, 2 * kd:].reshape(Hv, S)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + eps) * (S ** -0.5)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + eps)
        qh, kh = q.repeat(r, 1), k.repeat(r, 1)
        g = F.softplus(alpha[t].reshape(-1) + dt_bias) * ssm_a
        b = torch.sigmoid(beta[t].reshape(-1))
        decay = torch.exp(g)
        st = st * decay[:, None, None]
        kv = torch.einsum("hi,hij->hj", kh, st)
        delta = b[:, None] * (v - kv)
        st = st + kh[:, :, None] * delta[:, None, :]
        if t < M - 1:
            rin[t, :, :S].copy_(kh)
            rin[t, :, S:2 * S].copy_(delta)
            rin[t, :, 2 * S].copy_(decay)
        else:
            ssm_buf[1 - a, slot].copy_(st)
        o[t].copy_(torch.einsum("hi,hij->hj", qh, st))
    return o


# ---- q/k norm + RoPE + KV rows --------------------------------------------------------------------
@triton.jit
def _qk_prep_block_kernel(qg_ptr, k_ptr, v_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr,
                          qout_ptr, status_ptr, H, Hkv, eps, D: tl.constexpr, HALF: tl.constexpr):
    t = tl.program_id(0)
    p = tl.program_id(1)
    pos = (tl.load(status_ptr + 2) + t).to(tl.int64)
    d = tl.arange(0, D)
    if p < H:
        out = _norm_rope(qg_ptr + t * (H * 2 * D) + p * (2 * D), qn_ptr, cos_ptr, sin_ptr, pos,
                         eps, D, HALF)
        tl.store(qout_ptr + (t * H + p) * D + d, out)
    else:
        jh = p - H
        out = _norm_rope(k_ptr + t * (Hkv * D) + jh * D, kn_ptr, cos_ptr, sin_ptr, pos, eps, D,
                         HALF)
        row = (pos * Hkv + jh) * D
        tl.store(kc_ptr + row + d, out.to(tl.float16))
        tl.store(vc_ptr + row + d, tl.load(v_ptr + t * (Hkv * D) + jh * D + d).to(tl.float16))


def qk_prep_block(qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status, eps):
    """qg [M, H*2D], k/v [M, Hkv*D] fp32; caches [cap, Hkv, D] fp16; q_out [M, H, D] fp32."""
    M, H, D = q_out.shape
    Hkv = kcache.shape[1]
    _qk_prep_block_kernel[(M, H + Hkv)](qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out,
                                        status, H, Hkv, float(eps), D=D, HALF=cos.shape[1],
                                        num_warps=2)
    return q_out


def qk_prep_block_ref(qg, k, v, qn_w, kn_w, cos, sin, kcache, vcache, q_out, status, eps):
    from tightfit.kernels.attn_decode import _rms, _rope_rows
    M, H, D = q_out.shape
    Hkv = kcache.shape[1]
    p0 = int(status[2])
    for t in range(M):
        c, s = cos[p0 + t], sin[p0 + t]
        q_out[t].copy_(_rope_rows(_rms(qg[t].reshape(H, 2 * D)[:, :D], qn_w, eps), c, s))
        kcache[p0 + t].copy_(_rope_rows(_rms(k[t].reshape(Hkv, D), kn_w, eps), c, s)
                             .to(kcache.dtype))
        vcache[p0 + t].copy_(v[t].reshape(Hkv, D).to(vcache.dtype))
    return q_out


# ---- attention of M queries ----------------------------------------------------------------------
QR = 16          # query rows (token, group head) per program: the tensor-core dot's minimum


@triton.jit
def _attn_block_kernel(q_ptr, kc_ptr, vc_ptr, qg_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, status_ptr,
                       Hkv, H, M, NCH, CHUNK, qk_scale,
                       D: tl.constexpr, GRP: tl.constexpr, QR: tl.constexpr, BT: tl.constexpr,
                       SPLIT: tl.constexpr):
    kvh = tl.program_id(0)
    tile = tl.program_id(1)
    c = tl.program_id(2)
    p0 = tl.load(status_ptr + 2)
    r = tile * QR + tl.arange(0, QR)
    t = r // GRP
    rm = t < M
    head = kvh * GRP + r % GRP
    qrow = t * H + head
    Tr = p0 + t + 1                     # keys visible to each query row (causal)
    Tmax = p0 + M
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, Tmax)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + qrow[:, None] * D + d[None, :], mask=rm[:, None], other=0.0) * qk_scale
    q_hi = q.to(tl.float16)
    q_lo = (q - q_hi.to(tl.float32)).to(tl.float16)
    m_i = tl.full([QR], float("-inf"), tl.float32)
    l_i = tl.zeros([QR], tl.float32)
    acc = tl.zeros([QR, D], tl.float32)
    tt = tl.arange(0, BT)
    for t0 in range(start, end, BT):
        kt_i = t0 + tt
        km = kt_i < end
        row = (kt_i.to(tl.int64) * Hkv + kvh) * D
        kk = tl.load(kc_ptr + row[:, None] + d[None, :], mask=km[:, None], other=0.0)
        kt = tl.trans(kk)
        s = tl.dot(q_hi, kt) + tl.dot(q_lo, kt)
        ok = km[None, :] & (kt_i[None, :] < Tr[:, None])
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # rows with no key yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vv = tl.load(vc_ptr + row[:, None] + d[None, :], mask=km[:, None], other=0.0)
        p_hi = p.to(tl.float16)
        p_lo = (p - p_hi.to(tl.float32)).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p_hi, vv) + tl.dot(p_lo, vv)
        m_i = m_new
    if SPLIT:
        if start < Tmax:
            idx = qrow * NCH + c
            tl.store(m_ptr + idx, m_i, mask=rm)
            tl.store(l_ptr + idx, l_i, mask=rm)
            tl.store(acc_ptr + idx[:, None] * D + d[None, :], acc, mask=rm[:, None])
    else:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        gate = tl.load(qg_ptr + (t * H + head)[:, None] * (2 * D) + D + d[None, :],
                       mask=rm[:, None], other=0.0)
        o = o / (1.0 + tl.exp(-gate))
        tl.store(out_ptr + qrow[:, None] * D + d[None, :], o, mask=rm[:, None])


@triton.jit
def _reduce_block_kernel(qg_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, status_ptr, H, NCH, CHUNK,
                         D: tl.constexpr):
    row = tl.program_id(0)                # t * H + h
    t = row // H
    T = tl.load(status_ptr + 2) + t + 1
    nv = (T + CHUNK - 1) // CHUNK
    d = tl.arange(0, D)
    M = float("-inf")
    for c in range(0, nv):
        M = tl.maximum(M, tl.load(m_ptr + row * NCH + c))
    L = 0.0
    o = tl.zeros([D], tl.float32)
    for c in range(0, nv):
        w = tl.exp2(tl.load(m_ptr + row * NCH + c) - M)
        L += tl.load(l_ptr + row * NCH + c) * w
        o += tl.load(acc_ptr + (row * NCH + c) * D + d) * w
    gate = tl.load(qg_ptr + row * (2 * D) + D + d)
    tl.store(out_ptr + row * D + d, o / L / (1.0 + tl.exp(-gate)))


def attn_block(q, kcache, vcache, qg, out, status, ws=None, n_chunks: int = 1,
               chunk: int = 512, BT: int = 32):
    """q [M, H, D] fp32 (normed, roped), caches [cap, Hkv, D] fp16, qg [M, H*2D] -> out [M, H, D]
    over rows 0..status[2]+t for query t. n_chunks=1: single pass; else split-K with
    ws = (m, l [>= M*H, NCH], acc [>= M*H, NCH, D])."""
    M, H, D = q.shape
    Hkv = kcache.shape[1]
    grp = H // Hkv
    tiles = triton.cdiv(M * grp, QR)
    scale = LOG2E / math.sqrt(D)
    if n_chunks <= 1:
        _attn_block_kernel[(Hkv, tiles, 1)](q, kcache, vcache, qg, out, out, out, out, status,
                                            Hkv, H, M, 1, 1 << 30, scale, D=D, GRP=grp, QR=QR,
                                            BT=BT, SPLIT=False, num_warps=4)
        return out
    m, l, acc = ws
    NCH = m.shape[1]
    assert NCH >= n_chunks and m.shape[0] >= M * H
    _attn_block_kernel[(Hkv, tiles, n_chunks)](q, kcache, vcache, qg, out, m, l, acc, status,
                                               Hkv, H, M, NCH, chunk, scale, D=D, GRP=grp, QR=QR,
                                               BT=BT, SPLIT=True, num_warps=4)
    _reduce_block_kernel[(M * H,)](qg, out, m, l, acc, status, H, NCH, chunk, D=D, num_warps=2)
    return out


def attn_block_ref(q, kcache, vcache, qg, out, status, ws=None, n_chunks: int = 1,
                   chunk: int = 512, BT: int = 32):
    M, H, D = q.shape
    p0 = int(status[2])
    for t in range(M):
        gate = qg[t].reshape(H, 2 * D)[:, D:]
        T = p0 + t + 1
        out[t].copy_(attention_f64(q[t], kcache[:T], vcache[:T], gate, dtype=q.dtype))
    return out


# ---- keep j of M tokens ----------------------------------------------------------------------------
@triton.jit(do_not_specialize=["j"])
def _commit_conv_kernel(conv_ptr, rows_ptr, status_ptr, j, C, bank_stride, rows_slot_stride,
                        RS, KM1: tl.constexpr, BLOCK: tl.constexpr):
    slot = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < C
    a = tl.load(status_ptr).to(tl.int64)
    src = conv_ptr + a * bank_stride + slot * (KM1 * C)
    dst = conv_ptr + (1 - a) * bank_stride + slot * (KM1 * C)
    ub = rows_ptr + slot.to(tl.int64) * rows_slot_stride
    for rr in tl.static_range(0, KM1):
        r = c * 0 + (j - KM1 + rr)        # window row after token j-1 (banks a != 1-a: no alias)
        hs = tl.load(src + (KM1 + r) * C + c, mask=m & (r < 0), other=0.0)
        hu = tl.load(ub + r * RS + c, mask=m & (r >= 0), other=0.0)
        tl.store(dst + rr * C + c, tl.where(r < 0, hs, hu), mask=m)


@triton.jit(do_not_specialize=["j"])
def _commit_ssm_replay_kernel(ssm_ptr, rin_ptr, status_ptr, j, bank_stride, rin_slot_stride,
                              rin_t_stride, Hv, S: tl.constexpr, BI: tl.constexpr):
    """The state after block token j-1 from the active bank's (the state before the block) and
    the block's replay inputs: the same two roundings per token as _gdn_block_kernel."""
    slot = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.program_id(2) * BI + tl.arange(0, BI)
    c = tl.arange(0, S)
    a = tl.load(status_ptr).to(tl.int64)
    off = slot.to(tl.int64) * (Hv * S * S) + h * (S * S) + i[:, None] * S + c[None, :]
    st = tl.load(ssm_ptr + a * bank_stride + off)
    rb = rin_ptr + slot.to(tl.int64) * rin_slot_stride + h * (2 * S + 1)
    for t in range(0, j):
        rt = rb + t * rin_t_stride
        k = tl.load(rt + i)
        delta = tl.load(rt + S + c)
        st = st * tl.load(rt + 2 * S)
        st = tl.fma(k[:, None], delta[None, :], st)
    tl.store(ssm_ptr + (1 - a) * bank_stride + off, st)


@triton.jit(do_not_specialize=["n_tok"])
def _advance_kernel(status_ptr, n_tok):
    active = tl.load(status_ptr + 0)
    flag = tl.load(status_ptr + 1)
    pos = tl.load(status_ptr + 2)
    ok = flag == 0
    tl.store(status_ptr + 0, tl.where(ok, 1 - active, active))
    tl.store(status_ptr + 2, tl.where(ok, pos + n_tok, pos))


def commit_block(conv_buf, ssm_buf, conv_rows, ssm_in, status, j: int, M: int,
                 advance_status=None) -> None:
    """Keep block tokens 0..j-1: conv_rows [n_rec, >= M, C] (each layer's u rows; unit columns,
    any row stride), ssm_in
    [n_rec, >= M-1, Hv, 2S+1] (each layer's replay inputs: k, delta, decay after token t).
    advance_status: where the bank flip and the position go (default `status`; a scratch copy
    for a warm-up that must leave the state's position alone). j is not specialised by any of the
    three kernels, so one compilation serves every j (verify_graph captures one graph per j)."""
    if advance_status is None:
        advance_status = status
    n_rec, km1, C = conv_buf.shape[1:]
    if conv_rows.stride(-1) != 1:
        raise ValueError("commit_block: conv_rows needs unit column stride")
    BLOCK = 512
    _commit_conv_kernel[(n_rec, triton.cdiv(C, BLOCK))](conv_buf, conv_rows, status, int(j), C,
                                                         conv_buf.stride(0), conv_rows.stride(0),
                                                         conv_rows.stride(1), KM1=km1,
                                                         BLOCK=BLOCK, num_warps=4)
    if j < M:
        Hv, S = ssm_buf.shape[2], ssm_buf.shape[3]
        BI = min(S, 32)
        _commit_ssm_replay_kernel[(n_rec, Hv, S // BI)](
            ssm_buf, ssm_in, status, int(j), ssm_buf.stride(0), ssm_in.stride(0),
            ssm_in.stride(1), Hv, S=S, BI=BI, num_warps=4)
    _advance_kernel[(1,)](advance_status, int(j))


def commit_block_ref(conv_buf, ssm_buf, conv_rows, ssm_in, status, j: int, M: int) -> None:
    a = int(status[0])
    km1 = conv_buf.shape[2]
    S = ssm_buf.shape[3]
    for s in range(conv_buf.shape[1]):
        hist = torch.cat([conv_buf[a, s], conv_rows[s, :M]], 0)
        conv_buf[1 - a, s].copy_(hist[j:j + km1])
        if j < M:
            st = ssm_buf[a, s].clone()
            for t in range(j):          # the block's own update (gdn_block_ref), replayed
                r = ssm_in[s, t]
                st = st * r[:, 2 * S][:, None, None]
                st = st + r[:, :S][:, :, None] * r[:, S:2 * S][:, None, :]
            ssm_buf[1 - a, s].copy_(st)
    if int(status[1]) == 0:
        status[0] = 1 - a
        status[2] += int(j)


# ---- each row's argmax and the words the host reads after the block ---------------------------
def argmax_parts(n_vocab: int) -> int:
    """First-stage programs per row (ARGMAX_BLOCK logits each: the 27B's 248,320 make 61)."""
    return -(-int(n_vocab) // ARGMAX_BLOCK)


@triton.jit
def _argmax_rows_stage1(x_ptr, V, val_ptr, idx_ptr, NB, BLOCK: tl.constexpr):
    """Program (b, r): the max of row r's logits [b*BLOCK, (b+1)*BLOCK) and its first index. The
    one-token step's argmax (executor._argmax_feed) runs it on its one row."""
    b = tl.program_id(0)
    r = tl.program_id(1)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + r.to(tl.int64) * V + offs, mask=offs < V, other=float("-inf"))
    m = tl.max(v, axis=0)
    i = tl.min(tl.where(v == m, offs, V), axis=0)
    tl.store(val_ptr + r * NB + b, m)
    tl.store(idx_ptr + r * NB + b, i)


@triton.jit
def _argmax_rows_stage2(val_ptr, idx_ptr, NB, V, out_ptr, vstat_ptr, sstat_ptr, M,
                        NBP: tl.constexpr):
    """out[r] = the first index of row r's max; program 0 also copies the block's non-finite flag
    and the state's status words 1, 2 (its sticky flag, its position) to out[M .. M+2]."""
    r = tl.program_id(0)
    offs = tl.arange(0, NBP)
    v = tl.load(val_ptr + r * NB + offs, mask=offs < NB, other=float("-inf"))
    i = tl.load(idx_ptr + r * NB + offs, mask=offs < NB, other=V)
    m = tl.max(v, axis=0)
    tl.store(out_ptr + r, tl.min(tl.where(v == m, i, V), axis=0).to(tl.int64))
    if r == 0:
        tl.store(out_ptr + M, tl.load(vstat_ptr + 1).to(tl.int64))
        tl.store(out_ptr + M + 1, tl.load(sstat_ptr + 1).to(tl.int64))
        tl.store(out_ptr + M + 2, tl.load(sstat_ptr + 2).to(tl.int64))


def argmax_rows(logits, val, idx, out, vstatus, sstatus) -> None:
    """out [>= M + 3] int64 <- each row's argmax of logits [M, V] (first index of the max, as
    torch.argmax), then vstatus[1], sstatus[1], sstatus[2]: everything the host needs after a
    greedy verify block in ONE small read (val / idx [>= M * argmax_parts(V)] partials)."""
    M, V = logits.shape
    nb = argmax_parts(V)
    _argmax_rows_stage1[(nb, M)](logits, V, val, idx, nb, BLOCK=ARGMAX_BLOCK, num_warps=4)
    _argmax_rows_stage2[(M,)](val, idx, nb, V, out, vstatus, sstatus, M,
                              NBP=triton.next_power_of_2(nb), num_warps=1)


def argmax_rows_ref(logits, val, idx, out, vstatus, sstatus) -> None:
    M = logits.shape[0]
    out[:M].copy_(torch.argmax(logits, dim=-1))
    out[M] = int(vstatus[1])
    out[M + 1] = int(sstatus[1])
    out[M + 2] = int(sstatus[2])


__all__ = ["argmax_rows", "argmax_rows_ref", "argmax_parts", "conv_block", "conv_block_ref",
           "gdn_block", "gdn_block_ref", "gdn_config", "qk_prep_block", "qk_prep_block_ref",
           "attn_block", "attn_block_ref", "commit_block", "commit_block_ref", "QR"]
