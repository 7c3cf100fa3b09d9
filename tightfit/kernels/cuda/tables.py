"""C source of the lookup tables the CUDA GEMV formats need (included after gemv_common.cuh,
before the format headers; see CONTRACT.md).

Generated at run time from tightfit.quant.tables (whose IQ grids come from gguf-py); no table
literal lives in the repository. What the device code reads (tables_source()):

- `tf_iq2xxs_g16[256]`, `tf_iq2xs_g16[512]`, `tf_iq2s_g16[1024]` (uint16): one IQ2 grid entry
  (8 magnitudes, each one of 3 values) as 8 two-bit codes: code of element j (j < 4) at bits
  4j..4j+1, code of element j + 4 at bits 4j+2..4j+3 (so that `(e | e << 14) & 0x33333333`
  puts code j in nibble j). `TF_IQ2_LUT_P` / `TF_IQ2_LUT_N`: the 3 magnitudes / their negatives
  as bytes 0..2, for one byte_perm per 4 weights (selector nibble = code | sign << 2).
- `tf_iq3xxs_g16[256]`, `tf_iq3s_g16[512]` (uint16): one IQ3 entry (4 magnitudes of 8 values)
  as 4 three-bit codes, code j in nibble j (bit 3 clear: a byte_perm selector as it is).
  `TF_IQ3XXS_LUT_P0/P1/N0/N1`, `TF_IQ3S_LUT_...`: the 8 magnitudes (bytes of P0 then P1) and
  their negatives.

grid_words() / sign_mask64() (the gguf-order grids and the ksigns byte masks) stay as the
reference the tests compare against; they are not emitted any more.

Memory space, and why 16-bit codes. The tables are `TF_TABLE` (`__device__ const`): global
memory read through the read-only path (SASS LDG.E.*.CONSTANT, L1-resident), not `__constant__`
(which serializes a warp's distinct addresses). Every grid read is a gather with a different
index in every lane; L1 serves a gather one 128-byte line (wavefront) at a time, so its cost is
the number of distinct lines the warp touches, which grows with the table size: 32 random
indices into 64 lines (the old 8 KiB IQ2_S grid) touch ~25 lines, into 16 lines (2 KiB) ~14,
into 4 lines (512 B) ~4. The old sign-mask table (another gather per 8 weights) is gone: signs
are built with multiplies and byte_perm (gemv_fmt_lowbit.cuh). Shared memory would serve the
gathers with bank conflicts only (~4 wavefronts per random 32-lane gather) but needs the kernel
to stage the tables (the contract forbids shared memory inside dot).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

GRIDS = (("iq2xxs", 256, 8), ("iq2xs", 512, 8), ("iq2s", 1024, 8),
         ("iq3xxs", 256, 4), ("iq3s", 512, 4))


def sign_mask64() -> np.ndarray:
    """uint64[384]: 0..255 explicit sign byte -> 0x00/0xFF byte mask; 256 + i -> ksigns(i)."""
    from tightfit.quant import tables
    b = np.arange(256, dtype=np.uint64)
    mask = np.zeros(256, np.uint64)
    for j in range(8):
        mask |= ((b >> np.uint64(j)) & np.uint64(1)) * np.uint64(0xFF) << np.uint64(8 * j)
    return np.concatenate([mask, mask[tables.KSIGNS.astype(np.int64)]])


def grid_words(name: str) -> np.ndarray:
    """The named IQ grid packed little-endian: uint64 per entry (8 bytes) or uint32 (4 bytes)."""
    from tightfit.quant import tables
    g = tables.grid(name)
    if not (np.all(g >= 1) and np.all(g <= 127) and np.all(g == np.round(g))):
        raise ValueError(f"{name}: grid magnitudes must be integers in 1..127")
    g8 = np.ascontiguousarray(g.astype(np.uint8))
    return g8.view(np.uint64 if g8.shape[1] == 8 else np.uint32)[:, 0].copy()


def _codes(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct magnitudes, per-element code = index into them) of the named grid."""
    from tightfit.quant import tables
    g = tables.grid(name)
    vals = np.unique(g)
    if not (np.all(vals >= 1) and np.all(vals <= 127) and np.all(vals == np.round(vals))):
        raise ValueError(f"{name}: grid magnitudes must be integers in 1..127")
    return vals.astype(np.int64), np.searchsorted(vals, g).astype(np.uint32)


def grid16(name: str) -> np.ndarray:
    """uint16 code word per grid entry (layout in the module docstring)."""
    vals, c = _codes(name)
    if c.shape[1] == 8:
        if len(vals) != 3:
            raise ValueError(f"{name}: IQ2 grids have 3 magnitudes, got {len(vals)}")
        w = sum(c[:, j] << (4 * j) | c[:, j + 4] << (4 * j + 2) for j in range(4))
    else:
        if len(vals) != 8:
            raise ValueError(f"{name}: IQ3 grids have 8 magnitudes, got {len(vals)}")
        w = sum(c[:, j] << (4 * j) for j in range(4))
    return np.asarray(w, np.uint16)


def lut_words(name: str) -> list[int]:
    """byte_perm source words: IQ2 [P, N] (3 magnitudes, then 0), IQ3 [P0, P1, N0, N1]."""
    vals, _ = _codes(name)
    v = list(vals) + [0] * (8 - len(vals)) if len(vals) == 3 else list(vals)
    pos = [int(x) & 0xFF for x in v]
    neg = [(-int(x)) & 0xFF for x in v]
    word = lambda b: sum(x << (8 * i) for i, x in enumerate(b))  # noqa: E731
    if len(vals) == 3:
        return [word(pos[:4]), word(neg[:4])]
    return [word(pos[:4]), word(pos[4:]), word(neg[:4]), word(neg[4:])]


def _c_array(ctype: str, name: str, vals: np.ndarray, suffix: str, width: int) -> str:
    items = [f"0x{int(v):0{width}x}{suffix}" for v in vals]
    lines = [", ".join(items[i:i + 8]) for i in range(0, len(items), 8)]
    return (f"TF_TABLE {ctype} {name}[{len(items)}] = {{\n  " + ",\n  ".join(lines) + "\n};\n")


@lru_cache(maxsize=None)
def tables_source() -> str:
    """C source of every table of gemv_fmt_lowbit.cuh (names prefixed tf_ / TF_)."""
    out = ["// generated by tightfit/kernels/cuda/tables.py from tightfit.quant.tables\n"]
    for name, n, _group in GRIDS:
        w = grid16(name)
        assert w.shape == (n,), (name, w.shape)
        out.append(_c_array("uint16_t", f"tf_{name}_g16", w, "u", 4))
    iq2 = lut_words("iq2s")
    for name in ("iq2xxs", "iq2xs"):
        assert lut_words(name) == iq2, name      # the three IQ2 grids share the magnitudes
    out.append(f"#define TF_IQ2_LUT_P 0x{iq2[0]:08x}u\n#define TF_IQ2_LUT_N 0x{iq2[1]:08x}u\n")
    for name, tag in (("iq3xxs", "IQ3XXS"), ("iq3s", "IQ3S")):
        p0, p1, n0, n1 = lut_words(name)
        out.append(f"#define TF_{tag}_LUT_P0 0x{p0:08x}u\n#define TF_{tag}_LUT_P1 0x{p1:08x}u\n"
                   f"#define TF_{tag}_LUT_N0 0x{n0:08x}u\n#define TF_{tag}_LUT_N1 0x{n1:08x}u\n")
    return "".join(out)
