"""Quantized GEMM for blocks of tokens (prefill, speculative verify): y[M, n_out] = x[M, n_in] . W^T
with W as raw GGUF blocks on the device, multiplied on bf16 tensor cores. No full-precision copy
of any matrix is made.

Two GPU paths (`gemm_q(..., mode=)`):

* `fused` (default for M <= FUSED_MAX_M and the formats with a Triton tile decoder: IQ4_XS,
  Q4_K, Q5_K, Q6_K, Q3_K, Q8_0, IQ4_NL, Q2_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, and issue
  6's Q4_0, Q5_0, Q1_0, Q2_0, TQ2_0, TQ1_0 (byte-gather decoders), with n_in % 256 == 0): one program per (BN rows of W, BM tokens); per 256-element K step it decodes
  the [BN, 256] weight tile straight from the GGUF blocks (gemm_q_decode.decode_tile: GEMV v2's
  decoders for the K-quants and Q8_0, element-order kvalues lookup for IQ4_XS/IQ4_NL, small
  device grid tables for the IQ2/IQ3 grids), rounds it to bf16 in registers and accumulates
  tl.dot(x_tile, w_tile^T) in fp32. Every decoder emits element order: x loads are vectors.
* `dequant` (larger M; other formats): the rows of W are decoded chunk by chunk into a bf16
  scratch [chunk_rows, n_in] (the same Triton tile decoders; torch ops of gemm_q_torch for any
  other format or n_in % 256 != 0), then torch.mm (cuBLAS) with fp32 output. The decode reads
  the weights once per chunk call; at M >= 256 the matmul dominates.

Tile config (`fused_config`). M <= FUSED_MAX_M: BN = 64 rows x BM = 16/32/64 tokens, 8 warps,
3 stages, the Q4_K choice that measured 128 TFLOP/s at M = 512 on the H200 (bench/RESULTS.md); the
grid formats (several [BN, 256] int32 temporaries) and the byte-gather formats take BN = 32.
Larger M (prefill chunks): `CONFIGS` / TIGHTFIT_GEMM_CONFIGS per (format, shape class), from
bench/gemm_sweep.py; an entry with "mode": "fused" sends M > FUSED_MAX_M to this kernel instead
of the dequant path. The knobs (`config=` overrides any of them):
  BM, BN      tokens x W rows per program; the decode of a W tile is reused over BM tokens;
  num_warps, num_stages   (the X tile [BM, K step] bf16 is cp.async-pipelined in shared memory:
              num_stages x BM x 512 bytes at whole-block steps);
  SWAP        acc^T = W . X^T, W the register A operand of wgmma (else W goes to shared memory
              as the B operand); ptxas serializes register-A wgmmas (a wait after each);
  MFAST       token tiles of one W tile are consecutive programs (W read once from DRAM, X in L2);
  HALF        K steps of half a block (gemm_q_decode.decode_half: IQ4_XS, Q4_K, Q5_K; ignored for
              the others): the X stage is [BM, 128], so BM = 128 fits two programs per SM.
Offline SASS (sm_90a, Triton 3.6): every tile compiles to HGMMA (wgmma, A and B from shared
memory unless SWAP); the loop is decode -> STS -> bar -> 16 HGMMA -> wait 0, i.e. decode and MMA
of one program do not overlap: the overlap comes from 2-3 programs per SM (<= ~113 KB shared).

Scratch (the planner's prefill scratch line): `scratch_bytes` (default DEFAULT_SCRATCH = 64 MiB)
of bf16 per call for the dequant path; chunk_rows = scratch_bytes / (2 n_in). The torch decoders
need ~6x their chunk in fp32 temporaries, so their chunks are 1/12 as many rows (same peak).
The fused path needs no scratch.

CPU (tests, ReferenceModel-parity runs): `torch` mode decodes row chunks to fp32 with
gemm_q_torch and multiplies in fp32. `gemm_q_ref` is the slow reference: tightfit.quant's NumPy
dequantization and a float64 matmul. Under TRITON_INTERPRET=1 the Triton kernels run on the CPU
(prmt emulated), which is how tests/test_kernels_gemm_q.py checks them.
"""
from __future__ import annotations

