"""GEMV v2: y[N, n_out] = x[N, n_in] . W^T on GGUF quant blocks through int8 tensor cores.

Formats: IQ4_XS, Q4_K, Q5_K, Q6_K, Q3_K, Q8_0 (gemv2_layout.V2_TYPES); N = 1..16.

Per program: R rows; per K step KB macro-blocks (256 elements each) of those rows.
1. Load the quant fields as [R*KB, words] int32 tiles (a warp reads contiguous 16-byte vectors
   of one row's quants) and decode them with SWAR masks/shifts (IQ4 nibbles through prmt) into
   an int8 tile A[R, KB*256] whose offsets are already removed (gemv2_decode).
2. Split A into DD = KB*256/KDOT slices of KDOT elements and multiply each by the prepared,
   block-diagonal activation slice B[KDOT, COLS] (gemv2_act) with one batched int8 tl.dot:
   C[dd, r, gi*NP + n] = sum over group gi of slice dd of w*q  (int32, exact).
3. Epilogue per (slice, row, group, column): acc += C * (weight group scale) * (x scale).
   Q4_K/Q5_K also subtract dmin*m_j * d_x*sum(q_x) per 32 in the same epilogue.
The dot pads N only up to COLS ~ 16 columns, and GPD groups per dot shrink the epilogue at
small N, so N = 1..8 read W once and cost about the same. No output zeroing: without split-K
each program stores its rows; with split-K (few rows) partials go to a workspace that a tiny
second kernel sums.

TRITON_INTERPRET runs the same kernel with an integer emulation of prmt (EMU).

Small N: `config={"PATH": "dp4a"}` (or N <= SMALL_N by default) runs gemv2_small instead: dp4a on
the same coalesced word tiles, no tensor cores, for N = 1..2 (the tensor-core path pads N to 8-16
columns and is issue-bound there). SMALL_N = 0 until measured on the device (bench/gemv.py
--impls v1,v2,v2n1).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tightfit.kernels.gemv2_act import Act2, prep_act2, geometry
from tightfit.kernels.gemv2_decode import dec_iq4xs, dec_q45k, dec_q6k, dec_q3k, dec_q8_0
from tightfit.kernels.gemv2_layout import FORMATS, GROUP, MACRO, V2_TYPES, field_args
from tightfit.kernels.gemv2_small import gemv2_small_prepared

PERM = {23: 1}        # decode order of IQ4_XS inside each 32 (gemv2_act.perm_table)
PERM_SMALL = {23: 2}  # the same for the dp4a small-N path (gemv2_small)
# N <= SMALL_N runs the dp4a small-N path by default (0: only when config["PATH"] == "dp4a")
SMALL_N = 0


@triton.jit
def gemv2_kernel(w_ptr, b_ptr, xs_ptr, xsum_ptr, out_ptr, N, n_out, NB, P0, P1, P2, P3,
                 FMT: tl.constexpr, PLANAR: tl.constexpr, NP: tl.constexpr, S: tl.constexpr,
                 GPD: tl.constexpr, KDOT: tl.constexpr, R: tl.constexpr, KB: tl.constexpr,
                 SPLIT: tl.constexpr, EMU: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    NG: tl.constexpr = 256 // S
    COLS: tl.constexpr = GPD * NP
    DD: tl.constexpr = KB * 256 // KDOT
    RK: tl.constexpr = R * KB
    MINS: tl.constexpr = FMT == 12 or FMT == 13
    i = tl.arange(0, RK)
    row_i = pid_r * R + i // KB
    kb_i = i % KB
    dd = tl.arange(0, DD)
    # B^T tile offsets [DD, COLS, KDOT] (K contiguous) and x-scale offsets [DD, 1, GPD, NP]
    boff = ((dd[:, None, None] * COLS + tl.arange(0, COLS)[None, :, None]) * KDOT
            + tl.arange(0, KDOT)[None, None, :])
    bkb = (dd * KDOT) // 256                                  # macro-block of each slice
    g4 = tl.arange(0, GPD)[None, None, :, None]
    n4 = tl.arange(0, NP)[None, None, None, :]
    xoff = (dd[:, None, None, None] * GPD + g4) * NP + n4
    xkb = bkb[:, None, None, None]
    acc = tl.zeros([DD, R, GPD, NP], tl.float32)
    for kb0 in range(pid_k * KB, NB, KB * SPLIT):
        kb = kb0 + kb_i
        m = ((row_i < n_out) & (kb < NB))[:, None]
        blk = (row_i.to(tl.int64) * NB + kb)[:, None]
        if FMT == 23:
            A, ws = dec_iq4xs(w_ptr, blk, m, P0, P1, P2, PLANAR, EMU)
        elif FMT == 12:
            A, ws, mins = dec_q45k(w_ptr, blk, m, P0, P1, P2, P3, False, PLANAR)
        elif FMT == 13:
            A, ws, mins = dec_q45k(w_ptr, blk, m, P0, P1, P2, P3, True, PLANAR)
        elif FMT == 14:
            A, ws = dec_q6k(w_ptr, blk, m, P0, P1, P2, P3, PLANAR)
        elif FMT == 11:
            A, ws = dec_q3k(w_ptr, blk, m, P0, P1, P2, P3, PLANAR)
        else:
            A, ws = dec_q8_0(w_ptr, blk, m, P0, P1, PLANAR)
        A3 = tl.permute(tl.reshape(A, (R, DD, KDOT)), (1, 0, 2))            # [DD, R, KDOT]
        B3 = tl.permute(tl.load(b_ptr + kb0 * (256 * COLS) + boff,
                                mask=(kb0 + bkb < NB)[:, None, None], other=0),
                        (0, 2, 1))                                           # [DD, KDOT, COLS]
        C = tl.dot(A3, B3)                                                   # [DD, R, COLS]
        C4 = tl.reshape(C, (DD, R, GPD, NP))
        ws4 = tl.permute(tl.reshape(ws, (R, DD, GPD)), (1, 0, 2))[:, :, :, None]
        xs4 = tl.load(xs_ptr + kb0 * (NG * NP) + xoff, mask=kb0 + xkb < NB, other=0.0)
        if MINS:   # S = 32: the group is the x block; subtract dmin*m * d_x*sum(q_x)
            mn4 = tl.permute(tl.reshape(mins, (R, DD, GPD)), (1, 0, 2))[:, :, :, None]
            xm4 = tl.load(xsum_ptr + kb0 * (NG * NP) + xoff, mask=kb0 + xkb < NB, other=0.0)
            acc += C4.to(tl.float32) * (ws4 * xs4) - mn4 * xm4
        else:
            acc += C4.to(tl.float32) * (ws4 * xs4)
    y = tl.sum(tl.sum(acc, axis=0), axis=1)                                  # [R, NP]
    rows = pid_r * R + tl.arange(0, R)[:, None]
    n2 = tl.arange(0, NP)[None, :]
    omask = (rows < n_out) & (n2 < N)
    tl.store(out_ptr + pid_k * N * n_out + n2 * n_out + rows, y, mask=omask)


@triton.jit
def _reduce_kernel(part_ptr, out_ptr, total, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr = False):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mk = o < total
    if PDL:      # the split-K partials of the GEMV just before; total/1024 programs: one wave
        gdc_wait()
        gdc_launch_dependents()
    s = tl.zeros([BLOCK], tl.float32)
    for k in tl.static_range(SPLIT):
        s += tl.load(part_ptr + k * total + o, mask=mk, other=0.0)
    tl.store(out_ptr + o, s, mask=mk)


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def pick_config2(qtype: int, n: int, n_out: int, nb: int) -> dict:
    """R rows x KB macro-blocks per program, split-K factor, warps. Register budget: the
    decoded tile R*KB*256 bytes and the accumulator DD*R*COLS floats."""
    geo = geometry(GROUP[qtype], n)
    R, KB, warps = 64, 2, 8
    if triton.cdiv(n_out, R) < 132:
        R = 32
    # accumulator registers per thread: KB * (256/KDOT) * COLS * R / threads; keep it <= 32
    while KB > 1 and KB * (256 // geo["KDOT"]) * geo["COLS"] * R // (32 * warps) > 32:
        KB //= 2
    tiles = triton.cdiv(n_out, R)
    split = 1
    chunks = triton.cdiv(nb, KB)
    while tiles * split < 264 and split * 2 <= chunks and split < 16:
        split *= 2
    return {"R": R, "KB": KB, "SPLIT": split, "num_warps": warps}


def use_small(n: int, config: dict | None = None) -> bool:
    """Whether N columns run the dp4a small-N path (gemv2_small): config["PATH"] ("dp4a" or
    "tc") decides, else N <= SMALL_N."""
    path = (config or {}).get("PATH")
    if path not in (None, "dp4a", "tc"):
        raise ValueError(f"gemv v2: PATH={path!r}, expected 'dp4a' or 'tc'")
    if path is None:
        return n <= SMALL_N
    return path == "dp4a" and n <= 2


def prep_for(x: torch.Tensor, qtype: int, out: Act2 | None = None, small: bool = False) -> Act2:
    """Prepared activations for `qtype` (shareable by all v2 matrices with the same group size
    and decode order, e.g. Q4_K/Q5_K/Q8_0 together, Q6_K/Q3_K together). small=True: for the
    dp4a small-N path (its IQ4_XS decode order, no b)."""
    perm = (PERM_SMALL if small else PERM).get(qtype, 0)
    return prep_act2(x, GROUP[qtype], perm, out, with_b=not small)


def gemv2_prepared(act: Act2, w: torch.Tensor, qtype: int, n_out: int, planar: bool = False,
                   out: torch.Tensor | None = None, config: dict | None = None,
                   workspace: torch.Tensor | None = None) -> torch.Tensor:
    """`workspace`: fp32 buffer for split-K partials of the small-N path (at least SPLIT*N*n_out
    elements; None: allocated per call, which a CUDA graph then keeps in its pool)."""
    qtype = int(qtype)
    if qtype not in V2_TYPES:
        raise ValueError(f"gemv v2: type {qtype} not supported")
    n, n_in = act.n, act.k
    small = use_small(n, config)
    if not act.fits(GROUP[qtype], (PERM_SMALL if small else PERM).get(qtype, 0)):
        raise ValueError("gemv v2: activations were prepared for another format family or path")
    nb = n_in // 256
    if w.numel() != n_out * nb * MACRO[qtype]:
        raise ValueError(f"gemv v2: w has {w.numel()} bytes, expected "
                         f"{n_out}x{nb * MACRO[qtype]}")
    if out is None:
        out = torch.empty((n, n_out), dtype=torch.float32, device=w.device)
    emu = _interpret() or w.device.type != "cuda"
    if small:
        return gemv2_small_prepared(act, w, qtype, n_out, planar, out, config, emu, workspace)
    if not act.has_b:
        raise ValueError("gemv v2: activations were prepared without b (small-N path only)")
    cfg = dict(pick_config2(qtype, n, n_out, nb))
    if config:
        cfg.update({k: v for k, v in config.items() if k != "PATH"})
    geo = act.geo
    split = cfg["SPLIT"]
    dst = out if split == 1 else torch.empty((split, n, n_out), dtype=torch.float32,
                                             device=w.device)
    P = field_args(qtype, w.numel(), planar)
    grid = (triton.cdiv(n_out, cfg["R"]), split)
    gemv2_kernel[grid](w, act.b, act.xs, act.xsum, dst, n, n_out, nb, P[0], P[1], P[2], P[3],
                       FMT=qtype, PLANAR=bool(planar), NP=geo["NP"], S=geo["S"],
                       GPD=geo["GPD"], KDOT=geo["KDOT"], R=cfg["R"], KB=cfg["KB"],
                       SPLIT=split, EMU=emu,
                       num_warps=cfg["num_warps"])
    if split > 1:
        total = n * n_out
        BLOCK = 1024
        _reduce_kernel[(triton.cdiv(total, BLOCK),)](dst, out, total, SPLIT=split, BLOCK=BLOCK)
    return out


def gemv2(x: torch.Tensor, w: torch.Tensor, qtype: int, n_out: int, n_in: int,
          out: torch.Tensor | None = None, planar: bool = False,
          config: dict | None = None) -> torch.Tensor:
    """y[N, n_out] fp32 = x[N, n_in] . W^T; W = n_out rows of GGUF blocks (raw, or planar when
    `planar`: see gemv2_layout.relayout)."""
    if x.dim() == 1:
        x = x[None, :]
    if x.shape[1] != n_in:
        raise ValueError(f"gemv v2: x has {x.shape[1]} columns, expected {n_in}")
    act = prep_for(x, int(qtype), small=use_small(x.shape[0], config))
    return gemv2_prepared(act, w, qtype, n_out, planar=planar, out=out, config=config)


__all__ = ["gemv2", "gemv2_prepared", "prep_for", "pick_config2", "use_small", "SMALL_N",
           "V2_TYPES", "FORMATS"]
