"""Which GEMV kernel a device matrix uses in the one-token decode step, and the activation buffers
that kernel reads.

Measured on the H200 (bench/RESULTS.md, session 2 call 1): at N = 1-2, v2's dp4a small-N path
(gemv2_small, one 256-weight block per thread) on raw GGUF blocks beats v1 by 1.16-1.45x on IQ4_XS,
1.7-1.8x on Q4_K / Q5_K and 1.33-1.53x on Q6_K; on raw Q3_K it is no faster (0.94x; its 2-byte
aligned blocks need the planar layout) and Q8_0 was not measured. So those four types take the small
path; everything else stays on v1 (gemv.gemv_quantized). TIGHTFIT_GEMV=v1 forces v1 everywhere.

The two paths quantize x differently, so a matrix's *activation layout* names both the path and the
int8 format of x it needs:
- v1 layouts are gemv_kernel.ACT_LAYOUT's small integers (0 natural, 1 IQ4 order, ...), buffers
  q int8 [1, k], d fp32 [1, k/32], s16 int32 [1, k/16] (quantize_act);
- small-path layouts are SMALL_BASE + 10 * (scale group 16) + decode order: 100 (Q4_K, Q5_K, Q8_0:
  groups of 32), 102 (IQ4_XS: groups of 32, lookup order 2), 110 (Q6_K: groups of 16); buffers q
  int8 [1, k], xs fp32 [1, k/S], xsum fp32 [1, k/32] and a 1-byte placeholder b (gemv2_act).
- CUDA layout 200 (CUDA_LAYOUT): the CUDA C++ kernel (gemv_cuda, NVRTC via cupy) on raw blocks,
  taken for every type it supports when gemv_cuda.available() (cupy + CUDA, TIGHTFIT_GEMV not
  'triton' / 'v1'); buffers are exactly layout 0's (q, d, s16; make_act gives a layout-0
  QuantAct) with any number of columns, no split-K partials. TIGHTFIT_GEMV=triton keeps the
  Triton routing above, v1 forces v1.
Matrices with the same input buffer and layout share one quantized copy of x (the executor quantizes
each (input, layout) once per step). Split-K partials of the small path go to one planned buffer
(`split_floats` sizes it) instead of an allocation inside the captured graph.
"""
from __future__ import annotations

import os

import torch

from tightfit.kernels import gemv as gm
from tightfit.kernels.gemv2 import PERM_SMALL, gemv2_prepared
from tightfit.kernels.gemv2_act import Act2, geometry, prep_act2
from tightfit.kernels.gemv2_layout import GROUP
from tightfit.kernels.gemv2_small import pick_config_small
from tightfit.kernels.quantize_act import QuantAct, quantize_act

# IQ4_XS, Q4_K, Q5_K, Q6_K, Q8_0 (raw blocks). Q8_0 is here for the 96 tiny GDN gate matrices
# (ssm_alpha / ssm_beta, 5120 -> 48): v1 runs them on ~6 programs at ~20 us each (step profile,
# 2.5 ms per token for v1's 117 calls); the small path splits K over 8 programs
SMALL_TYPES = frozenset({23, 12, 13, 14, 8})
SMALL_BASE = 100
CUDA_LAYOUT = 200


def cuda_routed(qtype: int) -> bool:
    """Whether `qtype` matrices run on the CUDA C++ GEMV (gemv_cuda) in this process: cupy and a
    GPU present, the type supported, and its module compiled (NVRTC) - a compile failure (old
    driver, broken toolchain) routes the type to the Triton kernels with a warning instead of
    failing the first decode step."""
    try:
        from tightfit.kernels import gemv_cuda as gc
    except Exception:  # noqa: BLE001 - module import problems: Triton routing
        return False
    return gc.available() and gc.supported(int(qtype)) and _cuda_compiles(int(qtype))


_COMPILED: dict[int, bool] = {}


def _cuda_compiles(qtype: int) -> bool:
    if qtype not in _COMPILED:
        from tightfit.kernels import gemv_cuda as gc
        try:
            gc.prepare(qtype)
            _COMPILED[qtype] = True
        except Exception as e:  # noqa: BLE001 - any compile/load failure: keep the Triton path
            import warnings
            warnings.warn(f"CUDA GEMV for GGML type {qtype} is unavailable ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); using the Triton kernels",
                          RuntimeWarning, stacklevel=2)
            _COMPILED[qtype] = False
    return _COMPILED[qtype]


