"""GEMV for float weights (F32, F16, BF16) stored as GGUF rows: y[n, r] = sum_k x[n, k] W[r, k].

No quantization of x here: weights are widened to fp32 and multiplied in fp32 (these tensors are
small in the 27B mix: norms, ssm vectors; a big F16 matrix would read 2-4x the bytes of a quant).
Same layout idea as the quantized skeleton: [NP, R, BK] tiles, NP columns in one program.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gemv_float_kernel(w_ptr, x_ptr, out_ptr, N, n_out, K,
                      WDT: tl.constexpr, NP: tl.constexpr, R: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * R + tl.arange(0, R)
    rmask = rows < n_out
    nid = tl.arange(0, NP)[:, None, None]
    acc = tl.zeros([NP, R, BK], tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        km = kk < K
        m = rmask[:, None] & km[None, :]
        off = rows.to(tl.int64)[:, None] * K + kk[None, :]
        if WDT == 0:
            w = tl.load(w_ptr.to(tl.pointer_type(tl.float32)) + off, mask=m, other=0.0)
        elif WDT == 1:
            w = tl.load(w_ptr.to(tl.pointer_type(tl.float16)) + off, mask=m, other=0.0)
            w = w.to(tl.float32)
        else:
            # bf16 -> fp32 is a 16-bit shift of the bit pattern
            b = tl.load(w_ptr.to(tl.pointer_type(tl.uint16)) + off, mask=m, other=0)
            w = (b.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        x = tl.load(x_ptr + nid * K + kk[None, None, :], mask=(nid < N) & km[None, None, :],
                    other=0.0)
        acc += w[None, :, :] * x
    nid2 = tl.arange(0, NP)[:, None]
    y = tl.sum(acc, axis=2)
    tl.store(out_ptr + nid2 * n_out + rows[None, :], y,
             mask=(nid2 < N) & rmask[None, :])
