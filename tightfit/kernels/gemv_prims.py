"""Integer primitives shared by the GGUF GEMV kernels: dp4a, prmt (byte permute), word loads.

Each primitive has two bodies behind the constexpr `EMU`: inline PTX for the GPU, and a plain
integer emulation with the same semantics for TRITON_INTERPRET=1, where inline PTX does not run
(shared/bench/triton-gemv-feasibility.md, point 4). The CPU tests therefore check every format's
decoding logic exactly; the device benchmark checks the PTX bodies at real shapes.

All quantized words are int32 tensors holding 4 bytes; byte k of a word is bits 8k..8k+7.
"""
from __future__ import annotations

import triton
import triton.language as tl


def i32(x: int) -> int:
    """A 32-bit pattern as the signed int Triton needs for an int32 constant."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= (1 << 31) else x


@triton.jit
def _sbyte(x, k: tl.constexpr):
    # byte k of x, sign-extended: shift it to the top, then arithmetic shift back down
    return (x << (24 - 8 * k)) >> 24


@triton.jit
def dp4a(a, b, c, EMU: tl.constexpr):
    """c + sum_k sbyte(a, k) * sbyte(b, k) (signed int8 x signed int8, int32 accumulate)."""
    if EMU:
        return (c + _sbyte(a, 0) * _sbyte(b, 0) + _sbyte(a, 1) * _sbyte(b, 1)
                + _sbyte(a, 2) * _sbyte(b, 2) + _sbyte(a, 3) * _sbyte(b, 3))
    else:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [a, b, c], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _prmt_byte(a, b, c, k: tl.constexpr):
    sel = (c >> (4 * k)) & 15
    idx = sel & 7
    src = tl.where(idx < 4, a, b)
    byte = (src >> ((idx & 3) * 8)) & 255
    # selector bit 3: replicate the sign bit of the chosen byte (PTX prmt default mode)
    byte = tl.where((sel & 8) != 0, tl.where((byte & 128) != 0, 255, 0), byte)
    return byte << (8 * k)


@triton.jit
def prmt(a, b, c, EMU: tl.constexpr):
    """PTX prmt.b32 (default mode): byte k of the result is byte (c_k & 7) of the 8-byte value
    {b:a}, or that byte's sign replicated when c_k & 8, where c_k is nibble k of c."""
    if EMU:
        return (_prmt_byte(a, b, c, 0) | _prmt_byte(a, b, c, 1) | _prmt_byte(a, b, c, 2)
                | _prmt_byte(a, b, c, 3))
    else:
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [a, b, c], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def ld_u8(p, m):
    """Bytes at uint8 pointers p, as int32."""
    return tl.load(p, mask=m, other=0).to(tl.int32)


@triton.jit
def ld_u16(p, m):
    """Little-endian u16 at 2-aligned byte pointers p, as int32."""
    return tl.load(p.to(tl.pointer_type(tl.uint16)), mask=m, other=0).to(tl.int32)


@triton.jit
def ld_w32(p, m, ALIGN4: tl.constexpr):
    """Little-endian 32-bit word at byte pointers p. GGUF blocks of 18/34/66/98/110/210 bytes
    leave words only 2-aligned, so those formats read two u16 (ALIGN4=False)."""
    if ALIGN4:
        return tl.load(p.to(tl.pointer_type(tl.int32)), mask=m, other=0)
    else:
        lo = tl.load(p.to(tl.pointer_type(tl.uint16)), mask=m, other=0).to(tl.int32)
        hi = tl.load((p + 2).to(tl.pointer_type(tl.uint16)), mask=m, other=0).to(tl.int32)
        return lo | (hi << 16)


@triton.jit
def ld_f16(p, m):
    return tl.load(p.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)


@triton.jit
def spread4(x):
    """4 bits (x & 15) -> one bit at the bottom of each byte: bit j goes to bit 8j.
    The multiply places four copies at shifts 0, 7, 14, 21, which never overlap, so no carries."""
    return ((x & 15) * 0x204081) & 0x01010101


@triton.jit
def acc_add(acc, nid, n: tl.constexpr, contrib):
    """Add a [R, KB] contribution into column n of the [NP, R, KB] accumulator. The column index
    is a compile-time constant per register when NP lies inside a thread, so the select folds."""
    return acc + tl.where(nid == n, contrib[None, :, :], 0.0)
