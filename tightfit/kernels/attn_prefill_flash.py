"""Bounded prefill attention (issue 8): a Triton flash-attention forward over the KV cache in place.

A block of n query rows q [n, H, D] (positions p0..p0+n-1, normed + roped, fp32) attends to cache
rows 0..p0+n-1 with the causal rule "query p0+i sees rows <= p0+i" and grouped GQA (query head h
reads KV head h // (H/Hkv)). Nothing depth-sized is allocated:

* f16 cache: ONE launch of `_attn_flash_kernel` reads K/V [T, Hkv, D] fp16 in place (no copy, no
  expansion to H heads) and writes o [n, H, D] fp32.
* quantized cache (kvquant formats q8_0, tqB, tqB_128, mixes `<k>+<v>`): the cache is walked in
  tiles of TILE_ROWS rows; `_kv_tile_decode_kernel` turns the byte rows [k0, k1) into a fixed fp16 scratch
  [TILE_ROWS, Hkv, D] (code x block scale, the value kvquant.reference.codes_and_scales gives,
  computed in fp32 and rounded once to fp16; rotated domain for TurboQuant formats, as in
  attention_quant: q is rotated once, q_rot = q R^T, and the V-side output is un-rotated once,
  o = o_rot R), then `_attn_flash_kernel` runs over that key range and updates the running state
  (m, l, acc) kept in fp32 between launches; the last tile normalises.

The kernel is resumable over key ranges: keys [k0, k1) live in a buffer whose row r holds key
kv_row0 + r (the cache itself: kv_row0 = 0; a tile scratch: kv_row0 = k0). LOAD=1 reads the state
(m, l in the log2 domain, acc unnormalised in the output buffer), FINAL=1 writes acc / l.
Softmax in fp32 with exp2; q (times log2(e)/sqrt(D)) and the probabilities are rounded to fp16 for
the two tensor-core products, accumulation in fp32 (the numerics of every flash kernel).

Memory (`flash_workspace_bytes`): f16 cache: q/o only (o fp32 [n, H, D] is the output itself);
quantized: 2 tiles fp16 + m, l [n, H] fp32 + q_rot fp32 and the un-rotation output fp32 for
rotating formats; independent of depth. The slow oracle is attn_prefill.attn_prefill_ref
(float64) for f16 caches and kvquant.reference.attention_quant / dequantize for quantized ones.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

#: cache rows decoded per tile for quantized caches (the scratch is 2 x TILE_ROWS x Hkv x D fp16:
#: 16 MiB for the 27B's Hkv = 4, D = 256)
TILE_ROWS = int(os.environ.get("TIGHTFIT_PREFILL_ATTN_TILE", "4096"))
LOG2E = 1.4426950408889634


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _attn_flash_kernel(Q, K, V, O, M, L, n, p0, k0, k1, kv_row0, qk_scale,
               sq_n, sq_h, sk_t, sk_h, sv_t, sv_h, so_n, so_h, sm_n,
               GRP: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               LOAD: tl.constexpr, FINAL: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GRP
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < n
    q = tl.load(Q + offs_m[:, None] * sq_n + h * sq_h + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    q = (q * qk_scale).to(tl.float16)
    if LOAD:
        m_i = tl.load(M + offs_m * sm_n + h, mask=row_ok, other=float("-inf"))
        l_i = tl.load(L + offs_m * sm_n + h, mask=row_ok, other=0.0)
        acc = tl.load(O + offs_m[:, None] * so_n + h * so_h + offs_d[None, :],
                      mask=row_ok[:, None], other=0.0)
    else:
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
    qpos = p0 + offs_m
    # keys past the block's last query are never visible: stop there (causal block skipping)
    hi = tl.minimum(k1, p0 + tl.minimum(pid_m * BM + BM, n))
    for start in range(k0, hi, BN):
        offs_n = start + tl.arange(0, BN)
        k_ok = offs_n < hi
        r = offs_n - kv_row0
        kt = tl.load(K + r[None, :] * sk_t + kvh * sk_h + offs_d[:, None], mask=k_ok[None, :],
                     other=0.0).to(tl.float16)                           # [D, BN]
        s = tl.dot(q, kt)                                                # [BM, BN] fp32
        vis = (offs_n[None, :] <= qpos[:, None]) & k_ok[None, :]
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)             # a row with nothing seen
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + r[:, None] * sv_t + kvh * sv_h + offs_d[None, :], mask=k_ok[:, None],
                    other=0.0).to(tl.float16)                            # [BN, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    o_ptr = O + offs_m[:, None] * so_n + h * so_h + offs_d[None, :]
    if FINAL:
        tl.store(o_ptr, acc / l_i[:, None], mask=row_ok[:, None])
    else:
        tl.store(o_ptr, acc, mask=row_ok[:, None])
        tl.store(M + offs_m * sm_n + h, m_i, mask=row_ok)
        tl.store(L + offs_m * sm_n + h, l_i, mask=row_ok)


@triton.jit
def _kv_tile_decode_kernel(SRC, DST, CB, t, s_t, d_t, SCALE_OFF: tl.constexpr, D: tl.constexpr,
                 G: tl.constexpr, BITS: tl.constexpr, BR: tl.constexpr):
    """Byte rows SRC [t, row_bytes] (one row per (cache row, KV head)) -> DST [t, D] fp16 values
    code x block scale (BITS 8: q8_0 int8 codes; else codebook CB[idx], rotated domain)."""
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    ok = rows < t
    e = tl.arange(0, D)
    base = SRC + rows[:, None] * s_t
    if BITS == 8:
        c = tl.load(base + e[None, :], mask=ok[:, None], other=0).to(tl.int8, bitcast=True)
        val = c.to(tl.float32)
    else:
        if BITS == 4:
            b = tl.load(base + (e // 2)[None, :], mask=ok[:, None], other=0).to(tl.int32)
            idx = (b >> ((e % 2) * 4)[None, :]) & 15
        else:
            b = tl.load(base + (e // 4)[None, :], mask=ok[:, None], other=0).to(tl.int32)
            idx = (b >> ((e % 4) * 2)[None, :]) & 3
            if BITS == 3:
                hb = tl.load(base + (D // 4 + e // 8)[None, :], mask=ok[:, None],
                             other=0).to(tl.int32)
                idx = idx | (((hb >> (e % 8)[None, :]) & 1) << 2)
        val = tl.load(CB + idx)
    lo = tl.load(base + (SCALE_OFF + 2 * (e // G))[None, :], mask=ok[:, None], other=0).to(tl.uint16)
    hi = tl.load(base + (SCALE_OFF + 2 * (e // G) + 1)[None, :], mask=ok[:, None],
                 other=0).to(tl.uint16)
    sc = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
    tl.store(DST + rows[:, None] * d_t + e[None, :], (val * sc).to(tl.float16), mask=ok[:, None])


def _blocks(D: int, n: int) -> tuple[int, int, int]:
    """(BM, BN, num_warps): D = 256 keeps acc [64, 256] fp32 over 8 warps and K/V tiles of 32
    rows (shared memory: q 32 KiB + 2 stages x (K + V) 16 KiB each); small blocks shrink BM."""
    if _interpret():
        return 16, 16, 4
    BM = 64 if n > 32 else (32 if n > 16 else 16)
    if D >= 256:
        return BM, 32, 8
    return BM, 64, 4


def flash_fwd(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, o: torch.Tensor,
              m: torch.Tensor | None, l: torch.Tensor | None, p0: int, k0: int, k1: int,
              kv_row0: int = 0, load: bool = False, final: bool = True) -> torch.Tensor:
    """One launch over keys [k0, k1): q [n, H, D] fp32; K/V [rows, Hkv, D] fp16 (row r = key
    kv_row0 + r); o [n, H, D] fp32 (the running acc when not final); m, l [n, H] fp32 (needed
    unless load=False and final=True)."""
    n, H, D = q.shape
    Hkv = K.shape[1]
    if H % Hkv or D & (D - 1) or D < 16:
        raise ValueError(f"flash_fwd: H={H}, Hkv={Hkv}, D={D} unsupported")
    if q.stride(2) != 1 or K.stride(2) != 1 or V.stride(2) != 1 or o.stride(2) != 1:
        raise ValueError("flash_fwd: last dimensions must be contiguous")
    if m is None:
        m = l = o.new_empty(1)          # never touched (LOAD = FINAL - 1 = 0)
        sm = 0
    else:
        sm = m.stride(0)
    BM, BN, warps = _blocks(D, n)
    grid = (triton.cdiv(n, BM), H)
    _attn_flash_kernel[grid](q, K, V, o, m, l, n, p0, k0, k1, kv_row0, LOG2E / math.sqrt(D),
                     q.stride(0), q.stride(1), K.stride(0), K.stride(1), V.stride(0), V.stride(1),
                     o.stride(0), o.stride(1), sm, GRP=H // Hkv, D=D, BM=BM, BN=BN,
                     LOAD=int(load), FINAL=int(final), num_warps=warps,
                     num_stages=1 if _interpret() else 2)
    return o


def decode_rows(rows: torch.Tensor, fmt, D: int, out: torch.Tensor) -> torch.Tensor:
    """Byte rows [t, Hkv, row_bytes] of kvquant format `fmt` -> out [t, Hkv, D] fp16 (code x scale,
    rotated domain for TurboQuant formats): one launch."""
    t, Hkv, rb = rows.shape
    src = rows.reshape(t * Hkv, rb)
    dst = out.view(t * Hkv, D)
    cb = fmt.codebook().to(rows.device) if fmt.rotate else torch.zeros(1, device=rows.device)
    BR = 8 if _interpret() else max(1, 4096 // D)
    _kv_tile_decode_kernel[(triton.cdiv(t * Hkv, BR),)](src, dst, cb, t * Hkv, src.stride(0),
                                               dst.stride(0), SCALE_OFF=fmt.codes_bytes(D), D=D,
                                               G=fmt.group, BITS=fmt.bits if fmt.rotate else 8,
                                               BR=BR, num_warps=4)
    return out


def flash_attn_prefill(q: torch.Tensor, kcache: torch.Tensor, vcache: torch.Tensor, p0: int,
                       kv_type: str | None = None, tile: int | None = None,
                       seed: int | None = None) -> torch.Tensor:
    """q [n, H, D] fp32 (normed, roped) -> o [n, H, D] fp32 over cache rows 0..p0+n-1 (causal).
    kv_type None / 'f16': fp16 caches [cap, Hkv, D] read in place; otherwise byte caches of that
    kvquant type, decoded tile by tile (`tile` rows, default TILE_ROWS) into a fixed scratch."""
    n, H, D = q.shape
    T = p0 + n
    q = q.to(torch.float32).contiguous()
    o = torch.empty((n, H, D), dtype=torch.float32, device=q.device)
    if not kv_type or kv_type == "f16":
        return flash_fwd(q, kcache, vcache, o, None, None, p0, 0, T)
    from tightfit.kvquant.formats import DEFAULT_SEED, get_format, rotation_matrix, split_kv_type
    seed = DEFAULT_SEED if seed is None else seed
    kf, vf = (get_format(x) for x in split_kv_type(kv_type))
    Hkv = kcache.shape[1]
    tile = int(tile or TILE_ROWS)
    R = (rotation_matrix(D, seed, torch.float32, q.device)
         if (kf.rotate or vf.rotate) else None)
    if kf.rotate:
        q = (q.view(n * H, D) @ R.T).view(n, H, D)                      # y = R x, row-wise
    rows = min(tile, T)
    Kt = torch.empty((rows, Hkv, D), dtype=torch.float16, device=q.device)
    Vt = torch.empty_like(Kt)
    m = torch.empty((n, H), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    for t0 in range(0, T, tile):
        t1 = min(T, t0 + tile)
        decode_rows(kcache[t0:t1], kf, D, Kt[:t1 - t0])
        decode_rows(vcache[t0:t1], vf, D, Vt[:t1 - t0])
        flash_fwd(q, Kt, Vt, o, m, l, p0, t0, t1, kv_row0=t0, load=t0 > 0, final=t1 == T)
    if vf.rotate:
        o = (o.view(n * H, D) @ R).view(n, H, D)                        # x_row = y_row R
    return o


def flash_workspace_bytes(n_head: int, n_head_kv: int, head_dim: int, n: int, depth: int,
                          kv_type: str | None = None, tile: int | None = None) -> dict[str, int]:
    """Device bytes flash_attn_prefill allocates for a block of n queries after `depth` cached rows
    (besides its input q): the fp32 output (the running acc), and for quantized caches the two
    fp16 tiles, m and l, plus for rotating formats q_rot and the un-rotated output (fp32
    [n, H, D] each) and the D x D rotation. Independent of depth beyond min(tile, depth + n)."""
    qo = n * n_head * head_dim * 4
    out = {"attn_out": qo}
    if kv_type and kv_type != "f16":
        from tightfit.kvquant.formats import get_format, split_kv_type
        kf, vf = (get_format(x) for x in split_kv_type(kv_type))
        rows = min(int(tile or TILE_ROWS), depth + n)
        out["attn_tiles"] = 2 * rows * n_head_kv * head_dim * 2
        out["attn_state"] = 2 * n * n_head * 4
        rot = (qo if kf.rotate else 0) + (qo if vf.rotate else 0)
        if rot:
            rot += head_dim * head_dim * 4
        out["attn_rotation"] = rot
    return out
