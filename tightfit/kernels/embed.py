"""Embedding lookup from the compressed token table: fp32 rows for a few token ids.

Only len(ids) rows are touched (one per token in decode), so this is about staying on the device
(no host sync, graph-capturable), not about speed.

Device path (CUDA, or the CPU under TRITON_INTERPRET=1): one Triton program per (id, 256-element
chunk of the row). The program reads its token id from device memory (`ids` is never looked at
on the host) and decodes its chunk straight from the raw GGUF blocks with the batched GEMM's tile
decoders (gemm_q_decode.decode_tile, R = 1 row): IQ4_XS, Q4_K, Q5_K, Q6_K, Q3_K, Q8_0, Q2_K,
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_S, IQ3_XXS, IQ4_NL, and issue 6's Q4_0, Q5_0, Q1_0, Q2_0, TQ2_0,
TQ1_0 (byte-gather decoders) with n_embd % 256 == 0; F32, F16 and BF16 rows (any n_embd) are
loaded and widened to fp32 (BF16 by its bits: exact). The decoders follow
tightfit.quant's float order, so the rows equal tightfit.quant.dequantize's bit for bit.
Ids outside [0, n_vocab) give zero rows (the loads are masked; checking would need a sync).
Graph capture: the launch is all there is; the grid formats' small table (grid_tables) is
copied to the device on the first call of each (type, device), so call once before capturing.

Fallback (any other type, n_embd % 256 != 0 for a quantized type, or a CPU table without the
interpreter): the gathered rows are decoded by gemm_q_torch.dequant_rows (torch ops on the
table's device; NumPy on the host for types it does not know). It is not capturable (host
copies, possibly a sync), so under CUDA graph capture it raises instead of running.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels import pdl
from tightfit.kernels.gemm_q_decode import DECODE_TYPES, decode_tile, grid_tables
from tightfit.kernels.gemv import type_id

FLOAT_TYPES = frozenset({0, 1, 30})          # F32, F16, BF16
#: types with a device kernel (Triton), given n_embd % 256 == 0 for the quantized ones
DEVICE_TYPES = DECODE_TYPES | FLOAT_TYPES
_CHUNK = 256


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@triton.jit
def _embed_q_kernel(ids_ptr, w_ptr, tg, out_ptr, n_vocab, NB, so,
                    FMT: tl.constexpr, EMU: tl.constexpr, PDL: tl.constexpr = False):
    """Program (i, kb): elements 256 kb .. 256 kb + 255 of the row of token ids[i]."""
    i = tl.program_id(0)
    kb = tl.program_id(1)
    if PDL:      # the ids come from the previous step's argmax; n x n_embd/256 programs
        gdc_wait()
        gdc_launch_dependents()
    tok = tl.load(ids_ptr + i + tl.arange(0, 1)).to(tl.int64)            # [1]
    okv = (tok >= 0) & (tok < n_vocab)
    ok = okv[:, None]                                                     # [1, 1]
    blk = (tl.where(okv, tok, 0) * NB + kb)[:, None]                      # [1, 1] K-step number
    W = decode_tile(w_ptr, blk, ok, tg, FMT, EMU)                         # [1, 256] fp32
    col = tl.arange(0, 256)[None, :]
    tl.store(out_ptr + i.to(tl.int64) * so + kb * 256 + col, tl.where(ok, W, 0.0))


@triton.jit
def _embed_f_kernel(ids_ptr, w_ptr, out_ptr, n_vocab, n_embd, so, FMT: tl.constexpr,
                    PDL: tl.constexpr = False):
    """F32 (0), F16 (1), BF16 (30) rows, widened to fp32 exactly."""
    i = tl.program_id(0)
    kb = tl.program_id(1)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    tok = tl.load(ids_ptr + i + tl.arange(0, 1)).to(tl.int64)
    ok = ((tok >= 0) & (tok < n_vocab))[:, None]
    col = kb * 256 + tl.arange(0, 256)[None, :]
    cm = col < n_embd
    m = ok & cm
    off = tl.where(ok, tok[:, None], 0) * n_embd + col
    if FMT == 0:
        v = tl.load(w_ptr.to(tl.pointer_type(tl.float32)) + off, mask=m, other=0.0)
    elif FMT == 1:
        v = tl.load(w_ptr.to(tl.pointer_type(tl.float16)) + off, mask=m, other=0.0).to(tl.float32)
    else:
        h = tl.load(w_ptr.to(tl.pointer_type(tl.uint16)) + off, mask=m, other=0).to(tl.int32)
        v = (h << 16).to(tl.float32, bitcast=True)
    tl.store(out_ptr + i.to(tl.int64) * so + col, v, mask=cm)


def _fallback(ids, table_raw, t, n_embd, row_bytes, out):
    """Gather + gemm_q_torch.dequant_rows (torch ops, NumPy for unknown types). Not capturable."""
    if _capturing(table_raw.device):
        raise RuntimeError(
            f"embed_rows: type {t} with n_embd={n_embd} has no device kernel (types "
            f"{sorted(DEVICE_TYPES)}, n_embd % 256 == 0 for the quantized ones); its fallback "
            "copies through the host and cannot run during CUDA graph capture")
    from tightfit.kernels.gemm_q_torch import dequant_rows
    rows = table_raw.view(-1, row_bytes).index_select(0, ids.to(torch.long))
    y = dequant_rows(rows, t, n_embd)
    out.copy_(y)
    return out


def embed_rows(ids: torch.Tensor, table_raw: torch.Tensor, qtype, n_embd: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [len(ids), n_embd] rows of a GGUF embedding table held as raw bytes (uint8, rows of
    n_embd elements) on any device. `ids`: integer tensor, ideally on the table's device (it is
    read there by the kernel: no host sync). `out`: optional fp32 [len(ids), n_embd] (unit
    column stride) on the table's device, written and returned."""
    t = type_id(qtype)
    from tightfit.quant.traits import row_bytes as _rb
    rb = _rb(t, n_embd)
    if table_raw.dtype != torch.uint8:
        table_raw = table_raw.view(torch.uint8)
    table_raw = table_raw.reshape(-1)
    if table_raw.numel() % rb:
        raise ValueError(f"embed_rows: table of {table_raw.numel()} bytes is not whole rows of "
                         f"{rb} bytes")
    n_vocab = table_raw.numel() // rb
    dev = table_raw.device
    if ids.device != dev:
        if _capturing(dev):
            raise RuntimeError("embed_rows: ids must be on the table's device during CUDA graph "
                               f"capture (got {ids.device}, table on {dev})")
        ids = ids.to(dev)
    ids = ids.reshape(-1)
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int64)
    ids = ids.contiguous()
    n = ids.numel()
    if out is None:
        out = torch.empty((n, n_embd), dtype=torch.float32, device=dev)
    elif (out.dtype != torch.float32 or tuple(out.shape) != (n, n_embd) or out.device != dev
          or (n_embd > 1 and out.stride(1) != 1)):
        raise ValueError(f"embed_rows: out must be fp32 [{n}, {n_embd}] on {dev} with unit "
                         f"column stride (got {out.dtype} {tuple(out.shape)} on {out.device})")
    if n == 0:
        return out
    on_dev = dev.type == "cuda" or _interpret()
    so = out.stride(0)
    on = pdl.enabled(dev)
    if on_dev and t in DECODE_TYPES and n_embd % _CHUNK == 0:
        key = (t, str(dev))
        if _capturing(dev):
            from tightfit.kernels import gemm_q_decode
            if key not in gemm_q_decode._TABLES:
                raise RuntimeError("embed_rows: call once outside CUDA graph capture first (the "
                                   f"decode table of type {t} is not on {dev} yet)")
        nb = n_embd // _CHUNK
        _embed_q_kernel[(n, nb)](ids, table_raw, grid_tables(t, dev), out, n_vocab, nb, so,
                                 FMT=t, EMU=_interpret() or dev.type != "cuda", PDL=on,
                                 launch_pdl=on, num_warps=4)
        return out
    if on_dev and t in FLOAT_TYPES:
        _embed_f_kernel[(n, triton.cdiv(n_embd, _CHUNK))](ids, table_raw, out, n_vocab, n_embd,
                                                          so, FMT=t, PDL=on, launch_pdl=on,
                                                          num_warps=4)
        return out
    return _fallback(ids, table_raw, t, n_embd, rb, out)
