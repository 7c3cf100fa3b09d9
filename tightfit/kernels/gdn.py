"""Gated DeltaNet decode step for one token (spec/qwen35.md §3.4), on the double-banked state.

Two kernels (the GEMVs for attn_qkv / attn_gate / ssm_alpha / ssm_beta run before, the gated
RMSNorm and ssm_out after):

* `conv_step`: the causal depthwise conv over the K-1 stored rows plus the new row u, SiLU.
  Reads the conv state of the *active* bank and writes the shifted window (raw pre-conv rows,
  oldest first) into the *staging* bank. Grid: conv_dim / BLOCK programs.
* `gdn_step`: per (V head h, block of BV value columns): L2-normalises q and k of K head
  h mod Hk (q also times S^-1/2), g = ssm_a * softplus(alpha + dt_bias), beta = sigmoid(beta_raw),
  then the delta rule on the [S(key), BV(value)] slice of the fp32 state:
  S *= exp(g); kv = S^T k; S += k (beta (v - kv))^T; o = S^T q (the updated state).
  Reads the active bank, writes the staging bank. Grid: (Hv, S / BV).

The active bank index is read on the device from `status[0]` (tightfit/runtime/gpu_state.py), so
a captured graph needs no host input to pick the bank. Buffers:
conv_buf [2, n_rec, K-1, conv_dim] fp32, ssm_buf [2, n_rec, Hv, S, S] fp32 ([key, value]).

`conv_step_ref` / `gdn_step_ref` are the slow torch references with the same signature; they
are also the executor's CPU path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import pdl


@triton.jit
def _conv_step_kernel(u_ptr, conv_ptr, w_ptr, y_ptr, status_ptr, slot, C, bank_stride,
                      KM1: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = c < C
    if PDL:      # one wave (20 programs at the 27B conv_dim): the next kernel may launch now
        gdc_wait()
        gdc_launch_dependents()
    a = tl.load(status_ptr)
    src = conv_ptr + a.to(tl.int64) * bank_stride + slot * (KM1 * C)
    dst = conv_ptr + (1 - a).to(tl.int64) * bank_stride + slot * (KM1 * C)
    u = tl.load(u_ptr + c, mask=m, other=0.0)
    # w is [C, K] (numpy order of ggml ne {K, C}); tap j multiplies window row j (oldest first)
    acc = u * tl.load(w_ptr + c * (KM1 + 1) + KM1, mask=m, other=0.0)
    prev = tl.load(src + c, mask=m, other=0.0)
    acc += prev * tl.load(w_ptr + c * (KM1 + 1), mask=m, other=0.0)
    for j in tl.static_range(1, KM1):
        row = tl.load(src + j * C + c, mask=m, other=0.0)
        acc += row * tl.load(w_ptr + c * (KM1 + 1) + j, mask=m, other=0.0)
        tl.store(dst + (j - 1) * C + c, row, mask=m)
    tl.store(dst + (KM1 - 1) * C + c, u, mask=m)
    tl.store(y_ptr + c, acc / (1.0 + tl.exp(-acc)), mask=m)


def conv_step(u: torch.Tensor, conv_buf: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
              status: torch.Tensor, slot: int) -> torch.Tensor:
    """u [conv_dim] new pre-conv row, w [conv_dim, K] -> y [conv_dim] = silu(conv)."""
    _, _, km1, C = conv_buf.shape
    BLOCK = 512
    on = pdl.enabled(u.device)
    _conv_step_kernel[(triton.cdiv(C, BLOCK),)](u, conv_buf, w, y, status, slot, C,
                                                conv_buf.stride(0), KM1=km1, BLOCK=BLOCK,
                                                PDL=on, launch_pdl=on, num_warps=4)
    return y


def conv_step_ref(u: torch.Tensor, conv_buf: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
                  status: torch.Tensor, slot: int) -> torch.Tensor:
    a = int(status[0])
    hist = torch.cat([conv_buf[a, slot], u.reshape(1, -1)], dim=0)        # [K, C]
    y.copy_(F.silu((hist.t() * w).sum(-1)))
    conv_buf[1 - a, slot].copy_(hist[1:])
    return y


@triton.jit
def _gdn_step_kernel(y_ptr, alpha_ptr, beta_ptr, dtb_ptr, ssma_ptr, ssm_ptr, o_ptr, status_ptr,
                     slot, bank_stride, Hv, Hk, eps, q_scale,
                     S: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr = False):
    h = tl.program_id(0)
    jb = tl.program_id(1)
    kh = h % Hk
    KD = Hk * S
    i = tl.arange(0, S)                      # key index
    j = jb * BV + tl.arange(0, BV)           # value index
    if PDL:      # 48 x 4 programs of 4 warps: resident at once on 132 SMs
        gdc_wait()
        gdc_launch_dependents()
    q = tl.load(y_ptr + kh * S + i)
    k = tl.load(y_ptr + KD + kh * S + i)
    v = tl.load(y_ptr + 2 * KD + h * S + j)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + eps) * q_scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + eps)
    x = tl.load(alpha_ptr + h) + tl.load(dtb_ptr + h)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    decay = tl.exp(sp * tl.load(ssma_ptr + h))
    beta = 1.0 / (1.0 + tl.exp(-tl.load(beta_ptr + h)))
    a = tl.load(status_ptr)
    off = slot * (Hv * S * S) + h * (S * S) + i[:, None] * S + j[None, :]
    st = tl.load(ssm_ptr + a.to(tl.int64) * bank_stride + off) * decay
    kv = tl.sum(st * k[:, None], axis=0)                 # [BV]
    delta = beta * (v - kv)
    st = st + k[:, None] * delta[None, :]
    tl.store(ssm_ptr + (1 - a).to(tl.int64) * bank_stride + off, st)
    o = tl.sum(st * q[:, None], axis=0)
    tl.store(o_ptr + h * S + j, o)


def gdn_step(y: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, dt_bias: torch.Tensor,
             ssm_a: torch.Tensor, ssm_buf: torch.Tensor, o: torch.Tensor, status: torch.Tensor,
             slot: int, Hk: int, eps: float, BV: int | None = None) -> torch.Tensor:
    """y [conv_dim] (q | k | v after conv+SiLU), alpha/beta raw [Hv] -> o [Hv, S]."""
    _, _, Hv, S, _ = ssm_buf.shape
    if BV is None:
        BV = min(S, 32)
    on = pdl.enabled(y.device)
    _gdn_step_kernel[(Hv, S // BV)](y, alpha, beta, dt_bias, ssm_a, ssm_buf, o, status, slot,
                                    ssm_buf.stride(0), Hv, Hk, float(eps), float(S) ** -0.5,
                                    S=S, BV=BV, PDL=on, launch_pdl=on, num_warps=4)
    return o


def gdn_step_ref(y: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, dt_bias: torch.Tensor,
                 ssm_a: torch.Tensor, ssm_buf: torch.Tensor, o: torch.Tensor, status: torch.Tensor,
                 slot: int, Hk: int, eps: float, BV: int | None = None) -> torch.Tensor:
    _, _, Hv, S, _ = ssm_buf.shape
    a = int(status[0])
    kd = Hk * S
    q = y[:kd].reshape(Hk, S)
    k = y[kd:2 * kd].reshape(Hk, S)
    v = y[2 * kd:].reshape(Hv, S)
    q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + eps) * (S ** -0.5)
    k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + eps)
    r = Hv // Hk
    qh, kh = q.repeat(r, 1), k.repeat(r, 1)                         # V head h <- K head h mod Hk
    g = F.softplus(alpha.reshape(-1) + dt_bias) * ssm_a
    b = torch.sigmoid(beta.reshape(-1))
    st = ssm_buf[a, slot] * torch.exp(g)[:, None, None]
    kv = torch.einsum("hi,hij->hj", kh, st)
    delta = b[:, None] * (v - kv)
    st = st + kh[:, :, None] * delta[:, None, :]
    ssm_buf[1 - a, slot].copy_(st)
    o.copy_(torch.einsum("hi,hij->hj", qh, st))
    return o
