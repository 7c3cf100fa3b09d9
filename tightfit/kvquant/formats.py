"""Quantized KV-cache formats: q8_0 and the TurboQuant-style tq2/tq3/tq4 (spec quant-formats §6).

Every format stores one K (or V) head row of D = head_dim values as one byte row of
`row_bytes(D)` bytes, cache tensor `uint8 [capacity, n_head_kv, row_bytes]`. The row is planar
(all code bytes, then all fp16 scales) so a kernel reads each plane with one strided load; the
byte count is exactly that of the equivalent block-interleaved layout.

**q8_0** (ggml's Q8_0 numerics, no rotation): per block of 32 values one fp16 scale
d = amax/127 and 32 int8 codes q = round(x/d); value = d*q.
Row: [int8 q x D | fp16 d x D/32].  34 B / 32 values = 8.5 bits per value.

**tqB / tqB_128** (TurboQuant_mse, B = 2, 3, 4 code bits; norm block G = 32, or 128 for `_128`):
  1. rotate the whole row once: y = R x, R = D2 . H_D . D1 / sqrt(D) (H_D the Sylvester Hadamard
     matrix, D1, D2 fixed random +-1 diagonals from `rotation_signs(D, seed)`; R is orthogonal,
     so <R q, R k> = <q, k> and attention can run in the rotated domain);
  2. per block b of G consecutive rotated values: g = |y_b|, u = sqrt(G) y_b / g, and each
     coordinate gets the index of the nearest level of the Lloyd-Max codebook C_{G,B} for the
     law of u_i (scaled Beta, ~N(0,1); made by scripts/kv_codebooks.py);
  3. the block's fp16 scale is s = g / |C[idx]|, so that the reconstruction s*C[idx] has exactly
     the norm of y_b (the "corrected norm" of spec §6.3 step 5; it halves the shrinkage of
     inner products an MSE quantizer has, see tightfit/kvquant/quality.py);
  value (rotated domain) = s * C[idx]; x = R^T y.
  Code planes of a row: B=4: D/2 bytes, nibbles, even element in the low nibble;
  B=3: D/4 bytes of the low 2 bits (element e at bits 2(e%4) of byte e/4) then D/8 bytes of the
  high bit (bit e%8 of byte e/8); B=2: D/4 bytes as the low plane of B=3. Then D/G fp16 scales.

| name     | bits | G   | bytes / 32 | bytes / 128 | bytes / 256 | bits/value |
|----------|------|-----|-----------:|------------:|------------:|-----------:|
| q8_0     | 8    | 32  | 34         | 136         | 272         | 8.5        |
| tq4      | 4    | 32  | 18         | 72          | 144         | 4.5        |
| tq3      | 3    | 32  | 14         | 56          | 112         | 3.5        |
| tq2      | 2    | 32  | 10         | 40          | 80          | 2.5        |
| tq4_128  | 4    | 128 | (66/128)   | 66          | 132         | 4.125      |
| tq3_128  | 3    | 128 | (50/128)   | 50          | 100         | 3.125      |

tq3 is seed 004's "14 bytes per 32 values" (3.5 bits) with the rotation over the whole 256-wide
head instead of 32/128 values; tq3_128 has the byte count of the current "turbo3" block. The
`_128` formats need D to be a multiple of 128 (every row of the 27B); 32 values is their
smallest addressable unit only inside a 128-block. K and V may use different formats: a KV type
name `<k>+<v>` (e.g. `q8_0+tq3`, "keep K precise", spec §6.5) prices each half with its format.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

# Lloyd-Max levels (unit variance) of the scaled Beta law f_G, from scripts/kv_codebooks.py.
CODEBOOKS: dict[tuple[int, int], tuple[float, ...]] = {
    (32, 2): (-1.4895558, -0.4514260, 0.4514260, 1.4895558),
    (32, 3): (-2.0719133, -1.3149805, -0.7453118, -0.2423992, 0.2423992, 0.7453118, 1.3149805,
              2.0719133),
    (32, 4): (-2.5649319, -1.9794161, -1.5644233, -1.2228947, -0.9215569, -0.6442477, -0.3813778,
              -0.1263024, 0.1263024, 0.3813778, 0.6442477, 0.9215569, 1.2228947, 1.5644233,
              1.9794161, 2.5649319),
    (128, 2): (-1.5051871, -0.4524504, 0.4524504, 1.5051871),
    (128, 3): (-2.1314323, -1.3365582, -0.7532985, -0.2444126, 0.2444126, 0.7532985, 1.3365582,
               2.1314323),
    (128, 4): (-2.6887633, -2.0458176, -1.6042273, -1.2476563, -0.9369954, -0.6535401, -0.3863299,
               -0.1278545, 0.1278545, 0.3863299, 0.6535401, 0.9369954, 1.2476563, 1.6042273,
               2.0458176, 2.6887633),
}
#: E[(t - Q(t))²] per coordinate for t ~ f_G: the normalized MSE D_mse the codebook reaches on an
#: ideally rotated vector (compare: paper's bounds 4^-B <= D_mse <= (sqrt(3) pi / 2) 4^-B).
CODEBOOK_MSE = {(32, 2): 0.111600, (32, 3): 0.032261, (32, 4): 0.008774,
                (128, 2): 0.116000, (128, 3): 0.033966, (128, 4): 0.009315}

DEFAULT_SEED = 0x7417F17


@dataclass(frozen=True)
class KVQuantFormat:
    name: str
    bits: int            # code bits per value
    group: int           # values per fp16 scale (norm block)
    rotate: bool         # TurboQuant rotation + codebook (False: q8_0 linear codes)

    @property
    def block_bytes(self) -> int:
        return self.group * self.bits // 8 + 2

    @property
    def bits_per_value(self) -> float:
        return 8.0 * self.block_bytes / self.group

    def codes_bytes(self, D: int) -> int:
        return D * self.bits // 8

    def row_bytes(self, D: int) -> int:
        """Bytes of one head row of D values (D must be a multiple of `group`)."""
        self.check_dim(D)
        return (D // self.group) * self.block_bytes

    def bytes_for(self, n_elems: int) -> int:
        """Exact bytes of n_elems values stored as whole blocks."""
        return -(-n_elems // self.group) * self.block_bytes

    def check_dim(self, D: int) -> None:
        if D % self.group:
            raise ValueError(f"KV format {self.name} needs head_dim divisible by {self.group}, got {D}")
        if self.rotate and (D & (D - 1)):
            raise ValueError(f"KV format {self.name} needs a power-of-two head_dim, got {D}")

    def codebook(self) -> torch.Tensor:
        """float32 [2^bits] levels (unit variance); q8_0 has none."""
        if not self.rotate:
            raise ValueError("q8_0 has no codebook")
        return torch.tensor(CODEBOOKS[(self.group, self.bits)], dtype=torch.float32)


FORMATS: dict[str, KVQuantFormat] = {
    "q8_0": KVQuantFormat("q8_0", 8, 32, False),
    "tq4": KVQuantFormat("tq4", 4, 32, True),
    "tq3": KVQuantFormat("tq3", 3, 32, True),
    "tq2": KVQuantFormat("tq2", 2, 32, True),
    "tq4_128": KVQuantFormat("tq4_128", 4, 128, True),
    "tq3_128": KVQuantFormat("tq3_128", 3, 128, True),
}

#: KV types with different K and V formats that `register_planner_formats` also registers.
MIXED = ("q8_0+tq4", "q8_0+tq3", "tq4+tq3", "tq4+tq2")


def get_format(name: str) -> KVQuantFormat:
    try:
        return FORMATS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown KV quant format {name!r}; known: {', '.join(FORMATS)}") from None


def split_kv_type(kv_type: str) -> tuple[str, str]:
    """'tq3' -> ('tq3', 'tq3'); 'q8_0+tq3' -> ('q8_0', 'tq3') (K format first)."""
    parts = kv_type.lower().split("+")
    if len(parts) == 1:
        return parts[0], parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"bad KV type {kv_type!r}: use <fmt> or <k_fmt>+<v_fmt>")


def kv_bytes_per_token(kv_type: str, n_head_kv: int, head_dim: int, n_attn_layers: int) -> int:
    """Exact cache bytes per token: layers x (K row bytes + V row bytes) x heads (f16 = 2 B/value)."""
    def row(name: str) -> int:
        return 2 * head_dim if name == "f16" else get_format(name).row_bytes(head_dim)
    k, v = split_kv_type(kv_type)
    return n_attn_layers * n_head_kv * (row(k) + row(v))


# ---- rotation --------------------------------------------------------------------------------
def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def rotation_signs(D: int, seed: int = DEFAULT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """The two fixed +-1 diagonals (float32 [D] each). Entry i of D1 is +1 when bit 0 of
    splitmix64(seed + i) is 1, else -1; entry i of D2 uses splitmix64(seed + D + i). Seedable, and
    reproducible in any language from the seed alone."""
    bits = [_splitmix64((seed + i) & 0xFFFFFFFFFFFFFFFF) & 1 for i in range(2 * D)]
    s = torch.tensor(bits, dtype=torch.float32) * 2 - 1
    return s[:D].clone(), s[D:].clone()


def hadamard(D: int, dtype=torch.float64) -> torch.Tensor:
    """Sylvester Hadamard matrix H_D (entries +-1, H[i, j] = (-1)^popcount(i & j))."""
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < D:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@lru_cache(maxsize=16)
def _rotation_cpu(D: int, seed: int) -> torch.Tensor:
    d1, d2 = rotation_signs(D, seed)
    return (d2.double()[:, None] * hadamard(D) * d1.double()[None, :]) / math.sqrt(D)


def rotation_matrix(D: int, seed: int = DEFAULT_SEED, dtype=torch.float64,
                    device: str | torch.device = "cpu") -> torch.Tensor:
    """R = D2 H D1 / sqrt(D), [D, D]: y = R @ x rotates, x = R.T @ y un-rotates."""
    return _rotation_cpu(D, seed).to(dtype=dtype, device=device)