def small_enabled() -> bool:
    return os.environ.get("TIGHTFIT_GEMV", "auto").strip().lower() != "v1"


def act_layout(qtype: int) -> int:
    """The activation layout the decode step's GEMV of a `qtype` matrix reads (module docstring)."""
    t = int(qtype)
    if cuda_routed(t):
        return CUDA_LAYOUT
    if t in SMALL_TYPES and small_enabled():
        return SMALL_BASE + (10 if GROUP[t] == 16 else 0) + PERM_SMALL.get(t, 0)
    return int(gm.ACT_LAYOUT.get(t, 0))


def is_small(layout: int) -> bool:
    return SMALL_BASE <= int(layout) < CUDA_LAYOUT


def is_cuda(layout: int) -> bool:
    return int(layout) == CUDA_LAYOUT


def producer_writable(layout: int) -> bool:
    """Whether a producer kernel (norm.py's quant_out=) can write x's int8 copy for `layout`:
    the quantize_act layouts 0-3, or the CUDA layout (layout 0's buffers); not the small path's."""
    from tightfit.kernels.quantize_act import LAYOUTS
    return is_cuda(layout) or 0 <= int(layout) < len(LAYOUTS)


def _small_params(layout: int) -> tuple[int, int]:
    """(scale group S, decode order perm) of a small-path layout."""
    r = int(layout) - SMALL_BASE
    return (16 if r >= 10 else 32), r % 10


