"""Codebooks of the non-linear GGUF types (spec/quant-formats.md §2.2).

The small tables (IQ4_NL values, E2M1 values, sign bytes) are written from the spec. The large IQ
grids are taken from gguf-py (a declared dependency), which stores them hex-packed: each entry is
a run of small codes that index `grid_map`. Only the table data is borrowed; the decoding below
is ours. Grids are returned as float32 (n_entries, group) arrays of the stored magnitudes (IQ2,
IQ3) or of the signed values -1/0/+1 (IQ1).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# E2M1 values times two (so they are integers); the MXFP4 scale carries the missing 1/2.
KVALUES_FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)

IQ1S_DELTA = 0.125


def _parity7(i: np.ndarray) -> np.ndarray:
    p = np.zeros_like(i)
    for b in range(7):
        p ^= (i >> b) & 1
    return p


# ksigns_iq2xs[i] = i | parity(i) << 7: a 7-bit index expands to 8 sign bits with an even number
# of set bits (spec §2.2).
KSIGNS = (np.arange(128, dtype=np.uint16) | (_parity7(np.arange(128, dtype=np.uint16)) << 7)
          ).astype(np.uint8)

_GRID_CLASSES = {"iq2xxs": "IQ2_XXS", "iq2xs": "IQ2_XS", "iq2s": "IQ2_S",
                 "iq3xxs": "IQ3_XXS", "iq3s": "IQ3_S", "iq1s": "IQ1_S"}


@lru_cache(maxsize=None)
def grid(name: str) -> np.ndarray:
    """The named grid ("iq2xxs", "iq2xs", "iq2s", "iq3xxs", "iq3s", "iq1s") as a read-only
    float32 array of shape (n_entries, elements_per_entry)."""
    import gguf.quants as gq
    cls = getattr(gq, _GRID_CLASSES[name])
    n_entries, group = cls.grid_shape
    levels = np.asarray(cls.grid_map, dtype=np.float32)
    packed = np.frombuffer(bytes.fromhex(cls.grid_hex.decode("ascii")), dtype=np.uint8)
    # 3 levels fit 2-bit codes (4 per byte); 8 levels are stored one per nibble (2 per byte).
    width = 2 if len(levels) <= 4 else 4
    shifts = np.arange(0, 8, width, dtype=np.uint8)
    codes = (packed[:, None] >> shifts[None, :]) & ((1 << width) - 1)
    codes = codes.reshape(n_entries, group)
    g = levels[codes]
    g.setflags(write=False)
    return g
