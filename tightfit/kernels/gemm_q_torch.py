"""Row-chunk dequantization of raw GGUF blocks with torch ops (any device), for the batched GEMM.

`dequant_rows(raw, qtype, n_in)` turns `raw` [rows, row_bytes] uint8 (whole rows of GGUF blocks,
on the CPU or the GPU) into float32 [rows, n_in]. It is the batched forward's CPU path and the GPU
path of what has no Triton tile decoder in gemm_q_decode.py (other formats, n_in % 256 != 0): a
handful of elementwise kernels per chunk, so the intermediates are a few times the chunk's fp32
size (gemm_q sizes the chunks for that).

The decoding follows spec/quant-formats.md §2 exactly as tightfit/quant/dequant*.py does (the same
field offsets and the same order of float operations: scale products first, then times the code),
written with torch integer ops so it runs where the bytes are. Types not listed fall back to the
NumPy decoder on the host (correct, slow: fine for odd tensors in tests).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

F32 = torch.float32


# ---- field helpers ------------------------------------------------------------------------------
def _f16(b: torch.Tensor, off: int) -> torch.Tensor:
    """fp16 field at byte off of every block -> float32 [n, 1]."""
    return b[:, off:off + 2].contiguous().view(torch.float16).to(F32)


def _u16(b: torch.Tensor, off: int, count: int) -> torch.Tensor:
    lo = b[:, off:off + 2 * count:2].to(torch.int32)
    hi = b[:, off + 1:off + 2 * count:2].to(torch.int32)
    return lo | (hi << 8)


def _u32(b: torch.Tensor, off: int, count: int) -> torch.Tensor:
    """Little-endian u32 fields as int64 (no sign trouble with >> 28)."""
    out = torch.zeros(b.shape[0], count, dtype=torch.int64, device=b.device)
    for k in range(4):
        out |= b[:, off + k:off + 4 * count:4].to(torch.int64) << (8 * k)
    return out


def _shifts(vals, device, dtype=torch.uint8) -> torch.Tensor:
    return torch.tensor(vals, dtype=dtype, device=device)


def _half_split(qs: torch.Tensor) -> torch.Tensor:
    """(n, 16k) bytes -> (n, 32k) nibble codes: per 16 bytes low nibbles first, then high."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, 16)
    return torch.cat([q & 15, q >> 4], dim=2).reshape(n, -1)


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    """(n, 32k) bytes -> (n, 128k) 2-bit codes: crumb j of byte m is element 32j+m of its 128."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], qs.device).view(1, 1, 4, 1)
    return (q & 3).reshape(n, -1)


def _sign_pm(sign_bytes: torch.Tensor) -> torch.Tensor:
    """(...,) sign bytes -> (..., 8) float32 +-1 (bit j set = element j negative)."""
    bits = (sign_bytes.to(torch.int32)[..., None] >> torch.arange(8, device=sign_bytes.device)) & 1
    return 1.0 - 2.0 * bits.to(F32)


@lru_cache(maxsize=None)
def _tables(device: str) -> dict:
    from tightfit.quant import tables
    dev = torch.device(device)
    out = {"kv": torch.from_numpy(tables.KVALUES_IQ4NL.astype(np.float32)).to(dev),
           "ksigns": torch.from_numpy(tables.KSIGNS.astype(np.int64)).to(dev)}
    for name in ("iq2xxs", "iq2xs", "iq2s", "iq3xxs", "iq3s"):
        out[name] = torch.from_numpy(tables.grid(name).astype(np.float32)).to(dev)
    return out


# ---- decoders: (n_blocks, type_size) uint8 -> (n_blocks, block_size) float32 --------------------
def _q8_0(b):
    return _f16(b, 0) * b[:, 2:34].contiguous().view(torch.int8).to(F32)


def _iq4_nl(b):
    kv = _tables(str(b.device))["kv"]
    return _f16(b, 0) * kv[_half_split(b[:, 2:18]).long()]


def _k4_scale_min(s):
    lo_sc, lo_m, mix = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([lo_sc & 63, (mix & 15) | ((lo_sc >> 6) << 4)], dim=1)
    m = torch.cat([lo_m & 63, (mix >> 4) | ((lo_m >> 6) << 4)], dim=1)
    return sc, m


def _k_affine(b, q):
    n = b.shape[0]
    sc, m = _k4_scale_min(b[:, 4:16])
    dl = (_f16(b, 0) * sc.to(F32))[:, :, None]
    ml = (_f16(b, 2) * m.to(F32))[:, :, None]
    return (dl * q.reshape(n, 8, 32).to(F32) - ml).reshape(n, 256)


def _nibble_chunks(qs):
    n = qs.shape[0]
    q = qs.reshape(n, 4, 1, 32)
    return torch.cat([q & 15, q >> 4], dim=2).reshape(n, 256)


def _q4_k(b):
    return _k_affine(b, _nibble_chunks(b[:, 16:144]))


def _q5_k(b):
    n = b.shape[0]
    hbit = (b[:, None, 16:48] >> _shifts(list(range(8)), b.device).view(1, 8, 1)) & 1
    return _k_affine(b, _nibble_chunks(b[:, 48:176]) | (hbit.reshape(n, 256) << 4))


def _q6_k(b):
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 1, 2, 32)
    low = torch.cat([ql & 15, ql >> 4], dim=2)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], b.device).view(1, 1, 4, 1)
    q = (low.reshape(n, 2, 4, 32) | ((qh & 3) << 4)).to(torch.int16) - 32
    dl = (_f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).to(F32))[:, :, None]
    return (dl * q.reshape(n, 16, 16).to(F32)).reshape(n, 256)


def _q2_k(b):
    n = b.shape[0]
    sc = b[:, 0:16]
    dl = (_f16(b, 80) * (sc & 15).to(F32))[:, :, None]
    ml = (_f16(b, 82) * (sc >> 4).to(F32))[:, :, None]
    q = _crumbs(b[:, 16:80]).reshape(n, 16, 16).to(F32)
    return (dl * q - ml).reshape(n, 256)


def _q3_k(b):
    n = b.shape[0]
    low = _crumbs(b[:, 32:96]).to(torch.int16)
    hbit = (b[:, None, 0:32] >> _shifts(list(range(8)), b.device).view(1, 8, 1)) & 1
    q = low - 4 * (1 - hbit.reshape(n, 256).to(torch.int16))
    s = b[:, 96:108]
    lo = torch.cat([s[:, 0:8] & 15, s[:, 0:8] >> 4], dim=1)
    hi = (s[:, 8:12, None] >> _shifts([0, 2, 4, 6], b.device).view(1, 1, 4)) & 3
    hi = hi.transpose(1, 2).reshape(n, 16)
    scl = (lo | (hi << 4)).to(torch.int16) - 32
    dl = (_f16(b, 108) * scl.to(F32))[:, :, None]
    return (dl * q.reshape(n, 16, 16).to(F32)).reshape(n, 256)


def _iq4_xs(b):
    n = b.shape[0]
    sh = _u16(b, 2, 1)                                                     # [n, 1]
    sl = torch.cat([(b[:, 4:8] & 15)[:, :, None], (b[:, 4:8] >> 4)[:, :, None]],
                   dim=2).reshape(n, 8).to(torch.int32)
    ls = sl | (((sh >> (2 * torch.arange(8, device=b.device))[None, :]) & 3) << 4)
    dl = _f16(b, 0) * (ls.to(F32) - 32.0)
    kv = _tables(str(b.device))["kv"][_half_split(b[:, 8:136]).long()]
    return (dl[:, :, None] * kv.reshape(n, 8, 32)).reshape(n, 256)


def _iq2_scales(sc):
    n = sc.shape[0]
    return torch.stack([sc & 15, sc >> 4], dim=2).reshape(n, 16)


def _iq2_xxs(b):
    n = b.shape[0]
    T = _tables(str(b.device))
    sub = b[:, 2:66].reshape(n, 8, 8)
    idx = sub[:, :, 0:4].long()
    aux = torch.zeros(n, 8, dtype=torch.int64, device=b.device)
    for k in range(4):
        aux |= sub[:, :, 4 + k].to(torch.int64) << (8 * k)
    db = _f16(b, 0) * (0.5 + (aux >> 28).to(F32)) * 0.25
    sidx = (aux[:, :, None] >> torch.tensor([0, 7, 14, 21], device=b.device)) & 127
    sg = _sign_pm(T["ksigns"][sidx])
    g = T["iq2xxs"][idx]
    return (db[:, :, None, None] * g * sg).reshape(n, 256)


def _iq2_xs(b):
    n = b.shape[0]
    T = _tables(str(b.device))
    qs = _u16(b, 2, 32).long()
    db = _f16(b, 0) * (0.5 + _iq2_scales(b[:, 66:74]).to(F32)) * 0.25
    g = T["iq2xs"][qs & 511]
    sg = _sign_pm(T["ksigns"][qs >> 9])
    return (db.reshape(n, 16, 1, 1) * (g * sg).reshape(n, 16, 2, 8)).reshape(n, 256)


def _iq2_s(b):
    n = b.shape[0]
    T = _tables(str(b.device))
    qh = (b[:, 66:74, None] >> _shifts([0, 2, 4, 6], b.device)) & 3
    idx = b[:, 2:34].long() | (qh.reshape(n, 32).long() << 8)
    db = _f16(b, 0) * (0.5 + _iq2_scales(b[:, 74:82]).to(F32)) * 0.25
    g = T["iq2s"][idx]
    sg = _sign_pm(b[:, 34:66])
    return (db.reshape(n, 16, 1, 1) * (g * sg).reshape(n, 16, 2, 8)).reshape(n, 256)


def _iq3_xxs(b):
    n = b.shape[0]
    T = _tables(str(b.device))
    aux = _u32(b, 66, 8)
    db = _f16(b, 0) * (0.5 + (aux >> 28).to(F32)) * 0.5
    sidx = (aux[:, :, None] >> torch.tensor([0, 7, 14, 21], device=b.device)) & 127
    sg = _sign_pm(T["ksigns"][sidx])
    g = T["iq3xxs"][b[:, 2:66].long()].reshape(n, 8, 4, 8)
    return (db[:, :, None, None] * g * sg).reshape(n, 256)


def _iq3_s(b):
    n = b.shape[0]
    T = _tables(str(b.device))
    hb = ((b[:, 66:74, None] >> _shifts(list(range(8)), b.device)) & 1).reshape(n, 64).long()
    idx = b[:, 2:66].long() | (hb << 8)
    sc = torch.stack([b[:, 106:110] & 15, b[:, 106:110] >> 4], dim=2).reshape(n, 8)
    db = _f16(b, 0) * (1 + 2 * sc.to(F32))
    g = T["iq3s"][idx].reshape(n, 8, 4, 8)
    sg = _sign_pm(b[:, 74:106]).reshape(n, 8, 4, 8)
    return (db[:, :, None, None] * g * sg).reshape(n, 256)


def _q4_0(b):
    return _f16(b, 0) * (_half_split(b[:, 2:18]).to(F32) - 8.0)


def _q5_0(b):
    hb = (b[:, 2:6, None] >> _shifts(list(range(8)), b.device)) & 1          # bit e of the u32
    q = _half_split(b[:, 6:22]) | (hb.reshape(b.shape[0], 32) << 4)
    return _f16(b, 0) * (q.to(F32) - 16.0)


def _q1_0(b):
    bits = (b[:, 2:18, None] >> _shifts(list(range(8)), b.device)) & 1
    d = _f16(b, 0)
    return torch.where(bits.reshape(b.shape[0], 128).bool(), d, -d)


def _q2_0(b):
    c = (b[:, 2:18, None] >> _shifts([0, 2, 4, 6], b.device)) & 3           # consecutive crumbs
    return _f16(b, 0) * (c.reshape(b.shape[0], 64).to(F32) - 1.0)


def _tq2_0(b):
    return _f16(b, 64) * (_crumbs(b[:, 0:64]).to(F32) - 1.0)


def _trits(q: torch.Tensor, n_trits: int) -> torch.Tensor:
    """(n, m) bytes -> (n, n_trits * m): trit k of byte j at k * m + j (spec §2, TQ1_0)."""
    p = torch.tensor([3 ** k for k in range(n_trits)], dtype=torch.int32, device=q.device)
    v = (q.to(torch.int32)[:, None, :] * p[None, :, None]) & 255
    return ((v * 3) >> 8).reshape(q.shape[0], -1)


def _tq1_0(b):
    t = torch.cat([_trits(b[:, 0:32], 5), _trits(b[:, 32:48], 5), _trits(b[:, 48:52], 4)], dim=1)
    return _f16(b, 52) * (t.to(F32) - 1.0)


#: type id -> (decoder, elements per block, bytes per block)
DECODERS = {8: (_q8_0, 32, 34), 20: (_iq4_nl, 32, 18), 10: (_q2_k, 256, 84),
            11: (_q3_k, 256, 110), 12: (_q4_k, 256, 144), 13: (_q5_k, 256, 176),
            14: (_q6_k, 256, 210), 23: (_iq4_xs, 256, 136), 16: (_iq2_xxs, 256, 66),
            17: (_iq2_xs, 256, 74), 22: (_iq2_s, 256, 82), 18: (_iq3_xxs, 256, 98),
            21: (_iq3_s, 256, 110), 2: (_q4_0, 32, 18), 6: (_q5_0, 32, 22),
            41: (_q1_0, 128, 18), 42: (_q2_0, 64, 18), 35: (_tq2_0, 256, 66),
            34: (_tq1_0, 256, 54)}
FLOAT_VIEWS = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


def dequant_rows(raw: torch.Tensor, qtype: int, n_in: int) -> torch.Tensor:
    """raw [rows, row_bytes] uint8 (any device) -> float32 [rows, n_in] on the same device."""
    t = int(qtype)
    rows = raw.shape[0]
    if t in FLOAT_VIEWS:
        return raw.contiguous().view(FLOAT_VIEWS[t]).reshape(rows, n_in).to(F32)
    if t in DECODERS:
        fn, bs, ts = DECODERS[t]
        return fn(raw.reshape(-1, ts)).reshape(rows, n_in)
    from tightfit.quant.dequant import dequantize          # host fallback (any other type)
    y = dequantize(raw.cpu().numpy().reshape(-1), t, (rows, n_in))
    return torch.from_numpy(np.ascontiguousarray(y, np.float32)).to(raw.device)


def decode_temp_factor(qtype: int) -> int:
    """Rough peak of the decoder's temporaries in fp32-output multiples (sizes the chunks)."""
    return 1 if int(qtype) in FLOAT_VIEWS else 6