def act_buffers(layout: int, k: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(suffix, shape, dtype) of the buffers holding x [1, k] quantized for `layout`."""
    if is_small(layout):
        S, _ = _small_params(layout)
        return [("q", (1, k), "i8"), ("xs", (1, k // S), "f32"), ("xsum", (1, k // 32), "f32"),
                ("b", (1,), "i8")]
    return [("q", (1, k), "i8"), ("d", (1, k // 32), "f32"), ("s16", (1, k // 16), "i32")]


def make_act(layout: int, bufs: dict[str, torch.Tensor], n: int, k: int):
    """The prepared-activation object over the buffers of `act_buffers` (suffix -> tensor)."""
    if is_small(layout):
        S, perm = _small_params(layout)
        nkb = k // 256
        return Act2(bufs["b"], bufs["xs"].view(nkb, 256 // S, 1), bufs["xsum"].view(nkb, 8, 1),
                    bufs["q"].view(n, k), n, k, geometry(S, n), perm)
    if is_cuda(layout):
        return QuantAct(bufs["q"].view(n, k), bufs["d"].view(n, k // 32),
                        bufs["s16"].view(n, k // 16), 0, n, k)
    return QuantAct(bufs["q"], bufs["d"], bufs["s16"], int(layout), n, k)


def new_act(layout: int, n: int, k: int, device) -> object:
    """Freshly allocated activation buffers (legacy path / tests; the placed path plans them)."""
    dt = {"i8": torch.int8, "f32": torch.float32, "i32": torch.int32}
    bufs = {s: torch.empty(shape, dtype=dt[d], device=device)
            for s, shape, d in act_buffers(layout, k)}
    return make_act(layout, bufs, n, k)


def quantize_into(x: torch.Tensor, layout: int, act):
    """Quantize x [1, k] into `act` (made by make_act / new_act for this layout)."""
    if is_small(layout):
        S, perm = _small_params(layout)
        return prep_act2(x, S, perm, out=act, with_b=False)
    return quantize_act(x, 0 if is_cuda(layout) else int(layout), out=act)


def split_floats(qtype: int, n_in: int, n_out: int, n: int = 1) -> int:
    """fp32 elements of split-K partials the small path needs for this matrix (0: no split)."""
    if int(qtype) not in SMALL_TYPES or n_in % 256 or cuda_routed(qtype):
        return 0
    cfg = pick_config_small(int(qtype), n, n_out, n_in // 256)
    return cfg["SPLIT"] * n * n_out if cfg["SPLIT"] > 1 else 0


def split_bound(n: int = 1) -> int:
    """fp32 elements enough for the split-K partials of ANY matrix on the small path:
    pick_config_small doubles SPLIT only while tiles * SPLIT < 264 (so SPLIT * tiles < 528), or
    sets SPLIT = 2 when tiles < 528; either way SPLIT * n_out <= 1056 * R (R = 64 rows)."""
    return 1056 * 64 * n


# Smallest column count at which the tensor-core kernel (gemv_mma) beat the CUDA GEMV, from the
# H200 runs of session 5 (bench/RESULTS.md, "tensor-core skinny GEMM"): its time is nearly flat in
# N (t(8)/t(1) 1.03-1.2) while gemv_cuda's grows 1.5x at N = 2 and 2.5-3.2x at N = 8. Q4_K / Q5_K
# tie at N = 2, IQ4_XS at N = 3; Q6_K measured a win at N = 8 (loss at 4); Q8_0 ties at 8 and wins at
# 16 (above 8 gemv_cuda launches twice). ON by default (TIGHTFIT_GEMV_MMA=0 turns it off). History:
# session 10 made it opt-in because two batched prefills of one prompt on the seed-mix 27B differed
# by 12 % (relative L2 of the logits) with it. Cause (measured, session 11): its split tiles were
# summed with atomics (~1e-7 run to run), and the model amplifies a 1e-7 change (blk.0.attn_norm
# scaled by 1 + 1e-7) into 1.38e-1 relative L2 of the logits on the GPU (bench/spec_exact.py
# --perturb 1e-7), while every routed call of a prefill checked in place matched gemv_cuda to
# <= 2.6e-7 (bench/mma_bisect.py): the atomics' order amplified, not a kernel bug. The kernel now
# sums split tiles in a fixed order (deterministic stream-K fixup, gemv_mma.py): bitwise repeatable
# (tests/test_gemv_mma_device.py; two prefills identical on the 27B, bench/spec_exact.py). Cost of
# that order: the 27B's captured verify block at M = 5 takes 14.86 ms with it, 12.80 with the
# atomics (session 10), 16.27 without the kernel (session 11, bench/RESULTS.md).
# The decode step (N = 1) never routes here.
MMA_MIN_N = {12: 3, 13: 3, 23: 4, 14: 8, 8: 9}
# The grid formats (gemv_mma_iq.cuh, session 24): IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S, on the cp.async
# ring (gemv_mma.PIPE_DEFAULT_TYPES). Their time is flat in N at ~40 us on the 27B's FFN shapes
# (the grid decode, as dp4a's, is the cost), gemv_cuda's 21-29 us at N = 1 and 45-55 at N = 5
# (bench/RESULTS.md session 24 call 1), so they route from 5 columns (N = 2-4 not measured).
# TIGHTFIT_MMA_GRID=0 keeps them on gemv_cuda (A/B timing).
MMA_MIN_N_GRID = {17: 5, 18: 5, 21: 5, 22: 5}
# Q6_K on the cp.async-pipelined kernel (gemv_mma_pipe, its default since session 10): at N = 5
# 52.0 / 55.9 / 501 us vs gemv_cuda's 56.8 / 61.3 / 693 on 5120->17408 / 17408->5120 / the output
# head (bench/RESULTS.md session 10, call 1), so it routes from N = 5 (N = 4 not measured).
MMA_MIN_N_PIPE = {14: 5}


# Smaller matrices cross over later: the tensor-core kernel has a fixed cost of ~10 us (its
# stream-K grid spans every resident warp, so a small matrix is cut into many pieces per tile
# group), while the CUDA GEMV's time shrinks with the matrix. Per type: (largest n_in * n_out,
# smallest N routed) buckets, from the H200 at N = 2, 3, 5, 8 on the 27B's shapes (session 14,
# call 11, bench/RESULTS.md): e.g. Q5_K 5120->1024 at N = 5 7.4 us on gemv_cuda against 13.7 on
# gemv_mma, IQ4_XS 5120->6144 16.2 against 19.3; from 17408 rows or columns the table above holds.
# A bucket never lowers a type's crossover (the larger of the two applies).
MMA_MIN_N_BY_SIZE = {
    23: ((8 << 20, 9), (40 << 20, 8), (56 << 20, 5)),               # IQ4_XS
    13: ((8 << 20, 9), (40 << 20, 5), (64 << 20, 4)),               # Q5_K
    12: ((8 << 20, 9), (40 << 20, 6), (64 << 20, 4)),               # Q4_K
    14: ((64 << 20, 8),),                                           # Q6_K
}


def _by_size() -> bool:
    """TIGHTFIT_MMA_BY_SIZE=0 turns the size buckets off (A/B timing)."""
    return os.environ.get("TIGHTFIT_MMA_BY_SIZE", "1").strip() not in ("0", "off", "false", "no")


def mma_min_n(qtype: int, weights: int | None = None) -> int | None:
    """Smallest column count routed to gemv_mma for `qtype` (None: never); weights (n_in * n_out)
    applies the matrix-size buckets (MMA_MIN_N_BY_SIZE)."""
    m = MMA_MIN_N.get(int(qtype))
    if m is None and _grid_on():
        m = MMA_MIN_N_GRID.get(int(qtype))
    if m is not None and int(qtype) in MMA_MIN_N_PIPE:
        from tightfit.kernels import gemv_mma
        if gemv_mma.pipe_default(int(qtype)):
            m = MMA_MIN_N_PIPE[int(qtype)]
    if m is not None and weights is not None and _by_size():
        for limit, n in MMA_MIN_N_BY_SIZE.get(int(qtype), ()):
            if int(weights) <= limit:
                m = max(m, n)
                break
    return m


def _grid_on() -> bool:
    return os.environ.get("TIGHTFIT_MMA_GRID", "1").strip() not in ("0", "off", "false", "no")


def _mma_on() -> bool:
    return os.environ.get("TIGHTFIT_GEMV_MMA", "1").strip() not in ("", "0", "off", "false", "no")


def mma_routed(qtype: int, n: int, w: torch.Tensor, weights: int | None = None) -> bool:
    """Whether an N-column product of `qtype` weights runs on gemv_mma: switch on, a measured
    crossover reached (for a matrix of `weights` = n_in * n_out weights when given), weights
    16-byte aligned on an sm_80+ CUDA device with cupy."""
    if not _mma_on():
        return False
    m = mma_min_n(qtype, weights)
    if m is None or n < m or not w.is_cuda or w.data_ptr() % 16:
        return False
    from tightfit.kernels import gemv_mma
    return gemv_mma.available() and gemv_mma.supported(int(qtype)) and \
        gemv_mma.capable(w.device.index if w.device.index is not None else
                         torch.cuda.current_device())


# IQ4_XS products of MMH_MIN_N..8 columns on matrices of at least MMH_MIN_WEIGHTS weights run on
# the bf16 byte-table kernel (gemv_mmh), which reads the fp32 activations and decodes a byte of
# codes with one PRMT and one shared-memory load. Measured on the H200 (session 17, bench/mmh.py,
# µs per matrix, random weights): N = 5 5120->17408 28.9 against gemv_mma's 32.1, 17408->5120
# 31.2 / 34.7, 5120->12288 22.1 / 24.6, 5120->10240 20.4 / 22.8; N = 4 on the same shapes 20-30 %
# below gemv_cuda; but N = 3 only ties, 5120->6144 and smaller lose, and at N = 1 it takes 1.5x
# gemv_cuda (26 against 18 us). The 27B's verify block at M = 5: 13.49 ms against 13.92 without it
# (same machine, bench/verify_profile.py). TIGHTFIT_GEMV_MMH=0 turns it off.
# With x packed by its producer (kind "foldp", session 18) the bound is lower: 5120->6144 at N = 5
# 12.6 us against the table kind's 14.4 and gemv_cuda's 14.8 (session 19, bench/mmh.py; 15.4 us per
# GDN attn_gate in the 27B's verify block).
MMH_MIN_N = 4
MMH_MIN_WEIGHTS = 40 << 20
MMH_MIN_WEIGHTS_PACKED = 24 << 20


def _mmh_on() -> bool:
    return os.environ.get("TIGHTFIT_GEMV_MMH", "1").strip() not in ("", "0", "off", "false", "no")


def mmh_routed(qtype: int, n: int, w: torch.Tensor, weights: int | None,
               packed: bool = False) -> bool:
    """Whether an N-column product of a matrix of `weights` = n_in * n_out weights runs on gemv_mmh
    (given fp32 activations, or with `packed` the bf16 pairs its producer wrote): switch on,
    IQ4_XS, MMH_MIN_N <= N <= 8, a wide matrix (MMH_MIN_WEIGHTS, MMH_MIN_WEIGHTS_PACKED), weights
    16-byte aligned on an sm_80+ CUDA device (bf16 mma.sync) with cupy."""
    from tightfit.kernels import gemv_mmh
    if not _mmh_on() or not gemv_mmh.supported(qtype) or not MMH_MIN_N <= int(n) <= gemv_mmh.MAX_N:
        return False
    bound = MMH_MIN_WEIGHTS_PACKED if packed else MMH_MIN_WEIGHTS
    if weights is None or int(weights) < bound or not w.is_cuda or w.data_ptr() % 16:
        return False
    from tightfit.kernels import gemv_mma
    return gemv_mmh.available() and gemv_mma.capable(
        w.device.index if w.device.index is not None else torch.cuda.current_device())


def mmh_input(x: torch.Tensor | None) -> bool:
    """x can be gemv_mmh's operand as it is: fp32, 2-D, contiguous, 16-byte aligned."""
    return (x is not None and x.dtype == torch.float32 and x.dim() == 2 and x.is_contiguous()
            and x.data_ptr() % 16 == 0)


def gemv_act(act, w: torch.Tensor, qtype: int, n_out: int, out: torch.Tensor,
             workspace: torch.Tensor | None = None) -> torch.Tensor:
    """y = x . W^T from prepared activations, on the kernel the layout names."""
    if isinstance(act, Act2):
        return gemv2_prepared(act, w, int(qtype), n_out, planar=False, out=out,
                              config={"PATH": "dp4a"}, workspace=workspace)
    if act.layout == 0 and w.is_cuda and cuda_routed(qtype):
        if mma_routed(qtype, int(act.n), w, int(act.k) * int(n_out)):
            from tightfit.kernels.gemv_mma import gemv_mma
            return gemv_mma(act, w, int(qtype), n_out, out)
        from tightfit.kernels.gemv_cuda import gemv_cuda
        return gemv_cuda(act, w, int(qtype), n_out, out)
    return gm.gemv_quantized(act, w, qtype, n_out, out=out)


def gemv_cuda_direct(x: torch.Tensor, w: torch.Tensor, qtype: int, n_out: int):
    """Eager y [M, n_out] = x [M, n_in] . W^T on the CUDA GEMV when it serves this type (blocks of
    M <= 16 tokens in model/batch.py), else None. Allocates its activations and output."""
    if not (x.is_cuda and cuda_routed(qtype)) or x.shape[1] % 32:
        return None
    from tightfit.kernels.gemv_cuda import gemv_cuda
    out = torch.empty((x.shape[0], int(n_out)), dtype=torch.float32, device=x.device)
    xf = x.to(torch.float32).contiguous()
    if mmh_input(xf) and mmh_routed(qtype, int(x.shape[0]), w, int(x.shape[1]) * int(n_out)):
        from tightfit.kernels.gemv_mmh import gemv_mmh
        return gemv_mmh(xf, w, int(qtype), int(n_out), out)
    qa = quantize_act(xf, 0)
    if mma_routed(qtype, int(x.shape[0]), w, int(x.shape[1]) * int(n_out)):
        from tightfit.kernels.gemv_mma import gemv_mma
        return gemv_mma(qa, w, int(qtype), int(n_out), out)
    return gemv_cuda(qa, w, int(qtype), int(n_out), out)


__all__ = ["SMALL_TYPES", "CUDA_LAYOUT", "cuda_routed", "mma_routed", "MMA_MIN_N", "mma_min_n",
           "mmh_routed", "mmh_input", "MMH_MIN_N", "MMH_MIN_WEIGHTS",
           "MMA_MIN_N_BY_SIZE",
           "is_cuda", "producer_writable", "gemv_cuda_direct",
           "act_layout", "is_small", "act_buffers", "make_act", "new_act",
           "quantize_into", "split_floats", "split_bound", "gemv_act"]
