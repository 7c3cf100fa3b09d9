"""Embedding lookup from the compressed token table: fp32 rows for a few token ids.

Only len(ids) rows are touched (one per token in decode), so this is about staying on the device
(no host sync, graph-capturable), not about speed. Q3_K (the 27B mix's token_embd type) and the
float types decode with torch integer ops on the gathered raw rows; other types fall back to the
NumPy reference on the host (correct, but it syncs).
"""
from __future__ import annotations

import numpy as np
import torch

from tightfit.kernels.gemv import type_id

_BLOCK = {11: (256, 110), 0: (1, 4), 1: (1, 2), 30: (1, 2)}


def _q3k_rows(raw: torch.Tensor) -> torch.Tensor:
    """raw [n, nb, 110] uint8 -> [n, nb*256] fp32 (spec/quant-formats.md §2.3 Q3_K)."""
    n, nb, _ = raw.shape
    b = raw.to(torch.int32)
    hm, qs, sc = b[..., 0:32], b[..., 32:96], b[..., 96:108]
    d = raw[..., 108:110].contiguous().view(torch.float16).to(torch.float32)   # [n, nb, 1]
    e = torch.arange(256, device=raw.device)
    h, g, t = e // 128, (e % 128) // 32, e % 32
    low = (qs[..., 32 * h + t] >> (2 * g)) & 3
    hbit = (hm[..., t] >> (4 * h + g)) & 1
    q = low - 4 * (1 - hbit)
    s = torch.arange(16, device=raw.device)
    scl = ((sc[..., s % 8] >> (4 * (s // 8))) & 15) | (((sc[..., 8 + s % 4] >> (2 * (s // 4))) & 3) << 4)
    scl = (scl - 32).to(torch.float32)                                           # [n, nb, 16]
    y = d * scl.repeat_interleave(16, dim=-1) * q.to(torch.float32)
    return y.reshape(n, nb * 256)


def embed_rows(ids: torch.Tensor, table_raw: torch.Tensor, qtype, n_embd: int) -> torch.Tensor:
    """fp32 [len(ids), n_embd] rows of a GGUF embedding table held as raw bytes (rows of
    n_embd elements) on any device."""
    t = type_id(qtype)
    from tightfit.quant.traits import traits
    tr = traits(t)
    row_bytes = n_embd // tr.block_size * tr.type_size
    rows = table_raw.view(-1, row_bytes).index_select(0, ids.reshape(-1).to(torch.long)
                                                      .to(table_raw.device))
    if t == 11:
        return _q3k_rows(rows.view(rows.shape[0], -1, 110))
    if t == 0:
        return rows.contiguous().view(torch.float32).clone()
    if t == 1:
        return rows.contiguous().view(torch.float16).to(torch.float32)
    if t == 30:
        return rows.contiguous().view(torch.bfloat16).to(torch.float32)
    from tightfit.quant.dequant import dequantize
    y = dequantize(rows.cpu().numpy().reshape(-1), t, (rows.shape[0], n_embd))
    return torch.from_numpy(np.ascontiguousarray(y, np.float32)).to(table_raw.device)