import os

import numpy as np
import torch
import triton
import triton.language as tl

from tightfit.kernels.gemm_q_decode import (DECODE_TYPES, GATHER_TYPES, HALF_TYPES, TILE_BYTES,
                                            decode_half, decode_tile, grid_tables)
from tightfit.kernels.gemm_q_torch import FLOAT_VIEWS, dequant_rows, decode_temp_factor

# IQ4_XS, Q4_K, Q5_K, Q6_K, Q3_K, Q8_0, IQ4_NL, Q2_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
# Q4_0, Q5_0, Q1_0, Q2_0, TQ2_0, TQ1_0
FUSED_TYPES = DECODE_TYPES
FUSED_MAX_M = int(os.environ.get("TIGHTFIT_GEMM_FUSED_MAX_M", "64"))
DEFAULT_SCRATCH = 64 << 20
_ROW_BYTES = TILE_BYTES                   # bytes per 256 elements


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _bf16(x, EMU: tl.constexpr):
    """fp32 -> bf16, round to nearest even. The interpreter's cast truncates, so under EMU the
    rounding is done on the bits first (the cast of the rounded value is then exact)."""
    if EMU:
        b = x.to(tl.int32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
        return b.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _gemm_fused_kernel(x_ptr, w_ptr, tg, out_ptr, M, N, NB, sxm, som,
                       FMT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       SWAP: tl.constexpr, MFAST: tl.constexpr, HALF: tl.constexpr,
                       EMU: tl.constexpr):
    """One program: BN rows of W x BM tokens, K in steps of one 256-element GGUF block (HALF:
    of half a block, gemm_q_decode.decode_half, so the pipelined X tile is [BM, 128]).
    SWAP: acc^T [BN, BM] = W . X^T (the decoded W is the register A operand of the MMA, X^T the
    shared-memory B operand); else acc [BM, BN] = X . W^T (W goes through shared memory as the B
    operand). MFAST: the token tiles of one W tile are consecutive programs (they run together
    and share the W tile through L2; X, M x n_in bf16, stays in L2), else the W tiles of one
    token tile are (the old order)."""
    KS: tl.constexpr = 128 if HALF else 256
    KPB: tl.constexpr = 2 if HALF else 1                  # K steps per GGUF block
    pid = tl.program_id(0)
    if MFAST:
        n_m = tl.cdiv(M, BM)
        pid_m = pid % n_m
        pid_n = pid // n_m
    else:
        n_n = tl.cdiv(N, BN)
        pid_n = pid % n_n
        pid_m = pid // n_n
    rows = pid_n * BN + tl.arange(0, BN)
    rmask = (rows < N)[:, None]
    toks = pid_m * BM + tl.arange(0, BM)
    tmask = (toks < M)[:, None]
    col = tl.arange(0, KS)[None, :]
    xrow = x_ptr + toks.to(tl.int64)[:, None] * sxm
    rblk = rows.to(tl.int64) * NB
    if SWAP:
        acc = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    for ks in range(NB * KPB):
        if HALF:
            blk = (rblk + ks // 2)[:, None]
            W = _bf16(decode_half(w_ptr, blk, ks % 2, rmask, FMT, EMU), EMU)   # [BN, 128]
        else:
            blk = (rblk + ks)[:, None]
            W = _bf16(decode_tile(w_ptr, blk, rmask, tg, FMT, EMU), EMU)       # [BN, 256]
        X = tl.load(xrow + ks * KS + col, mask=tmask, other=0.0)               # [BM, KS] bf16
        if EMU:   # the interpreter's bf16 dot is wrong: same bf16 values, exact fp32 products
            if SWAP:
                acc = tl.dot(W.to(tl.float32), tl.trans(X.to(tl.float32)), acc)
            else:
                acc = tl.dot(X.to(tl.float32), tl.trans(W.to(tl.float32)), acc)
        else:
            if SWAP:
                acc = tl.dot(W, tl.trans(X), acc)
            else:
                acc = tl.dot(X, tl.trans(W), acc)
    if SWAP:
        omask = (rows < N)[:, None] & (toks < M)[None, :]
        tl.store(out_ptr + toks.to(tl.int64)[None, :] * som + rows[:, None], acc, mask=omask)
    else:
        omask = tmask & (rows < N)[None, :]
        tl.store(out_ptr + toks.to(tl.int64)[:, None] * som + rows[None, :], acc, mask=omask)


@triton.jit
def _dequant_kernel(w_ptr, tg, out_ptr, row0, n_rows, NB, so,
                    FMT: tl.constexpr, R: tl.constexpr, EMU: tl.constexpr):
    pid = tl.program_id(0)
    kb = tl.program_id(1)
    rows = pid * R + tl.arange(0, R)
    rmask = (rows < n_rows)[:, None]
    blk = ((row0 + rows).to(tl.int64) * NB + kb)[:, None]
    W = decode_tile(w_ptr, blk, rmask, tg, FMT, EMU)
    col = tl.arange(0, 256)[None, :]
    if out_ptr.dtype.element_ty == tl.bfloat16:
        W = _bf16(W, EMU)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * so + kb * 256 + col,
             W.to(out_ptr.dtype.element_ty), mask=rmask)


# ---- host side ------------------------------------------------------------------------------------
def _row_bytes(qtype: int, n_in: int) -> int:
    from tightfit.quant.traits import row_bytes
    return row_bytes(int(qtype), n_in)


def dequant_chunk(w_raw: torch.Tensor, qtype: int, n_in: int, r0: int, r1: int,
                  out: torch.Tensor | None = None, use_triton: bool | None = None) -> torch.Tensor:
    """Rows r0..r1-1 of W decoded into `out` [r1-r0, n_in] (bf16 scratch or any float dtype)."""
    t = int(qtype)
    n = r1 - r0
    if out is None:
        out = torch.empty((n, n_in), dtype=torch.bfloat16, device=w_raw.device)
    if use_triton is None:
        use_triton = w_raw.device.type == "cuda" or _interpret()
    if use_triton and t in FUSED_TYPES and n_in % 256 == 0:
        nb = n_in // 256
        R = 32
        _dequant_kernel[(triton.cdiv(n, R), nb)](w_raw, grid_tables(t, w_raw.device), out, r0, n,
                                                 nb, out.stride(0), FMT=t, R=R,
                                                 EMU=_interpret() or w_raw.device.type != "cuda",
                                                 num_warps=4)
        return out
    rb = _row_bytes(t, n_in)
    raw = w_raw.view(-1)[r0 * rb:r1 * rb].view(n, rb)
    out.copy_(dequant_rows(raw, t, n_in))
    return out


def chunk_rows(qtype: int, n_in: int, scratch_bytes: int = DEFAULT_SCRATCH,
               triton_decode: bool = True) -> int:
    rows = max(1, scratch_bytes // (2 * n_in))
    if not (triton_decode and int(qtype) in FUSED_TYPES and n_in % 256 == 0):
        rows = max(1, rows // (2 * decode_temp_factor(qtype)))
    return rows


def _mm_f32(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """a [M, K] . b_t^T with b_t [N, K], fp32 result (bf16 inputs on CUDA: cuBLAS fp32 output)."""
    if a.device.type == "cuda" and a.dtype == torch.bfloat16:
        try:
            return torch.mm(a, b_t.t(), out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            return torch.mm(a, b_t.t()).float()
    return torch.mm(a.float(), b_t.float().t())


#: keys of a fused-kernel config; values of the launch besides the tile: num_warps, num_stages
CONFIG_KEYS = ("BM", "BN", "num_warps", "num_stages", "SWAP", "MFAST", "HALF", "maxnreg")

#: Large-M tile (M > FUSED_MAX_M, or any M with a (format, class) entry) per (format, shape
#: class), "*" = any; TIGHTFIT_GEMM_CONFIGS (bench/gemm_sweep.py's JSON) comes first. An entry
#: with "mode": "fused" routes M > FUSED_MAX_M to the fused kernel (else: dequant + cuBLAS).
#: Unmeasured guesses until the sweep's winners are copied here (shared KB / regs from the
#: offline sm_90 SASS, Triton 3.6): IQ4_XS / Q4_K / Q5_K half-block steps, 128 tokens x 64 rows,
#: 8 warps, 2 stages (85 KB, 105 regs: two programs per SM, decode reused over 128 tokens); the
#: rest 64 x 64, 8 warps, 2 stages (105 KB, 128 regs: two per SM). Token tiles fastest (MFAST).
CONFIGS: dict = {
    # measured winners of bench/gemm_sweep.py at M = 1024 on the H200 (bench/RESULTS.md, session 3
    # call 5; summed us over the class's seed-mix shapes, fused vs the dequant + cuBLAS route):
    # IQ4_XS wide 1702 vs 4881, Q5_K down 871 vs 1667, Q5_K wide 1089 vs 2062, Q6_K down 1475 vs
    # 1688, Q4_K wide 694 vs 1915. Small shapes (attn_k/v) stay on dequant (26-28 vs 62-90 us).
    ("*", "*"): {"BM": 64, "BN": 64, "num_warps": 8, "num_stages": 2, "SWAP": 0, "MFAST": 1},
    (23, "wide"): {"BM": 128, "BN": 64, "num_warps": 4, "num_stages": 2, "SWAP": 1, "MFAST": 1,
                   "HALF": 1, "mode": "fused"},
    (23, "*"): {"BM": 128, "BN": 64, "num_warps": 8, "num_stages": 2, "SWAP": 0, "MFAST": 1,
                "HALF": 1},
    (12, "wide"): {"BM": 256, "BN": 128, "num_warps": 8, "num_stages": 2, "SWAP": 0, "MFAST": 1,
                   "HALF": 1, "mode": "fused"},
    (12, "*"): {"BM": 128, "BN": 64, "num_warps": 8, "num_stages": 2, "SWAP": 0, "MFAST": 1,
                "HALF": 1},
    (13, "down"): {"BM": 128, "BN": 64, "num_warps": 8, "num_stages": 2, "SWAP": 0, "MFAST": 1,
                   "HALF": 1, "mode": "fused"},
    (13, "wide"): {"BM": 256, "BN": 128, "num_warps": 8, "num_stages": 2, "SWAP": 0, "MFAST": 1,
                   "HALF": 1, "mode": "fused"},
    (13, "*"): {"BM": 128, "BN": 64, "num_warps": 8, "num_stages": 2, "SWAP": 0, "MFAST": 1,
                "HALF": 1},
    (14, "down"): {"BM": 128, "BN": 64, "num_warps": 8, "num_stages": 2, "SWAP": 0, "MFAST": 1,
                   "mode": "fused"},
}
_ENV_CONFIGS: dict | None = None


def shape_class(n_out: int, n_in: int) -> str:
    """Shape class of a matrix for CONFIGS: head (LM head), down (n_in > 8192: ffn_down),
    small (n_out <= 2048: attn_k/v), wide (the rest: FFN gate/up, QKV, gates, attn_output)."""
    if n_out >= 100_000:
        return "head"
    if n_in > 8192:
        return "down"
    if n_out <= 2048:
        return "small"
    return "wide"


def _env_configs() -> dict:
    """TIGHTFIT_GEMM_CONFIGS: a JSON file (or JSON text) {"<qtype>": {"<class>": cfg}} as
    bench/gemm_sweep.py writes under "best"; read once."""
    global _ENV_CONFIGS
    if _ENV_CONFIGS is None:
        _ENV_CONFIGS = {}
        src = os.environ.get("TIGHTFIT_GEMM_CONFIGS", "")
        if src:
            import json
            txt = open(src).read() if not src.lstrip().startswith("{") else src
            data = json.loads(txt)
            data = data.get("best", data)
            for t, per in data.items():
                for cls, cfg in per.items():
                    c = {k: int(v) for k, v in cfg.items() if k in CONFIG_KEYS}
                    if cfg.get("mode") in ("fused", "dequant"):
                        c["mode"] = cfg["mode"]
                    _ENV_CONFIGS[(t if t == "*" else int(t), cls)] = c
    return _ENV_CONFIGS


def fused_config(qtype: int, m: int, n_out: int | None = None, n_in: int | None = None) -> dict:
    """Tile of the fused kernel for M = m tokens (module docstring). M <= FUSED_MAX_M: the
    small-M tile (unchanged); larger M: TIGHTFIT_GEMM_CONFIGS, then CONFIGS, by (format, shape
    class), most specific first."""
    t = int(qtype)
    grid = t in (16, 17, 18, 21, 22) or t in GATHER_TYPES
    if m <= FUSED_MAX_M or n_out is None or n_in is None:
        return {"BM": 64 if m > 32 else (32 if m > 16 else 16), "BN": 32 if grid else 64,
                "num_warps": 8, "num_stages": 3, "SWAP": 0, "MFAST": 0, "HALF": 0}
    cls = shape_class(n_out, n_in)
    for table in (_env_configs(), CONFIGS):
        for key in ((t, cls), (t, "*"), ("*", cls), ("*", "*")):
            if key in table:
                cfg = {"num_stages": 2, "SWAP": 0, "MFAST": 1, "HALF": 0}
                cfg.update(table[key])
                return cfg
    raise AssertionError("CONFIGS has no ('*', '*') entry")


def pick_mode(qtype: int, m: int, n_in: int, device: torch.device,
              n_out: int | None = None, scratch_bytes: int = DEFAULT_SCRATCH) -> str:
    """M <= FUSED_MAX_M: fused; larger M: fused where the (format, shape class) config says
    "mode": "fused" (TIGHTFIT_GEMM_CONFIGS / CONFIGS, from bench/gemm_sweep.py), else dequant.
    A matrix whose bf16 rows fit the scratch in ONE chunk stays on dequant + cuBLAS: measured
    faster at M = 1024 in every such case (bench/RESULTS.md session 3 call 5: IQ4_XS 5120->6144
    121 vs 226 us, Q5_K 6144->5120 123 vs 312, 5120->1024 26-28 vs 62-90), while the chunked
    dequant route of the larger ones was 2-4x slower than the fused tiles."""
    t = int(qtype)
    if t in FLOAT_VIEWS:
        return "float"
    if device.type != "cuda" and not _interpret():
        return "torch"
    if device.type != "cuda":
        return "torch"       # interpreter: the kernels are tested on their own (slow on CPU)
    if t in FUSED_TYPES and n_in % 256 == 0:
        if m <= FUSED_MAX_M:
            return "fused"
        one_chunk = n_out is not None and n_out <= chunk_rows(t, n_in, scratch_bytes)
        if (n_out is not None and not one_chunk
                and fused_config(t, m, n_out, n_in).get("mode") == "fused"):
            return "fused"
    return "dequant"


def gemm_q(x: torch.Tensor, w_raw: torch.Tensor, qtype, n_out: int, n_in: int,
           out: torch.Tensor | None = None, mode: str = "auto",
           scratch_bytes: int = DEFAULT_SCRATCH, config: dict | None = None) -> torch.Tensor:
    """y [M, n_out] fp32 = x [M, n_in] . W^T, W = n_out rows of raw GGUF blocks (uint8)."""
    t = int(qtype)
    if x.dim() == 1:
        x = x[None, :]
    M = x.shape[0]
    if x.shape[1] != n_in:
        raise ValueError(f"gemm_q: x has {x.shape[1]} columns, expected {n_in}")
    if out is None:
        out = torch.empty((M, n_out), dtype=torch.float32, device=w_raw.device)
    if mode == "auto":
        mode = pick_mode(t, M, n_in, w_raw.device, n_out, scratch_bytes)
    if mode == "float":
        w = w_raw.view(FLOAT_VIEWS[t]).view(n_out, n_in)
        if w_raw.device.type == "cuda" and t != 0:
            out.copy_(_mm_f32(x.to(w.dtype), w))
        else:
            out.copy_(torch.mm(x.float(), w.float().t()))
        return out
    if mode == "fused":
        if t not in FUSED_TYPES or n_in % 256:
            raise ValueError(f"gemm_q: no fused kernel for type {t} with n_in={n_in}")
        cfg = fused_config(t, M, n_out, n_in)
        cfg.update(config or {})
        cfg.pop("mode", None)
        xb = x.to(torch.bfloat16).contiguous()
        nb = n_in // 256
        if w_raw.numel() != n_out * nb * _ROW_BYTES[t]:
            raise ValueError(f"gemm_q: w_raw has {w_raw.numel()} bytes, expected "
                             f"{n_out * nb * _ROW_BYTES[t]}")
        if out.stride(1) != 1:
            raise ValueError("gemm_q: out must have unit column stride")
        half = int(cfg.get("HALF", 0)) if t in HALF_TYPES else 0   # others: whole blocks
        extra = {"maxnreg": int(cfg["maxnreg"])} if cfg.get("maxnreg") else {}
        grid = (triton.cdiv(n_out, cfg["BN"]) * triton.cdiv(M, cfg["BM"]),)
        _gemm_fused_kernel[grid](xb, w_raw, grid_tables(t, w_raw.device), out, M, n_out, nb,
                                 xb.stride(0), out.stride(0),
                                 FMT=t, BM=cfg["BM"], BN=cfg["BN"], SWAP=int(cfg["SWAP"]),
                                 MFAST=int(cfg["MFAST"]), HALF=half,
                                 EMU=_interpret() or w_raw.device.type != "cuda",
                                 num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                                 **extra)
        return out
    if mode not in ("dequant", "torch"):
        raise ValueError(f"gemm_q: unknown mode {mode!r}")
    on_gpu_path = mode == "dequant"
    tri = on_gpu_path and (w_raw.device.type == "cuda" or _interpret())
    rows = chunk_rows(t, n_in, scratch_bytes, triton_decode=tri)
    sdt = torch.bfloat16 if on_gpu_path else torch.float32
    xin = x.to(sdt).contiguous() if on_gpu_path else x.float()
    scratch = torch.empty((min(rows, n_out), n_in), dtype=sdt, device=w_raw.device)
    for r0 in range(0, n_out, rows):
        r1 = min(n_out, r0 + rows)
        wc = dequant_chunk(w_raw, t, n_in, r0, r1, out=scratch[:r1 - r0], use_triton=tri)
        out[:, r0:r1] = _mm_f32(xin, wc)
    return out


def gemm_q_ref(x, w_raw, qtype, n_out: int, n_in: int) -> np.ndarray:
    """Slow reference: NumPy dequantization (tightfit.quant) and a float64 matmul."""
    from tightfit.quant.dequant import dequantize
    w = dequantize(np.asarray(w_raw, np.uint8).reshape(-1), int(qtype), (n_out, n_in))
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def scratch_line(scratch_bytes: int = DEFAULT_SCRATCH) -> dict[str, int]:
    """Device bytes the batched GEMM needs besides its inputs/outputs (planner prefill line)."""
    return {"gemm_dequant_scratch": int(scratch_bytes)}
