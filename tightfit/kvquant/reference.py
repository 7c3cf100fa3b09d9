"""Torch reference of the quantized KV formats: quantize / dequantize a block of rows, the
quantize-on-write of new K/V rows into a byte cache, the float64 attention over a quantized
cache (the oracle of tightfit/kernels/attn_decode_q.py), and the hooks that let the CPU
ReferenceModel run with a quantized cache (`kv_roundtrip`, `RoundtripKVState`).

Everything here is plain torch and runs on any device; on CUDA `quantize` is the prefill/decode
write path until a fused write kernel exists (a handful of small launches per layer and step).
"""
from __future__ import annotations

import math

import torch

from tightfit.kvquant.formats import (DEFAULT_SEED, KVQuantFormat, get_format, rotation_matrix,
                                      split_kv_type)
from tightfit.runtime.state import State

_TINY = 1e-30


# ---- code packing ------------------------------------------------------------------------------
def _pack(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """idx integer [N, D] in [0, 2^bits) -> uint8 [N, D*bits/8] (layouts in formats.py)."""
    N, D = idx.shape
    i = idx.to(torch.uint8)
    if bits == 4:
        p = i.view(N, D // 2, 2)
        return p[..., 0] | (p[..., 1] << 4)
    lo = (i & 3).view(N, D // 4, 4)
    lo = lo[..., 0] | (lo[..., 1] << 2) | (lo[..., 2] << 4) | (lo[..., 3] << 6)
    if bits == 2:
        return lo
    hi = (i >> 2).view(N, D // 8, 8)
    h = hi[..., 0]
    for j in range(1, 8):
        h = h | (hi[..., j] << j)
    return torch.cat([lo, h], -1)


def _unpack(codes: torch.Tensor, bits: int, D: int) -> torch.Tensor:
    """uint8 [N, D*bits/8] -> int64 [N, D]."""
    c = codes
    N = c.shape[0]
    if bits == 4:
        out = torch.stack([c & 15, c >> 4], -1).view(N, D)
    else:
        lo_b = c[:, :D // 4]
        out = torch.stack([(lo_b >> (2 * j)) & 3 for j in range(4)], -1).view(N, D)
        if bits == 3:
            hi_b = c[:, D // 4:]
            hi = torch.stack([(hi_b >> j) & 1 for j in range(8)], -1).view(N, D)
            out = out | (hi << 2)
    return out.to(torch.int64)


# ---- quantize / dequantize -------------------------------------------------------------------
GAIN_SEARCH = 5        # candidate gains tried per block by the encoder (1: plain projection)
GAIN_SPAN = 0.2        # candidates g/sqrt(G) * (1 - span .. 1 + span)


def _encode_blocks(yb: torch.Tensor, g: torch.Tensor, cb: torch.Tensor, G: int,
                   search: int) -> torch.Tensor:
    """Code indices [N, nb, G] of rotated blocks yb with norms g. search = 1: nearest level of
    sqrt(G) y / g (TurboQuant_mse). search > 1: a gain-shape search, the decoder is unchanged:
    for each candidate step a = g / sqrt(G) * f, f in linspace(1-span, 1+span, search), take the
    nearest levels of y / a and keep the candidate whose least-squares reconstruction
    (best scale for those codes) has the smallest error. Lowers D_mse ~14% (3 bits) to ~27%
    (4 bits) on Gaussian rows; costs `search` bucketize passes."""
    mids = (cb[1:] + cb[:-1]) * 0.5
    u = yb / (g.clamp_min(_TINY) / math.sqrt(G))
    if search <= 1:
        return torch.bucketize(u, mids)
    best_idx, best_err = None, None
    for f in torch.linspace(1 - GAIN_SPAN, 1 + GAIN_SPAN, search).tolist():
        idx = torch.bucketize(u * (1.0 / f), mids)
        c = torch.take(cb, idx)
        # |y - s c|² at the best s = <y,c>/|c|² equals |y|² - <y,c>²/|c|²: maximize <y,c>²/|c|²
        score = (yb * c).sum(-1).pow(2) / c.pow(2).sum(-1).clamp_min(_TINY)
        if best_idx is None:
            best_idx, best_err = idx, score
        else:
            better = score > best_err
            best_idx = torch.where(better[..., None], idx, best_idx)
            best_err = torch.where(better, score, best_err)
    return best_idx


def quantize(x: torch.Tensor, fmt: KVQuantFormat | str, seed: int = DEFAULT_SEED,
             scale_rule: str = "norm", search: int = GAIN_SEARCH) -> torch.Tensor:
    """Rows x [..., D] (any float dtype) -> uint8 [..., fmt.row_bytes(D)].

    scale_rule (TurboQuant formats only): "norm" (stored format: s = |y_b| / |C[idx]|, the
    reconstruction keeps the block norm) or "lsq" (s = <y_b, C[idx]> / |C[idx]|², the MSE-optimal
    scale for the chosen codes; for the quality comparison only)."""
    fmt = get_format(fmt) if isinstance(fmt, str) else fmt
    D = x.shape[-1]
    fmt.check_dim(D)
    lead = x.shape[:-1]
    xf = x.reshape(-1, D).to(torch.float32)
    N, G = xf.shape[0], fmt.group
    if fmt.rotate:
        R = rotation_matrix(D, seed, torch.float32, xf.device)
        yb = (xf @ R.T).view(N, D // G, G)
        g = yb.norm(dim=-1, keepdim=True)
        cb = fmt.codebook().to(xf.device)
        idx = _encode_blocks(yb, g, cb, G, search)
        c = torch.take(cb, idx)
        if scale_rule == "norm":
            s = g / c.norm(dim=-1, keepdim=True)
        elif scale_rule == "lsq":
            s = (yb * c).sum(-1, keepdim=True) / c.pow(2).sum(-1, keepdim=True)
        else:
            raise ValueError(f"unknown scale_rule {scale_rule!r}")
        scale = s.squeeze(-1).clamp(-65504.0, 65504.0).to(torch.float16)
        codes = _pack(idx.view(N, D), fmt.bits)
    else:
        # ggml Q8_0: d = amax/127, q = round-half-away(x / d) with the unrounded d, d stored fp16
        xb = xf.view(N, D // G, G)
        d = xb.abs().amax(-1) / 127.0
        inv = torch.where(d > 0, 1.0 / d.clamp_min(_TINY), torch.zeros_like(d))
        v = xb * inv[..., None]
        q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).clamp(-127, 127)
        scale = d.to(torch.float16)
        codes = q.to(torch.int8).view(torch.uint8).view(N, D)
    out = torch.cat([codes, scale.contiguous().view(torch.uint8).view(N, -1)], -1)
    return out.view(*lead, fmt.row_bytes(D))


def codes_and_scales(rows: torch.Tensor, fmt: KVQuantFormat, D: int,
                     dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [N, row_bytes] -> (code values [N, D/G, G]: codebook levels C[idx] (rotated domain)
    or q8_0's int8 codes, block scales [N, D/G]), both in `dtype`; value = code * scale."""
    N, G, cb_bytes = rows.shape[0], fmt.group, fmt.codes_bytes(D)
    scale = rows[:, cb_bytes:].contiguous().view(torch.float16).to(dtype)     # [N, D/G]
    if fmt.rotate:
        idx = _unpack(rows[:, :cb_bytes], fmt.bits, D)
        vals = fmt.codebook().to(dtype=dtype, device=rows.device)[idx]
    else:
        vals = rows[:, :cb_bytes].contiguous().view(torch.int8).to(dtype)
    return vals.view(N, D // G, G), scale


def dequantize(rows: torch.Tensor, fmt: KVQuantFormat | str, D: int, seed: int = DEFAULT_SEED,
               rotated: bool = False, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """uint8 [..., row_bytes] -> [..., D] in `dtype`. rotated=True returns TurboQuant rows in the
    rotated domain (what the kernel accumulates); default: back in the original basis."""
    fmt = get_format(fmt) if isinstance(fmt, str) else fmt
    lead = rows.shape[:-1]
    r = rows.reshape(-1, rows.shape[-1])
    N = r.shape[0]
    vals, scale = codes_and_scales(r, fmt, D, dtype)
    y = (vals * scale[..., None]).view(N, D)
    if fmt.rotate and not rotated:
        y = y @ rotation_matrix(D, seed, dtype, r.device)          # x_row = y_row R
    return y.view(*lead, D)


def roundtrip(x: torch.Tensor, fmt: KVQuantFormat | str, seed: int = DEFAULT_SEED,
              scale_rule: str = "norm") -> torch.Tensor:
    """dequantize(quantize(x)) in x's dtype and shape."""
    fmt = get_format(fmt) if isinstance(fmt, str) else fmt
    return dequantize(quantize(x, fmt, seed, scale_rule), fmt, x.shape[-1], seed,
                      dtype=torch.float64).to(x.dtype)


# ---- byte cache and quantize-on-write --------------------------------------------------------
def alloc_cache(cap: int, n_head_kv: int, head_dim: int, fmt: KVQuantFormat | str,
                device: str | torch.device = "cpu") -> torch.Tensor:
    fmt = get_format(fmt) if isinstance(fmt, str) else fmt
    return torch.zeros(cap, n_head_kv, fmt.row_bytes(head_dim), dtype=torch.uint8, device=device)


def write_rows(kcache: torch.Tensor, vcache: torch.Tensor, pos: int, k: torch.Tensor,
               v: torch.Tensor, kv_type: str, seed: int = DEFAULT_SEED) -> None:
    """Quantize-on-write: new K/V rows [n, Hkv, D] (after norm + RoPE for K) into rows
    pos..pos+n-1 of the byte caches [cap, Hkv, row_bytes]. Prefill calls it once per chunk and
    attention block, decode once per token."""
    kf, vf = (get_format(n) for n in split_kv_type(kv_type))
    n = k.shape[0]
    kcache[pos:pos + n] = quantize(k, kf, seed)
    vcache[pos:pos + n] = quantize(v, vf, seed)


# ---- float64 attention over a quantized cache (the kernel oracle) ------------------------------
def attention_f64(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                  gate: torch.Tensor | None = None) -> torch.Tensor:
    """q [H, D], K/V [T, Hkv, D] -> [H, D] in float64: grouped GQA (query head h reads KV head
    h // (H/Hkv)), softmax(q K^T / sqrt(D)) V, times sigmoid(gate) when given."""
    H, D = q.shape
    Hkv = K.shape[1]
    qv = q.double().reshape(Hkv, H // Hkv, D)
    s = torch.einsum("jgd,tjd->jgt", qv, K.double()) / math.sqrt(D)
    o = torch.einsum("jgt,tjd->jgd", torch.softmax(s, -1), V.double()).reshape(H, D)
    return o if gate is None else o * torch.sigmoid(gate.double())


def attention_quant_f64(q: torch.Tensor, kcache: torch.Tensor, vcache: torch.Tensor, T: int,
                        kv_type: str, gate: torch.Tensor | None = None,
                        seed: int = DEFAULT_SEED) -> torch.Tensor:
    """Attention of q [H, D] over rows 0..T-1 of byte caches, everything dequantized to float64
    in the ORIGINAL basis (so it checks the kernel's rotated-domain shortcut as well)."""
    D = q.shape[1]
    kf, vf = (get_format(n) for n in split_kv_type(kv_type))
    K = dequantize(kcache[:T].cpu(), kf, D, seed)
    V = dequantize(vcache[:T].cpu(), vf, D, seed)
    return attention_f64(q.cpu(), K, V, None if gate is None else gate.cpu())


# ---- causal attention over the byte cache (the CPU runtime path) -------------------------------
ATTN_TILE = 1024      # cache rows decoded at once: bounds the temporaries, never a full copy


def _tile_values(rows: torch.Tensor, fmt: KVQuantFormat, D: int, dtype: torch.dtype) -> torch.Tensor:
    """Byte rows [t, Hkv, row_bytes] -> [t, Hkv, D] code x block scale, in the ROTATED domain for
    codebook formats (what the kernel decodes in registers; no un-rotation)."""
    t, Hkv = rows.shape[:2]
    vals, scale = codes_and_scales(rows.reshape(t * Hkv, -1), fmt, D, dtype)
    return (vals * scale[..., None]).view(t, Hkv, D)


def attention_quant(q: torch.Tensor, kcache: torch.Tensor, vcache: torch.Tensor, p0: int,
                    kv_type: str, seed: int = DEFAULT_SEED, tile: int = ATTN_TILE) -> torch.Tensor:
    """Causal attention of n query rows q [n, H, D] (positions p0..p0+n-1, normed + roped) over
    rows 0..p0+n-1 of byte caches [cap, Hkv, row_bytes] of kv_type -> [n, H, D] in q's dtype,
    before the output gate. The torch twin of tightfit/kernels/attn_decode_q.py for n rows:
    q is rotated once (K format rotating), each tile of `tile` cache rows is decoded to
    code x block scale in the rotated domain, scores = q_rot . k_rot, online softmax across tiles,
    V accumulated in its rotated domain and the output un-rotated once (V format rotating)."""
    n, H, D = q.shape
    Hkv = kcache.shape[1]
    grp = H // Hkv
    T = p0 + n
    dt = q.dtype
    kf, vf = (get_format(x) for x in split_kv_type(kv_type))
    R = rotation_matrix(D, seed, dt, q.device) if (kf.rotate or vf.rotate) else None
    qr = q @ R.T if kf.rotate else q                                # y = R x, row-wise
    qv = qr.reshape(n, Hkv, grp, D) * (1.0 / math.sqrt(D))
    qpos = p0 + torch.arange(n, device=q.device)
    m = torch.full((Hkv, grp, n), float("-inf"), dtype=dt, device=q.device)
    l = torch.zeros(Hkv, grp, n, dtype=dt, device=q.device)
    acc = torch.zeros(Hkv, grp, n, D, dtype=dt, device=q.device)
    for t0 in range(0, T, tile):
        t1 = min(T, t0 + tile)
        K = _tile_values(kcache[t0:t1], kf, D, dt)                  # [t, Hkv, D]
        s = torch.einsum("njgd,tjd->jgnt", qv, K)
        vis = torch.arange(t0, t1, device=q.device)[None, :] <= qpos[:, None]   # [n, t]
        s = s.masked_fill(~vis, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))        # finite: tile 0 holds row 0, seen by all
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * alpha + p.sum(-1)
        V = _tile_values(vcache[t0:t1], vf, D, dt)
        acc = acc * alpha[..., None] + torch.einsum("jgnt,tjd->jgnd", p, V)
        m = m_new
    o = (acc / l[..., None]).permute(2, 0, 1, 3).reshape(n, H, D)
    return o @ R if vf.rotate else o                                # x_row = y_row R


# ---- the CPU ReferenceModel with a quantized cache ---------------------------------------------
def kv_roundtrip(kv_type: str, seed: int = DEFAULT_SEED):
    """A hook (k, v) -> (k', v') applying quantize -> dequantize of kv_type ('f16' = fp16
    rounding) to rows [n, Hkv, D]: what a model reading a quantized cache sees."""
    kn, vn = split_kv_type(kv_type)

    def one(x: torch.Tensor, name: str) -> torch.Tensor:
        if name == "f16":
            return x.to(torch.float16).to(x.dtype)
        return roundtrip(x, name, seed)

    return lambda k, v: (one(k, kn), one(v, vn))


class RoundtripKVState(State):
    """A State whose KV write applies `kv_roundtrip(kv_type)` and stores the result exactly (in
    the compute dtype). ReferenceModel.forward(tokens, RoundtripKVState(model, 'tq3', n)) then
    runs the reference forward as if it read a tq3 cache: the independent oracle of the native
    path (`State(kv_type='tq3')`, bytes + attention_quant), which must agree with it to rounding."""

    def __init__(self, model, kv_type: str, max_ctx: int, seed: int = DEFAULT_SEED):
        super().__init__(model.config, max_ctx, dtype=model.dtype, kv_dtype=model.dtype)
        self.roundtrip_type = kv_type      # (State.kv_type stays None: the rows are floats)
        self._hook = kv_roundtrip(kv_type, seed)

    def write_kv(self, il: int, k: torch.Tensor, v: torch.Tensor) -> None:
        k2, v2 = self._hook(k, v)
        super().write_kv(il, k2, v2)
