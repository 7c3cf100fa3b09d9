"""The KV formats' randomized Hadamard rotation R = D2 H D1 / sqrt(D) (tightfit/kvquant/formats.py)
applied to a row held in registers, without reading the [D, D] matrix.

Why: the write kernel (kv_write_q) used to form R x as a dense product, streaming R (256 KiB at
D = 256) from L2 in 16 serial tiles per program. Those tiles are a chain of L2 round trips, and
session 8's step profile put it at ~20 us per attention layer for the q rotation alone (the f16
prep kernel takes ~2 us). Here H x is two small Kronecker factors, H_D = H_A (x) H_B (Sylvester
order: H[i, j] = (-1)^popcount(i & j), and popcount splits over the high / low index bits), so
with X = x viewed [A, B]:  (H x)[c*B + d] = sum_a H_A[c, a] sum_b H_B[d, b] X[a, b]. The +-1
entries come from the index bits, so nothing is loaded but x.

The signs are read back from R itself (row 0 and column 0: H's first row and column are all +1),
so R stays the one workspace input of the write and attention kernels: with
s_in[k] = sign R[0, k], s_out[j] = sign R[j, 0] * sign R[0, 0] and c = |R[0, 0]| (the fp32 value
of 1 / sqrt(D) the matrix holds), R[j, k] = s_out[j] H[j, k] s_in[k] c exactly, so
    R x   = s_out * H(s_in * x) * c,        R^T y = s_in * H(s_out * y) * c.
The fp32 sums are taken in a different order than the dense product, so results differ from
x @ R.T by a few ulp (the tests bound it against the float64 product).

`rotate_rows` launches the helper over rows (the tests' way in; `rotate_rows_ref` is its torch
reference, the dense product)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def hadamard_split(D: int) -> int:
    """A of D = A * B (both powers of two, A <= B): the outer Kronecker factor."""
    if D < 4 or D & (D - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim >= 4, got {D}")
    a = 1
    while a * a * 4 <= D:
        a *= 2
    return a


@triton.jit
def _hneg(v):
    """True where (-1)^popcount(v) = -1, for v < 256."""
    v = v ^ (v >> 4)
    v = v ^ (v >> 2)
    v = v ^ (v >> 1)
    return (v & 1) != 0


@triton.jit
def hadamard(x, D: tl.constexpr, A: tl.constexpr):
    """H_D x (unnormalized, Sylvester order) for one row x [D] in registers. The +-1 factors are
    selects, not products: Triton turns a broadcast product summed over its last axis into a
    tl.dot, which on sm_90 rounds x to TF32 (3e-4 relative; seen on the H200, session 8)."""
    B: tl.constexpr = D // A
    ia = tl.arange(0, A)
    ib = tl.arange(0, B)
    X = tl.reshape(x, [A, B])
    nb = _hneg(ib[:, None] & ib[None, :])                                   # [B(d), B(b)]
    Xb = tl.broadcast_to(X[:, None, :], [A, B, B])
    Z = tl.sum(tl.where(nb[None, :, :], -Xb, Xb), axis=2)                   # [A, B(d)]
    na = _hneg(ia[:, None] & ia[None, :])                                   # [A(c), A(a)]
    Zb = tl.broadcast_to(Z[None, :, :], [A, A, B])
    Y = tl.sum(tl.where(na[:, :, None], -Zb, Zb), axis=1)                   # [A(c), B]
    return tl.reshape(Y, [D])


@triton.jit
def rotate(x, r_ptr, D: tl.constexpr, A: tl.constexpr, TRANSPOSE: tl.constexpr = False):
    """R x (TRANSPOSE: R^T x) for one fp32 row x [D] in registers; R row-major [D, D] in memory,
    of which only row 0 and column 0 are read (see the module docstring)."""
    d = tl.arange(0, D)
    r0 = tl.load(r_ptr + d)                       # R[0, k]
    c0 = tl.load(r_ptr + d * D)                   # R[j, 0]
    r00 = tl.load(r_ptr)
    s_in = tl.where(r0 < 0, -1.0, 1.0)
    s_out = tl.where(c0 < 0, -1.0, 1.0) * tl.where(r00 < 0, -1.0, 1.0)
    if TRANSPOSE:
        return s_in * hadamard(s_out * x, D, A) * tl.abs(r00)
    else:
        return s_out * hadamard(s_in * x, D, A) * tl.abs(r00)


@triton.jit
def _rotate_rows_kernel(x_ptr, r_ptr, y_ptr, D: tl.constexpr, A: tl.constexpr,
                        TRANSPOSE: tl.constexpr):
    p = tl.program_id(0)
    d = tl.arange(0, D)
    x = tl.load(x_ptr + p * D + d)
    tl.store(y_ptr + p * D + d, rotate(x, r_ptr, D, A, TRANSPOSE))


def rotate_rows(x: torch.Tensor, R: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """Rows x [N, D] fp32 -> x @ R.T (transpose: x @ R), one program per row."""
    N, D = x.shape
    y = torch.empty_like(x)
    _rotate_rows_kernel[(N,)](x.contiguous(), R.contiguous(), y, D=D, A=hadamard_split(D),
                              TRANSPOSE=transpose, num_warps=4)
    return y


def rotate_rows_ref(x: torch.Tensor, R: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """The dense product in float64."""
    R64 = R.double()
    return x.double() @ (R64 if transpose else R64.T)
