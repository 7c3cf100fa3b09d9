"""Full attention over a block of new tokens and the cached prefix (spec/qwen35.md §3.5, §3.6).

* `qk_prep_block`: per token and head, RMSNorm of q (the first D of each head's [q | gate] in the
  attn_q output) and of k, partial NEOX RoPE from the executor's float64-derived cos/sin tables
  (rows p0..p0+n-1), q -> fp32, and K/V rounded to fp16 into cache rows p0..p0+n-1 (beyond the
  committed length until the commit, tightfit/runtime/gpu_state.py).
* `attn_prefill`: softmax(q K^T / sqrt(D)) V over cache rows 0..p0+n-1 with the causal rule
  "token p0+i sees rows <= p0+i", grouped GQA (query head h reads KV head h // (H/Hkv)).
  torch scaled_dot_product_attention: with an empty prefix `is_causal=True` (flash kernel, GQA
  native); after a prefix torch's lower-right causal bias (no materialised mask; K/V expanded to
  H heads for the call: H * (p0+n) * D * 2 * 2 bytes, 400 MiB at 32K depth for the 27B), or, on
  an old torch, an explicit boolean mask [n, p0+n]. On the GPU q is cast to fp16
  like the cache (K/V are exact fp16 there; softmax and accumulation in fp32 inside the kernel);
  on the CPU it runs in float32.

`prefill_attention` is what BatchForward calls: on CUDA the bounded Triton flash kernel
(tightfit/kernels/attn_prefill_flash.py: the cache read in place, quantized caches decoded tile by
tile into a fixed fp16 scratch, nothing depth-sized) after a prefix and for every quantized cache;
`attn_prefill` (torch flash SDPA, is_causal=True, GQA native, O(n) memory) for the first chunk of
an f16 cache. TIGHTFIT_PREFILL_ATTN=sdpa restores the torch paths everywhere (this module's
`attn_prefill`, kvquant.reference.attention_quant for quantized caches; the expanded K/V above
are NOT priced by the planner), =flash takes the Triton kernel for the first chunk too (and on
the CPU under TRITON_INTERPRET=1, for the tests); the CPU otherwise keeps the torch paths.

`attn_prefill_ref` is the float64 oracle (the einsum form of ReferenceModel._attention).
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype) * w


def _rope(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [n, heads, D]; c, s [n, half]."""
    half = c.shape[-1]
    c, s = c[:, None, :], s[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, rest], dim=-1)


def qk_prep_block(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qn_w: torch.Tensor,
                  kn_w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  kcache: torch.Tensor, vcache: torch.Tensor, p0: int, eps: float,
                  kv_type: str | None = None) -> torch.Tensor:
    """qg [n, H*2D], k/v [n, Hkv*D] fp32 -> q [n, H, D] fp32; writes cache rows p0..p0+n-1
    (quantize-on-write, kvquant.reference.write_rows, for byte caches of a quantized kv_type)."""
    n = qg.shape[0]
    Hkv = kcache.shape[1]
    D = qn_w.shape[-1]
    H = qg.shape[1] // (2 * D)
    c, s = cos[p0:p0 + n], sin[p0:p0 + n]
    q = _rope(_rms(qg.view(n, H, 2 * D)[..., :D], qn_w, eps), c, s)
    kk = _rope(_rms(k.view(n, Hkv, D), kn_w, eps), c, s)
    if kv_type:
        from tightfit.kvquant.reference import write_rows
        write_rows(kcache, vcache, p0, kk, v.view(n, Hkv, D), kv_type)
        return q
    kcache[p0:p0 + n] = kk.to(kcache.dtype)
    vcache[p0:p0 + n] = v.view(n, Hkv, D).to(vcache.dtype)
    return q


try:
    from torch.nn.attention.bias import causal_lower_right as _causal_lower_right
except Exception:  # noqa: BLE001 - older torch: explicit boolean mask
    _causal_lower_right = None


def _sdpa(q, K, V, mask, causal: bool, grp: int):
    try:
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, is_causal=causal,
                                              enable_gqa=grp > 1)
    except TypeError:      # older torch: no enable_gqa
        if grp > 1:
            K = K.repeat_interleave(grp, dim=1)
            V = V.repeat_interleave(grp, dim=1)
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, is_causal=causal)


