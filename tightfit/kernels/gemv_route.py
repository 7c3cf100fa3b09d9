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


def small_enabled() -> bool:
    return os.environ.get("TIGHTFIT_GEMV", "auto").strip().lower() != "v1"


def act_layout(qtype: int) -> int:
    """The activation layout the decode step's GEMV of a `qtype` matrix reads (module docstring)."""
    t = int(qtype)
    if t in SMALL_TYPES and small_enabled():
        return SMALL_BASE + (10 if GROUP[t] == 16 else 0) + PERM_SMALL.get(t, 0)
    return int(gm.ACT_LAYOUT.get(t, 0))


def is_small(layout: int) -> bool:
    return int(layout) >= SMALL_BASE


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
    return quantize_act(x, int(layout), out=act)


def split_floats(qtype: int, n_in: int, n_out: int, n: int = 1) -> int:
    """fp32 elements of split-K partials the small path needs for this matrix (0: no split)."""
    if int(qtype) not in SMALL_TYPES or n_in % 256:
        return 0
    cfg = pick_config_small(int(qtype), n, n_out, n_in // 256)
    return cfg["SPLIT"] * n * n_out if cfg["SPLIT"] > 1 else 0


def split_bound(n: int = 1) -> int:
    """fp32 elements enough for the split-K partials of ANY matrix on the small path:
    pick_config_small doubles SPLIT only while tiles * SPLIT < 264 (so SPLIT * tiles < 528), or
    sets SPLIT = 2 when tiles < 528; either way SPLIT * n_out <= 1056 * R (R = 64 rows)."""
    return 1056 * 64 * n


def gemv_act(act, w: torch.Tensor, qtype: int, n_out: int, out: torch.Tensor,
             workspace: torch.Tensor | None = None) -> torch.Tensor:
    """y = x . W^T from prepared activations, on the kernel the layout names."""
    if isinstance(act, Act2):
        return gemv2_prepared(act, w, int(qtype), n_out, planar=False, out=out,
                              config={"PATH": "dp4a"}, workspace=workspace)
    return gm.gemv_quantized(act, w, qtype, n_out, out=out)


__all__ = ["SMALL_TYPES", "act_layout", "is_small", "act_buffers", "make_act", "new_act",
           "quantize_into", "split_floats", "split_bound", "gemv_act"]
