"""GEMV dispatcher: y[N, n_out] = x[N, n_in] . W^T with W as raw GGUF blocks on the device.

`gemv(x, w_raw, qtype, n_out, n_in)` routes IQ4_XS, Q4_K and Q5_K with 3 <= N <= 16 to GEMV v2
(gemv2.py: int8 tensor cores on decoded tiles; see `uses_v2` for the measured rule; TIGHTFIT_GEMV
=v1|v2 forces one); `planar=True`
says the buffer holds gemv2_layout.relayout's layout (v2 only). Everything else quantizes x to
int8 per 32 (quantize_act) and runs v1, the shared skeleton (gemv_kernel.py) with the format's
body. If v2 fails to compile for a type on the GPU, that type falls back to v1 with a warning. `gemv_quantized` takes activations that
were quantized once and feed several matrices (q/k/v, gate/up). The reference is `gemv_ref`:
tightfit.quant's NumPy dequantization and a float64 matmul.
"""
from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
import torch
import triton

from tightfit.kernels.gemv_kernel import gemv_q_kernel, MACRO_BYTES, ACT_LAYOUT
from tightfit.kernels.gemv_float import gemv_float_kernel
from tightfit.kernels.quantize_act import quantize_act, QuantAct
from tightfit.kernels.gemv2 import gemv2
from tightfit.kernels.gemv2_layout import V2_TYPES

FLOAT_TYPES = {0: 0, 1: 1, 30: 2}          # F32, F16, BF16 -> kernel WDT
QUANT_TYPES = frozenset(MACRO_BYTES)
_GRID_NAME = {16: "iq2xxs", 17: "iq2xs", 22: "iq2s", 18: "iq3xxs", 21: "iq3s"}
_NAMES = {0: "F32", 1: "F16", 30: "BF16", 2: "Q4_0", 6: "Q5_0", 8: "Q8_0", 10: "Q2_K",
          11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 16: "IQ2_XXS", 17: "IQ2_XS",
          18: "IQ3_XXS", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 34: "TQ1_0",
          35: "TQ2_0", 41: "Q1_0", 42: "Q2_0"}
SUPPORTED = frozenset(FLOAT_TYPES) | QUANT_TYPES


def type_id(qtype) -> int:
    if isinstance(qtype, str):
        inv = {v: k for k, v in _NAMES.items()}
        if qtype.upper() not in inv:
            raise ValueError(f"gemv: unknown type {qtype!r}")
        return inv[qtype.upper()]
    return int(qtype)


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@lru_cache(maxsize=None)
def _tables(device: str):
    from tightfit.kernels.gemv_iq import host_tables
    t = host_tables()
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in t.items()}


def pick_config(qtype: int, n: int, n_out: int, nb: int) -> dict:
    """(R rows, KB blocks, SPLIT, num_warps) for a shape. R*KB >= 32*num_warps keeps all NP
    columns of the accumulator inside one thread. SPLIT grows the grid to >= ~4 programs per SM
    of a 132-SM H200 when the row tiles alone are too few."""
    R, KB, warps = 16, 8, 4      # best of 4 configs on IQ4_XS 5120->17408, N=1 (bench/NOTES.md)
    if n >= 8:
        R, KB, warps = 16, 4, 2
    if n > 8:
        # NP = 16 (verify blocks of 9..16 tokens): 16x4 on 2 warps spills on sm_90 (Q2_0 6.8 KB
        # of stack, Q2_K/Q5_K/TQ1_0 16-40 B; offline ptxas, Triton 3.6); 16x8 on 4 warps spills
        # only Q3_K (56 B) and Q5_K (16 B). Unmeasured on the device.
        R, KB, warps = 16, 8, 4
    tiles = triton.cdiv(n_out, R)
    split = 1
    chunks = triton.cdiv(nb, KB)
    while tiles * split < 528 and split * 2 <= chunks:
        split *= 2
    return {"R": R, "KB": KB, "SPLIT": split, "num_warps": warps}


