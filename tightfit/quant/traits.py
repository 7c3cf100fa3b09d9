"""One table of the GGUF tensor types tightfit reads and writes (spec/quant-formats.md §1).

Keys are plain int type ids, so a `gguf.GGMLQuantizationType` member (an IntEnum) indexes the
table directly. Q2_0 (id 42) has no enum member in gguf 0.19, which is why ids and not enum
members are the keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

import numpy as np

from tightfit.errors import GGUFError

Q2_0 = 42   # PrismML's group-64 ternary container, upstream as ggml type 42 (spec §1, §5.2)

QTypeLike = Union[int, str]   # an int id, a GGMLQuantizationType member or a type name


@dataclass(frozen=True)
class QuantTraits:
    name: str
    type_id: int
    block_size: int       # elements per block
    type_size: int        # bytes per block
    gguf_dequant: bool    # gguf-py (the installed version) can dequantize this type

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size

    @property
    def align(self) -> int:
        """Largest power of two dividing the block's byte size: the widest load that is safe at
        every block start inside a row (spec §1 'align')."""
        return self.type_size & -self.type_size


# (name, id, elements per block, bytes per block), from spec/quant-formats.md §1.
_TABLE = [
    ("F32", 0, 1, 4), ("F16", 1, 1, 2), ("BF16", 30, 1, 2),
    ("Q4_0", 2, 32, 18), ("Q4_1", 3, 32, 20), ("Q5_0", 6, 32, 22), ("Q5_1", 7, 32, 24),
    ("Q8_0", 8, 32, 34),
    ("Q2_K", 10, 256, 84), ("Q3_K", 11, 256, 110), ("Q4_K", 12, 256, 144),
    ("Q5_K", 13, 256, 176), ("Q6_K", 14, 256, 210),
    ("IQ2_XXS", 16, 256, 66), ("IQ2_XS", 17, 256, 74), ("IQ3_XXS", 18, 256, 98),
    ("IQ1_S", 19, 256, 50), ("IQ4_NL", 20, 32, 18), ("IQ3_S", 21, 256, 110),
    ("IQ2_S", 22, 256, 82), ("IQ4_XS", 23, 256, 136), ("IQ1_M", 29, 256, 56),
    ("TQ1_0", 34, 256, 54), ("TQ2_0", 35, 256, 66), ("MXFP4", 39, 32, 17),
    ("Q1_0", 41, 128, 18), ("Q2_0", Q2_0, 64, 18),
    # tightfit-only types (ids far outside ggml's range; llama.cpp cannot read them): the base-3
    # repacking of ternary tensors written by `tightfit repack` (tightfit/tools/repack.py)
    ("TF_T3_64", 3064, 64, 15), ("TF_T3_128", 3128, 128, 28), ("TF_T3_256", 3256, 256, 54),
]

# Byte offsets of the fp16 scale fields (d, dmin) inside one block of each quantized type the GPU
# GEMV reads (spec/quant-formats.md block layouts): random test blocks set these to small finite
# scales so that random bytes make finite, well-scaled weights.
F16_SCALE_OFFSETS = {
    8: (0,), 2: (0,), 6: (0,), 20: (0,), 23: (0,), 41: (0,), Q2_0: (0,),
    10: (80, 82), 11: (108,), 12: (0, 2), 13: (0, 2), 14: (208,),
    16: (0,), 17: (0,), 18: (0,), 21: (0,), 22: (0,), 34: (52,), 35: (64,),
}

# Ids a reader must reject with a reason rather than "unknown" (spec §1).
_RETIRED = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
            36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}
# Valid ggml types that tightfit does not handle as weights.
_UNSUPPORTED = {9: "Q8_1", 15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
                40: "NVFP4"}


def _gguf_can_dequantize(type_id: int, type_size: int) -> bool:
    """Ask the installed gguf-py instead of hard-coding, so a newer gguf-py that learns Q1_0
    automatically becomes an oracle for it in the tests."""
    try:
        import gguf
        import gguf.quants
        qt = gguf.GGMLQuantizationType(type_id)
    except (ImportError, ValueError):
        return False
    try:
        gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qt)
    except (NotImplementedError, KeyError):
        return False
    return True


TRAITS: dict[int, QuantTraits] = {
    tid: QuantTraits(name, tid, bs, ts, _gguf_can_dequantize(tid, ts))
    for name, tid, bs, ts in _TABLE
}
#: tightfit's own types (not ggml's): outside oracles (gguf-py, llama.cpp) know only the rest.
TIGHTFIT_ONLY = frozenset({3064, 3128, 3256})
GGML_TRAITS: dict[int, QuantTraits] = {k: v for k, v in TRAITS.items() if k not in TIGHTFIT_ONLY}
#: ggml type names (the ones a user may ask the generator/quantizer for)
QTYPES_BY_NAME: dict[str, int] = {t.name: t.type_id for t in GGML_TRAITS.values()}
_ALL_BY_NAME: dict[str, int] = {t.name: t.type_id for t in TRAITS.values()}


def traits(qtype: QTypeLike) -> QuantTraits:
    """Traits of a type given as enum member, int id or (case-insensitive) name."""
    if isinstance(qtype, str):
        tid = _ALL_BY_NAME.get(qtype.strip().upper())
        if tid is None:
            raise GGUFError(f"unknown quantization type name {qtype!r}; known: "
                            f"{', '.join(sorted(QTYPES_BY_NAME))}")
        return TRAITS[tid]
    if isinstance(qtype, (bool, float)) or not isinstance(qtype, (int, np.integer)):
        raise GGUFError(f"quantization type must be an id or a name, got {qtype!r}")
    tid = int(qtype)
    t = TRAITS.get(tid)
    if t is not None:
        return t
    if tid in _RETIRED:
        raise GGUFError(f"ggml type id {tid} ({_RETIRED[tid]}) is retired and cannot be read")
    if tid in _UNSUPPORTED:
        raise GGUFError(f"ggml type id {tid} ({_UNSUPPORTED[tid]}) is not supported for tensors")
    raise GGUFError(f"unknown ggml type id {tid}")


def row_bytes(qtype: QTypeLike, n_elements_per_row: int) -> int:
    """Bytes of one row of `n_elements_per_row` elements (ggml `nb1`)."""
    t = traits(qtype)
    n = int(n_elements_per_row)
    if n < 0 or n % t.block_size:
        raise GGUFError(f"row length {n} is not a multiple of the {t.name} block size "
                        f"{t.block_size}")
    return n // t.block_size * t.type_size


def tensor_bytes(qtype: QTypeLike, ne: Iterable[int]) -> int:
    """Bytes of a whole tensor. `ne` is in ggml order: ne[0] is the contiguous row length (the
    LAST axis of the numpy shape)."""
    ne = [int(v) for v in ne]
    if not ne:
        ne = [1]
    if any(v < 0 for v in ne):
        raise GGUFError(f"negative dimension in tensor shape {ne}")
    n_rows = 1
    for v in ne[1:]:
        n_rows *= v
    return row_bytes(qtype, ne[0]) * n_rows
