"""NumPy reference dequantization of every type in TRAITS, written from spec/quant-formats.md §2.

Every decoder takes a (n_blocks, type_size) uint8 array and returns (n_blocks, block_size)
float32, vectorized over blocks. The order of float operations follows the spec's formulas
(scale products first, then times the code), which is what makes the results bit-exact with
llama.cpp's C reference and gguf-py.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from tightfit.errors import GGUFError
from tightfit.quant import tables
from tightfit.quant.traits import Q2_0, QTypeLike, traits

Decoder = Callable[[np.ndarray], np.ndarray]
F32 = np.float32


# ---- field helpers ----------------------------------------------------------------------------

def f16_at(b: np.ndarray, off: int) -> np.ndarray:
    """fp16 field at byte `off` of every block, widened to float32 (subnormals kept exactly)."""
    return np.ascontiguousarray(b[:, off:off + 2]).view(np.float16)[:, 0].astype(F32)


def u16_at(b: np.ndarray, off: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, off:off + 2 * count]).view("<u2").astype(np.uint32)


def u32_at(b: np.ndarray, off: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, off:off + 4 * count]).view("<u4")


def nibbles_half_split(qs: np.ndarray) -> np.ndarray:
    """(n, 16*k) bytes -> (n, 32*k) codes: per 16 bytes, low nibbles are elements 0..15, high
    nibbles 16..31 (spec §2.1 'half-split')."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, 16)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(n, -1)


def crumb_planes(qs: np.ndarray) -> np.ndarray:
    """(n, 32*k) bytes -> (n, 128*k) 2-bit codes: crumb j of byte m is element 32j+m of its
    128-element chunk (spec §2.1 'crumb planes')."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    return (q & 3).reshape(n, -1)


# ---- float types ------------------------------------------------------------------------------

def _f32(b):
    return np.ascontiguousarray(b).view("<f4").astype(F32)


def _f16(b):
    return np.ascontiguousarray(b).view("<f2").astype(F32)


def _bf16(b):
    # bf16 is the top half of an fp32: shift the 16 bits into place.
    return (np.ascontiguousarray(b).view("<u2").astype(np.uint32) << 16).view(F32)


# ---- legacy 32-element types -------------------------------------------------------------------

def _q4_0(b):
    d = f16_at(b, 0)[:, None]
    return d * (nibbles_half_split(b[:, 2:18]).astype(F32) - F32(8))


def _q4_1(b):
    d, m = f16_at(b, 0)[:, None], f16_at(b, 2)[:, None]
    return d * nibbles_half_split(b[:, 4:20]).astype(F32) + m


def _fifth_bits(b, off):
    qh = u32_at(b, off, 1)                       # (n, 1): bit e is element e's fifth bit
    return ((qh >> np.arange(32, dtype=np.uint32)[None, :]) & 1).astype(np.uint8)


def _q5_0(b):
    d = f16_at(b, 0)[:, None]
    q = nibbles_half_split(b[:, 6:22]) | (_fifth_bits(b, 2) << 4)
    return d * (q.astype(F32) - F32(16))


def _q5_1(b):
    d, m = f16_at(b, 0)[:, None], f16_at(b, 2)[:, None]
    q = nibbles_half_split(b[:, 8:24]) | (_fifth_bits(b, 4) << 4)
    return d * q.astype(F32) + m


def _q8_0(b):
    return f16_at(b, 0)[:, None] * b[:, 2:34].view(np.int8).astype(F32)


def _iq4_nl(b):
    kv = tables.KVALUES_IQ4NL.astype(F32)
    return f16_at(b, 0)[:, None] * kv[nibbles_half_split(b[:, 2:18])]


def mxfp4_scale(e: np.ndarray) -> np.ndarray:
    """E8M0 exponent byte -> 2^(E-128) as float32: half of the OCP scale 2^(E-127), because the
    E2M1 table is stored doubled (spec §2.4). E = 0, 1 are float32 subnormals, exact."""
    return np.ldexp(F32(1), e.astype(np.int32) - 128).astype(F32)


def _mxfp4(b):
    kv = tables.KVALUES_FP4.astype(F32)
    return mxfp4_scale(b[:, 0])[:, None] * kv[nibbles_half_split(b[:, 1:17])]


# ---- binary / ternary small-block types -----------------------------------------------------------

def _q1_0(b):
    d = f16_at(b, 0)[:, None]
    bits = np.unpackbits(b[:, 2:18], axis=1, bitorder="little")   # bit e%8 of byte e/8
    return np.where(bits.astype(bool), d, -d)


def _q2_0(b):
    d = f16_at(b, 0)[:, None]
    n = b.shape[0]
    c = (b[:, 2:18, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3   # consecutive crumbs
    return d * (c.reshape(n, 64).astype(F32) - F32(1))


def _decoders() -> dict[int, Decoder]:
    from tightfit.quant import dequant_iq, dequant_k
    base = {0: _f32, 1: _f16, 30: _bf16, 2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0,
            20: _iq4_nl, 39: _mxfp4, 41: _q1_0, Q2_0: _q2_0}
    base.update(dequant_k.DECODERS)
    base.update(dequant_iq.DECODERS)
    # tightfit's own dense ternary packing (tightfit repack): 5 trits per byte
    from tightfit.tools.repack import T3_TYPES, dequantize_t3
    for tid in T3_TYPES:
        base[tid] = (lambda b, _t=tid: dequantize_t3(b, _t))
    return base


_DECODERS: Optional[dict[int, Decoder]] = None


def dequantize(raw: np.ndarray, qtype: QTypeLike,
               shape: Optional[Sequence[int]] = None) -> np.ndarray:
    """Decode contiguous whole blocks of `qtype` to float32.

    `raw` is any uint8 array (or bytes-like) holding whole blocks; the result is flat, or has
    `shape` (numpy order, e.g. (rows, cols)) if given.
    """
    global _DECODERS
    if _DECODERS is None:
        _DECODERS = _decoders()
    t = traits(qtype)
    buf = np.asarray(raw) if not isinstance(raw, (bytes, bytearray, memoryview)) \
        else np.frombuffer(raw, dtype=np.uint8)
    if buf.dtype != np.uint8:
        buf = np.ascontiguousarray(buf).view(np.uint8)
    buf = buf.reshape(-1)
    if buf.size % t.type_size:
        raise GGUFError(f"{buf.size} bytes is not a whole number of {t.name} blocks "
                        f"({t.type_size} bytes each)")
    blocks = buf.reshape(-1, t.type_size)
    out = _DECODERS[t.type_id](blocks).reshape(-1)
    if out.dtype != F32:
        out = out.astype(F32)
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape, dtype=np.int64)) != out.size:
            raise GGUFError(f"{t.name} data holds {out.size} elements, which does not fit "
                            f"shape {shape}")
        out = out.reshape(shape)
    return out
