"""The one GEMV skeleton all quantized formats share: y[n, r] = sum_k x[n, k] * W[r, k].

Grid: (row tiles of R rows, SPLIT slices of K). A program walks its rows' 256-element
macro-blocks KB at a time: a [R, KB] tensor of (row, block) pairs, each decoded once by the
format body and multiplied against all NP activation columns inside the same program, so W is
read once whatever N is. Accumulation is a [NP, R, KB] float32 tensor, summed over KB at the end.
With SPLIT > 1 the slices add into a zeroed output with atomics (small n_out needs more programs
than row tiles to fill 132 SMs).
"""
from __future__ import annotations

import triton
import triton.language as tl

from tightfit.kernels.gemv_k import blk_q4k_q5k, blk_q6k, blk_q3k, blk_q2k_tq2, blk_iq4xs
from tightfit.kernels.gemv_q8 import (blk_q8_0, blk_q4_0_q5_0, blk_iq4nl, blk_q2_0, blk_q1_0,
                                     blk_tq1_0)
from tightfit.kernels.gemv_iq import blk_iq2, blk_iq3

# bytes of one 256-element macro-block, by ggml type id
MACRO_BYTES = {8: 272, 2: 144, 6: 176, 20: 144, 42: 72, 41: 36,
               10: 84, 11: 110, 12: 144, 13: 176, 14: 210, 23: 136, 35: 66, 34: 54,
               16: 66, 17: 74, 22: 82, 18: 98, 21: 110}
# activation element order inside each 32 (see quantize_act.py)
ACT_LAYOUT = {20: 1, 23: 1, 42: 2, 41: 3}


@triton.jit
def gemv_q_kernel(w_ptr, xq_ptr, da_ptr, s16_ptr, out_ptr, tg_ptr, tsm_ptr,
                  N, n_out, NB, row_bytes,
                  FMT: tl.constexpr, MB: tl.constexpr, NP: tl.constexpr,
                  R: tl.constexpr, KB: tl.constexpr, SPLIT: tl.constexpr, EMU: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * R + tl.arange(0, R)
    rmask = rows < n_out
    nid = tl.arange(0, NP)[:, None, None]
    nmask = nid < N
    KW = NB * 64
    rbase = w_ptr + rows.to(tl.int64)[:, None] * row_bytes
    acc = tl.zeros([NP, R, KB], tl.float32)
    zr = (rows * 0)[None, :, None]   # gives the activation pointers the full [NP, R, KB] shape
    for kb0 in range(pid_k * KB, NB, KB * SPLIT):
        kb = kb0 + tl.arange(0, KB)
        kmask = kb < NB
        m = rmask[:, None] & kmask[None, :]
        base = rbase + kb[None, :] * MB
        km = nmask & kmask[None, None, :] & (zr == 0)
        kb3 = kb[None, None, :] + zr
        xa = xq_ptr.to(tl.pointer_type(tl.int32)) + nid * KW + kb3 * 64
        dab = da_ptr + nid * (NB * 8) + kb3 * 8
        s16b = s16_ptr + nid * (NB * 16) + kb3 * 16
        if FMT == 12:
            acc = blk_q4k_q5k(base, m, xa, dab, s16b, km, acc, KW, False, EMU)
        elif FMT == 13:
            acc = blk_q4k_q5k(base, m, xa, dab, s16b, km, acc, KW, True, EMU)
        elif FMT == 14:
            acc = blk_q6k(base, m, xa, dab, s16b, km, acc, KW, EMU)
        elif FMT == 11:
            acc = blk_q3k(base, m, xa, dab, s16b, km, acc, KW, EMU)
        elif FMT == 10:
            acc = blk_q2k_tq2(base, m, xa, dab, s16b, km, acc, KW, False, EMU)
        elif FMT == 35:
            acc = blk_q2k_tq2(base, m, xa, dab, s16b, km, acc, KW, True, EMU)
        elif FMT == 23:
            acc = blk_iq4xs(base, m, xa, dab, s16b, km, acc, KW, EMU)
        elif FMT == 8:
            acc = blk_q8_0(base, m, xa, dab, s16b, km, acc, KW, EMU)
        elif FMT == 2:
            acc = blk_q4_0_q5_0(base, m, xa, dab, s16b, km, acc, KW, False, EMU)
        elif FMT == 6:
            acc = blk_q4_0_q5_0(base, m, xa, dab, s16b, km, acc, KW, True, EMU)
        elif FMT == 20:
            acc = blk_iq4nl(base, m, xa, dab, s16b, km, acc, KW, EMU)
        elif FMT == 42:
            acc = blk_q2_0(base, m, xa, dab, s16b, km, acc, KW, EMU)
        elif FMT == 41:
            acc = blk_q1_0(base, m, xa, dab, s16b, km, acc, KW, EMU)
        elif FMT == 34:
            acc = blk_tq1_0(base, m, xa, dab, s16b, km, acc, KW, EMU)
        elif FMT == 18 or FMT == 21:
            acc = blk_iq3(base, m, xa, dab, s16b, km, acc, KW, tg_ptr, tsm_ptr, FMT, EMU)
        else:
            acc = blk_iq2(base, m, xa, dab, s16b, km, acc, KW, tg_ptr, tsm_ptr, FMT, EMU)
    nid2 = tl.arange(0, NP)[:, None]
    y = tl.sum(acc, axis=2)                      # [NP, R]
    optr = out_ptr + nid2 * n_out + rows[None, :]
    omask = (nid2 < N) & rmask[None, :]
    if SPLIT == 1:
        tl.store(optr, y, mask=omask)
    else:
        tl.atomic_add(optr, y, mask=omask)