def attn_prefill(q: torch.Tensor, kcache: torch.Tensor, vcache: torch.Tensor, p0: int) -> torch.Tensor:
    """q [n, H, D] (normed, roped) -> o [n, H, D] fp32 over cache rows 0..p0+n-1 (causal)."""
    n, H, D = q.shape
    T = p0 + n
    Hkv = kcache.shape[1]
    cuda = q.device.type == "cuda"
    dt = kcache.dtype if cuda else torch.float32
    qh = q.to(dt).transpose(0, 1)[None]                                # [1, H, n, D]
    K = kcache[:T].to(dt).transpose(0, 1)[None]                        # [1, Hkv, T, D]
    V = vcache[:T].to(dt).transpose(0, 1)[None]
    grp = H // Hkv
    if p0 == 0:
        o = _sdpa(qh, K, V, None, True, grp)
    else:
        o = None
        if _causal_lower_right is not None:
            # lower-right causal bias: row i sees keys <= (T - n) + i = p0 + i; flash /
            # memory-efficient kernels without a materialised mask. K/V expanded to H heads
            # (the bias path does not take enable_gqa everywhere).
            Ke = K.repeat_interleave(grp, dim=1) if grp > 1 else K
            Ve = V.repeat_interleave(grp, dim=1) if grp > 1 else V
            try:
                o = F.scaled_dot_product_attention(qh, Ke, Ve,
                                                   attn_mask=_causal_lower_right(n, T))
            except (RuntimeError, TypeError, NotImplementedError):
                o = None
        if o is None:
            rows = torch.arange(n, device=q.device)[:, None] + p0
            mask = torch.arange(T, device=q.device)[None, :] <= rows     # [n, T]
            o = _sdpa(qh, K, V, mask, False, grp)
    return o[0].transpose(0, 1).to(torch.float32)                       # [n, H, D]


def prefill_attn_mode(device: torch.device, p0: int, kv_type: str | None) -> str:
    """'flash' (attn_prefill_flash), 'sdpa' (attn_prefill) or 'quant_torch' (attention_quant)
    for a block at p0 on `device`; see the module docstring (TIGHTFIT_PREFILL_ATTN)."""
    want = os.environ.get("TIGHTFIT_PREFILL_ATTN", "auto").strip().lower()
    torch_path = "quant_torch" if kv_type else "sdpa"
    if want == "sdpa":
        return torch_path
    if torch.device(device).type != "cuda":
        return "flash" if (want == "flash" and os.environ.get("TRITON_INTERPRET") == "1") \
            else torch_path
    if want == "flash" or p0 > 0 or kv_type:
        return "flash"
    return "sdpa"


def prefill_attention(q: torch.Tensor, kcache: torch.Tensor, vcache: torch.Tensor, p0: int,
                      kv_type: str | None = None) -> torch.Tensor:
    """Causal attention of the block q [n, H, D] over cache rows 0..p0+n-1 -> [n, H, D] fp32
    (before the output gate), by `prefill_attn_mode`."""
    mode = prefill_attn_mode(q.device, p0, kv_type)
    if mode == "flash":
        from tightfit.kernels.attn_prefill_flash import flash_attn_prefill
        return flash_attn_prefill(q, kcache, vcache, p0, kv_type)
    if mode == "quant_torch":
        from tightfit.kvquant.reference import attention_quant
        return attention_quant(q, kcache, vcache, p0, kv_type)
    return attn_prefill(q, kcache, vcache, p0)


def attn_prefill_ref(q: torch.Tensor, kcache: torch.Tensor, vcache: torch.Tensor, p0: int,
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    n, H, D = q.shape
    T = p0 + n
    Kc, Vc = kcache[:T].to(dtype), vcache[:T].to(dtype)
    Hkv = Kc.shape[1]
    grp = H // Hkv
    qv = q.to(dtype).reshape(n, Hkv, grp, D)
    scores = torch.einsum("njgd,tjd->jgnt", qv, Kc) / math.sqrt(D)
    causal = torch.arange(T)[None, :] <= (p0 + torch.arange(n))[:, None]
    scores = scores.masked_fill(~causal.to(scores.device), float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("jgnt,tjd->njgd", p, Vc).reshape(n, H, D)


def kv_expand_bytes(n_head: int, head_dim: int, n: int, depth: int) -> int:
    """Temporary K/V expanded to all query heads (fp16) for a chunk after a prefix: the
    TIGHTFIT_PREFILL_ATTN=sdpa fallback only (not priced by the planner)."""
    return 2 * n_head * (depth + n) * head_dim * 2 if depth else 0
