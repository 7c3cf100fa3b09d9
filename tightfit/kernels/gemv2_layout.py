"""Formats of GEMV v2 and the optional 'planar' re-layout of their blocks.

GEMV v2 reads each block as a few *fields* (quants, high bits, scales, d). A field is found at
`base + blk * stride + offset_in_field`, where `blk` = row * blocks_per_row + block:
- raw GGUF layout: base = the field's offset inside the block, stride = the block's byte size;
- planar layout (`relayout`): every field of every block of the buffer is gathered into one
  contiguous plane, the planes following each other; base = the plane's start, stride = the
  field's size. Same byte count, bit-exact inverse (`unrelayout`). Planes are ordered so that
  every quant plane starts 64-byte aligned and every other plane 4-byte aligned; in raw GGUF,
  Q6_K / Q3_K / Q8_0 blocks are only 2-byte aligned and cost two 16-bit loads per word.

Q8_0 is handled as macro-blocks of 8 blocks (256 elements); its fields are indexed by the
32-block number `8 * blk + j`.
"""
from __future__ import annotations

import numpy as np

# type id -> (name, bytes per GGUF block, elements per GGUF block,
#             fields in plane order: (name, offset in block, size))
FORMATS = {
    23: ("IQ4_XS", 136, 256, (("qs", 8, 128), ("sl", 4, 4), ("dsh", 0, 4))),
    12: ("Q4_K", 144, 256, (("qs", 16, 128), ("sc", 4, 12), ("dd", 0, 4))),
    13: ("Q5_K", 176, 256, (("qs", 48, 128), ("qh", 16, 32), ("sc", 4, 12), ("dd", 0, 4))),
    14: ("Q6_K", 210, 256, (("ql", 0, 128), ("qh", 128, 64), ("sc", 192, 16), ("d", 208, 2))),
    11: ("Q3_K", 110, 256, (("qs", 32, 64), ("hm", 0, 32), ("sc", 96, 12), ("d", 108, 2))),
    8: ("Q8_0", 34, 32, (("qs", 2, 32), ("d", 0, 2))),
}
V2_TYPES = frozenset(FORMATS)
# scale group (elements sharing one weight scale) per format
GROUP = {23: 32, 12: 32, 13: 32, 14: 16, 11: 16, 8: 32}
# macro-block (256 elements) byte size
MACRO = {t: f[1] * (256 // f[2]) for t, f in FORMATS.items()}


def _check(raw: np.ndarray, qtype: int) -> np.ndarray:
    if qtype not in FORMATS:
        raise ValueError(f"relayout: type {qtype} is not a GEMV v2 format")
    buf = np.ascontiguousarray(np.asarray(raw, dtype=np.uint8)).reshape(-1)
    if buf.size % FORMATS[qtype][1]:
        raise ValueError(f"relayout: {buf.size} bytes is not a whole number of blocks")
    return buf


def relayout(raw, qtype: int) -> np.ndarray:
    """Raw GGUF blocks (uint8, any shape, whole blocks) -> planar layout, same byte count."""
    qtype = int(qtype)
    buf = _check(raw, qtype)
    bb = FORMATS[qtype][1]
    blocks = buf.reshape(-1, bb)
    return np.concatenate([blocks[:, o:o + s].reshape(-1) for _, o, s in FORMATS[qtype][3]])


def unrelayout(planar, qtype: int) -> np.ndarray:
    """Inverse of `relayout`: planar buffer -> raw GGUF blocks (flat uint8)."""
    qtype = int(qtype)
    buf = _check(planar, qtype)
    bb = FORMATS[qtype][1]
    nblk = buf.size // bb
    out = np.empty((nblk, bb), np.uint8)
    pos = 0
    for _, o, s in FORMATS[qtype][3]:
        out[:, o:o + s] = buf[pos:pos + nblk * s].reshape(nblk, s)
        pos += nblk * s
    return out.reshape(-1)


def relayout_torch(raw, qtype: int):
    """`relayout` for a torch uint8 tensor on any device (no host copy); returns a new tensor."""
    import torch
    qtype = int(qtype)
    bb = FORMATS[qtype][1]
    if raw.numel() % bb:
        raise ValueError(f"relayout: {raw.numel()} bytes is not a whole number of blocks")
    blocks = raw.reshape(-1, bb)
    return torch.cat([blocks[:, o:o + s].reshape(-1) for _, o, s in FORMATS[qtype][3]])


def field_args(qtype: int, nbytes: int, planar: bool) -> list[int]:
    """The 4 field-base arguments of the kernel: planar plane starts in units of 4 bytes (every
    plane start is 4-aligned; quant planes are 64-aligned); zeros for the raw layout."""
    nblk = nbytes // FORMATS[qtype][1]
    out, pos = [], 0
    for _, _, s in FORMATS[qtype][3]:
        out.append(pos // 4 if planar else 0)
        pos += nblk * s
    return out + [0] * (4 - len(out))