def gemv_quantized(act: QuantAct, w_raw: torch.Tensor, qtype, n_out: int,
                   out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    t = type_id(qtype)
    n, n_in = act.n, act.k
    if t not in QUANT_TYPES:
        raise ValueError(f"gemv: type {_NAMES.get(t, t)} has no quantized kernel")
    if n_in % 256:
        raise ValueError(f"gemv: n_in={n_in} is not a multiple of 256")
    if act.layout != ACT_LAYOUT.get(t, 0):
        raise ValueError("gemv: activations were quantized for another layout")
    nb = n_in // 256
    row_bytes = nb * MACRO_BYTES[t]
    if w_raw.numel() != n_out * row_bytes:
        raise ValueError(f"gemv: w_raw has {w_raw.numel()} bytes, expected {n_out}x{row_bytes}")
    cfg = dict(pick_config(t, n, n_out, nb))
    if config:
        cfg.update(config)
    if out is None:
        out = torch.empty((n, n_out), dtype=torch.float32, device=w_raw.device)
    if cfg["SPLIT"] > 1:
        out.zero_()
    dev = str(w_raw.device)
    if t in _GRID_NAME:
        tabs = _tables(dev)
        tg, tsm = tabs[_GRID_NAME[t]], tabs["sign"]
    else:
        tg = tsm = act.d   # unused by the body; any pointer will do
    np2 = triton.next_power_of_2(n)
    grid = (triton.cdiv(n_out, cfg["R"]), cfg["SPLIT"])
    gemv_q_kernel[grid](w_raw, act.q, act.d, act.s16, out, tg, tsm,
                        n, n_out, nb, row_bytes,
                        FMT=t, MB=MACRO_BYTES[t], NP=np2, R=cfg["R"], KB=cfg["KB"],
                        SPLIT=cfg["SPLIT"], EMU=_interpret() or w_raw.device.type != "cuda",
                        num_warps=cfg["num_warps"])
    return out


_V2_BROKEN: set[int] = set()


# Measured on the H200 (bench/RESULTS.md, 2026-11-29): at N=1 v1 reads 1.2-1.4 TB/s where v2
# reaches 0.45-0.8; at N=8 v1 costs 5-9x its N=1 time and v2 about 1x. On raw GGUF blocks v2 is
# only fast for the 4-byte-aligned formats (IQ4_XS, Q4_K, Q5_K); Q6_K/Q3_K/Q8_0 need the planar
# re-layout. So "auto" sends N >= V2_MIN_N columns of those formats to v2 and the rest to v1.
V2_MIN_N = 3
V2_RAW_FAST = frozenset({23, 12, 13})   # IQ4_XS, Q4_K, Q5_K


def gemv_version() -> str:
    """'auto' (default), 'v2' or 'v1', from TIGHTFIT_GEMV."""
    v = os.environ.get("TIGHTFIT_GEMV", "auto").strip().lower()
    if v not in ("v1", "v2", "auto"):
        raise ValueError(f"TIGHTFIT_GEMV={v!r}: expected auto, v1 or v2")
    return v


def uses_v2(qtype, n: int = 1) -> bool:
    """Whether `gemv` runs v2 for this type and column count (raw layout)."""
    t = type_id(qtype)
    if t not in V2_TYPES or n > 16 or t in _V2_BROKEN:
        return False
    v = gemv_version()
    if v == "auto":
        return n >= V2_MIN_N and t in V2_RAW_FAST
    return v == "v2"


def gemv(x: torch.Tensor, w_raw: torch.Tensor, qtype, n_out: int, n_in: int,
         out: torch.Tensor | None = None, config: dict | None = None,
         planar: bool = False) -> torch.Tensor:
    """y[N, n_out] float32 = x[N, n_in] . W^T, W given as n_out rows of GGUF blocks (uint8):
    raw GGUF, or the v2 planar layout when `planar` (gemv2_layout.relayout)."""
    t = type_id(qtype)
    if x.dim() == 1:
        x = x[None, :]
    if x.shape[1] != n_in:
        raise ValueError(f"gemv: x has {x.shape[1]} columns, expected {n_in}")
    if planar and (t not in V2_TYPES or x.shape[0] > 16):
        raise ValueError("gemv: planar layout needs a v2 type and N <= 16")
    if planar or uses_v2(t, x.shape[0]):
        try:
            return gemv2(x, w_raw, t, n_out, n_in, out=out, planar=planar, config=config)
        except ValueError:
            raise
        except Exception as e:          # compile failure on this GPU/toolchain: fall back
            if planar or _interpret() or w_raw.device.type != "cuda":
                raise
            import warnings
            warnings.warn(f"gemv v2 failed for {type_name(t)} ({type(e).__name__}: "
                          f"{str(e)[:200]}); using v1 for this type")
            _V2_BROKEN.add(t)
            config = None
    if t in FLOAT_TYPES:
        n = x.shape[0]
        if out is None:
            out = torch.empty((n, n_out), dtype=torch.float32, device=w_raw.device)
        xf = x.to(torch.float32).contiguous()
        R, BK = 16, 128
        gemv_float_kernel[(triton.cdiv(n_out, R),)](w_raw, xf, out, n, n_out, n_in,
                                                    WDT=FLOAT_TYPES[t],
                                                    NP=triton.next_power_of_2(n), R=R, BK=BK,
                                                    num_warps=4)
        return out
    act = quantize_act(x, ACT_LAYOUT.get(t, 0))
    return gemv_quantized(act, w_raw, t, n_out, out=out, config=config)


def gemv_ref(x: np.ndarray, w_raw: np.ndarray, qtype, n_out: int, n_in: int) -> np.ndarray:
    """Slow reference: dequantize W with NumPy (tightfit.quant) and multiply in float64."""
    t = type_id(qtype)
    try:
        from tightfit.quant.dequant import dequantize
        w = dequantize(np.asarray(w_raw, np.uint8).reshape(-1), t, (n_out, n_in))
    except ImportError:   # the quant package lands in parallel; gguf-py is the fallback
        import gguf.quants
        w = gguf.quants.dequantize(np.asarray(w_raw, np.uint8).reshape(n_out, -1),
                                   gguf.GGMLQuantizationType(t))
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def type_name(t: int) -> str:
    return _NAMES.get(t, str(t))
