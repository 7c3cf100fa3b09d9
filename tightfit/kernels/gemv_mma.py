"""Skinny GEMM on int8 tensor cores for N = 1..16 columns ("mma" path), W in raw GGUF blocks.

tightfit/kernels/cuda/gemv_mma.cuh holds the kernels (tf_mma<M, NT>: one warp per 16-row tile;
tf_mma_rt<M, 1, 2>: two 16-row tiles per warp; one mma.m16n8k32 / m16n8k16 per weight group,
row tile and 8-column B tile, fp32 epilogue per group) and the per-format fragment decoders
(M_Q8_0, M_Q4_K, M_Q5_K, M_Q6_K, M_IQ4_XS; gemv_mma_iq.cuh: M_IQ2_XS, M_IQ3_XXS, M_IQ3_S,
M_IQ2_S). Same contract as gemv_cuda.gemv_cuda: x is
quantize_act's layout 0, out is fp32 [N, n_out], launched on torch's current stream with raw
pointers, nothing allocated per call (CUDA-graph capturable after one warm-up call per type, or
`prepare()`).

Work split: stream-K over (row-tile group, step of U blocks) items, one wave of resident warps
with equal item ranges (`geometry`). A tile group cut between warps is summed deterministically
("fixup by the last arriving warp"): each contributing warp stores its partial fragment to its
slot of a persistent per-device workspace and counts its arrival; the last one to arrive sums the
slots in ascending warp order and stores y plainly. So results are bitwise repeatable run to run
and under CUDA-graph replay, and `out` needs no zeroing (the old atomicAdd into a zeroed y varied
at 1e-7, which the 64-layer model amplified to ~10 % of the logits). Workspace: int32 counters
[ceil(n_out / 16)] (zero at rest: the last warp resets its counter) + fp32 slots [warps, 2,
SLOT_FLOATS, 32]; allocated lazily per device (`prepare` sizes it before a capture; the executor can
hand it a planned buffer, `use_workspace`), sized by `fixup_workspace_bytes`. It is shared by all
calls on a device, so calls must be stream-ordered (one stream, as the executor runs them).
`fixup_plan` is the host model of the bookkeeping (tests/test_gemv_mma.py).

Columns: N <= 8 runs NT = 1 (one B tile) with two row tiles per warp (DEFAULT_RT; Q5_K one, with
two blocks per step: RT_BY_TYPE), 9..16 NT = 2
(two B tiles sharing the decoded A fragments, one row tile), N > 16 in chunks of 16 (weights read
once per chunk).

Host side (no GPU): `host_frag` runs a format's load / afrag / xfrag / scale compiled with g++ for
one (block, lane, group), which tests/test_gemv_mma.py assembles into the mma tiles;
`compile_report` compiles every instantiation offline with nvcc -Xptxas -v.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from tightfit.kernels import cuda_runtime as _rt
from tightfit.kernels.cuda_source import CUDA_DIR, formats_source, source_hash
from tightfit.kernels.gemv_cuda import check_type, check_operands, check_shape, layout0

MMA = "gemv_mma.cuh"
MMA_IQ = "gemv_mma_iq.cuh"          # the grid formats (IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S)
PIPE = "gemv_mma_pipe.cuh"
THREADS = 256                       # TF_MMA_THREADS
WARPS = THREADS // 32
NTS = (1, 2)                        # B tiles per launch (8 columns each)
RTS = (1, 2)                        # 16-row tiles per warp (config "rt" / env TIGHTFIT_MMA_RT)
# Measured on the H200 (N = 8, 5120->17408 / 17408->5120, us): rt 1 -> 2: Q4_K 44.6/44.3 ->
# 34.0/33.9, Q5_K 47.1/47.2 -> 35.8/36.4, IQ4_XS 40.1/42.1 -> 36.2/36.8, Q6_K 72.9/70.9 ->
# 65.9/64.6, Q8_0 65.8/64.8 -> 58.4/57.9; N = 1 equal or better. So 2 is the default at N <= 8.
DEFAULT_RT = 2
# Per-type exceptions (session 20, call 2: the verify block M = 5 on the 27B, us per matrix): Q5_K
# with the lean K4 epilogue runs 25.8 at rt 1 against 29.9 at rt 2 (Q4_K 29.8 / 29.8).
RT_BY_TYPE: dict[int, int] = {13: 1}
# (nt, rt) -> kernel template; rt = 2 only at nt = 1 (N <= 8: at nt = 2 it spilled hundreds of bytes)
KERNELS = {(1, 1): "tf_mma<{m}, 1>", (2, 1): "tf_mma<{m}, 2>", (1, 2): "tf_mma_rt<{m}, 1, 2>"}
# Pipelined variant (gemv_mma_pipe.cuh: weights staged through a per-warp cp.async ring of NST
# stages), NT = 1 only (N <= 8), every format whose load() takes shared memory (not Q8_0).
PIPE_KERNEL = "tf_mma_pipe<{m}, {rt}, {nst}>"
PIPE_TYPES = (12, 13, 14, 23, 17, 18, 21, 22)
PIPE_NSTS = (2, 3)
# Measured on the H200 (session 10 call 1, bench/gemv.py --impls mma, us per matrix with the
# activation quantization, N = 5, tf_mma_rt -> pipe rt 2 / nst 2): Q6_K 5120->17408 63.5 -> 52.0,
# 17408->5120 62.0 -> 55.9, 5120->248320 651 -> 501 (dp4a gemv_cuda: 56.8, 61.3, 693); IQ4_XS,
# Q4_K, Q5_K 2-20 % slower than tf_mma_rt at every N (their loads are not the limit). So the pipe
# is the default for Q6_K and for the grid formats (IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S): their blocks
# are 2-byte aligned, so the register kernels read them in 8- and 16-bit loads (session 24 call 1,
# N = 5 on the FFN shapes, us: tf_mma_rt 54-63, the ring 40-44 at one row tile or two; gemv_cuda
# 45-55). TIGHTFIT_MMA_PIPE=1: every PIPE_TYPE, 0: none, a list ("18,22"): those types.
PIPE_DEFAULT_TYPES = (14, 17, 18, 21, 22)
DEFAULT_NST = 2
PIPE_RT: dict[int, int] = {17: 1, 18: 1, 21: 1, 22: 1}   # per-type row tiles (else DEFAULT_RT)
# fixup slot floats per lane (TF_MMA_SLOT_FLOATS): the largest accumulator over the kernels,
# NT * RT * 4 with NT * RT <= 2 (tf_mma<M, 2>, tf_mma_rt / tf_mma_pipe at rt 2)
SLOT_FLOATS = 8
MAX_CTAS_PER_SM = 8                 # the ctas_per_sm bound gemv_mma accepts: slots sized for it
CNT_ALIGN = 256                     # the slots start at this byte offset multiple
_FMT_RE = re.compile(r"X\(\s*(M_\w+)\s*,\s*(\d+)\s*\)")
_lock = threading.Lock()
_modules: dict[tuple[int, int], dict[int, object]] = {}
_geom: dict[tuple, tuple] = {}


def _options() -> tuple[str, ...]:
    """NVRTC options; TIGHTFIT_MMA_LEGACY=1 builds session 11's arithmetic (I2F conversions, int64
    split arithmetic, a fence at every fixup arrival) for A/B timing (bench/NOTES.md, session 13);
    TIGHTFIT_MMA_MINS_TC=0 builds Q4_K / Q5_K's per-group min term (session 19's epilogue) instead
    of the tf32 product per block (gemv_mma.cuh, tf_mma_k4_ws)."""
    legacy = _switch("TIGHTFIT_MMA_LEGACY", "0")
    mins_tc = _switch("TIGHTFIT_MMA_MINS_TC", "1")
    minb = _min_blocks()
    return (("-std=c++17",) + (("-DTF_MMA_LEGACY=1",) if legacy else ())
            + (("-DTF_MMA_MINS_TC=0",) if not mins_tc else ())
            + ((f"-DTF_MMA_MINB={minb}",) if minb != 2 else ()))


def _switch(name: str, default: str) -> bool:
    v = os.environ.get(name, default).strip() or default
    if v not in ("0", "1"):
        raise ValueError(f"{name}={v!r}: expected 0 or 1")
    return v == "1"


def _min_blocks() -> int:
    """Resident CTAs per SM the kernels are built for (TIGHTFIT_MMA_MINB, default 2: 128
    registers; 3: 80, an occupancy experiment, bench/NOTES.md session 13); the stream-K grid
    is sized for as many unless TIGHTFIT_MMA_CPS says otherwise."""
    v = os.environ.get("TIGHTFIT_MMA_MINB", "2").strip() or "2"
    if v not in ("1", "2", "3", "4"):
        raise ValueError(f"TIGHTFIT_MMA_MINB={v!r}: expected 1..4")
    return int(v)


def source() -> str:
    """Translation unit: the CUDA GEMV's formats (gemv_common.cuh, the IQ tables, the dp4a
    formats, whose grid decoders the grid formats share) + gemv_mma.cuh + gemv_mma_iq.cuh +
    gemv_mma_pipe.cuh."""
    return (formats_source(False, lowbit=True) + "\n// ---- " + MMA + "\n"
            + (CUDA_DIR / MMA).read_text() + "\n// ---- " + MMA_IQ + "\n"
            + (CUDA_DIR / MMA_IQ).read_text() + "\n// ---- " + PIPE + "\n"
            + (CUDA_DIR / PIPE).read_text())


@lru_cache(maxsize=1)
def _formats() -> dict[int, str]:
    src = (CUDA_DIR / MMA).read_text()
    m = re.search(r"#define\s+TF_MMA_FORMATS\(X\)((?:[^\n]*\\\n)*[^\n]*)", src)
    return {int(t): n for n, t in _FMT_RE.findall(m.group(1))} if m else {}


def supported(qtype: int) -> bool:
    return int(qtype) in _formats()


def available() -> bool:
    return torch.cuda.is_available() and _rt.cupy() is not None


@lru_cache(maxsize=None)
def capable(device: int) -> bool:
    """The device runs these kernels: sm_80+ (mma.sync m16n8k32 / m16n8k16 on int8, cp.async;
    the fixup's fence.acq_rel and relaxed atomics need sm_70)."""
    return torch.cuda.get_device_capability(device)[0] >= 8


@lru_cache(maxsize=None)
def _fmt_const(qtype: int, name: str) -> int:
    """A static constexpr int of a format struct (QK, BB, KS, NG, U), parsed from the header."""
    st = _formats()[int(qtype)]
    src = (CUDA_DIR / MMA).read_text() + (CUDA_DIR / MMA_IQ).read_text()
    m = re.search(r"struct\s+" + re.escape(st) + r"\b[^{;]*\{(.*?)\n\};", src, re.S)
    v = re.search(r"\b" + name + r"\s*=\s*(\d+)", m.group(1)) if m else None
    if v is None:
        raise RuntimeError(f"cannot find {name} of {st}")
    return int(v.group(1))


def kernel_names(qtype: int) -> list[str]:
    name = _formats()[int(qtype)]
    return [v.format(m=name) for v in KERNELS.values()]


def _module(qtype: int, device: int) -> dict[tuple[int, int], object]:
    key = (device, int(qtype))
    mods = _modules.get(key)
    if mods is not None:
        return mods
    with _lock:
        mods = _modules.get(key)
        if mods is None:
            cp = _rt.cupy()
            names = kernel_names(qtype)
            with cp.cuda.Device(device):
                mod = cp.RawModule(code=source(), options=_options(), name_expressions=names)
                mods = {key: mod.get_function(n) for key, n in zip(KERNELS, names)}
            _modules[key] = mods
    return mods


_pipe_fns: dict[tuple[int, int, int, int], object] = {}


def pipe_default(qtype: int) -> bool:
    """Whether an N <= 8 call of `qtype` without a config runs the pipelined kernel now."""
    return _pipe_choice(qtype, None) is not None


def pipe_smem(qtype: int, rt: int, nst: int) -> int:
    """Dynamic shared memory per CTA of tf_mma_pipe<M, rt, nst> (mirrors tf_mmp_geo)."""
    u, bb = step_blocks(qtype, 1, rt), _fmt_const(qtype, "BB")
    cpr = (u * bb + 30) // 16
    sr = 16 * cpr if cpr & 1 else 16 * cpr + 16
    return WARPS * nst * 16 * rt * sr


def _pipe_fn(qtype: int, device: int, rt: int, nst: int):
    key = (device, int(qtype), rt, nst)
    fn = _pipe_fns.get(key)
    if fn is None:
        with _lock:
            fn = _pipe_fns.get(key)
            if fn is None:
                cp = _rt.cupy()
                name = PIPE_KERNEL.format(m=_formats()[int(qtype)], rt=rt, nst=nst)
                with cp.cuda.Device(device):
                    mod = cp.RawModule(code=source(), options=_options(), name_expressions=[name])
                    fn = mod.get_function(name)
                    sm = pipe_smem(qtype, rt, nst)
                    if sm > 48 << 10:
                        fn.max_dynamic_shared_size_bytes = sm
                _pipe_fns[key] = fn
    return fn


def rt_choice(qtype: int, config: dict | None = None) -> int:
    """16-row tiles per warp of the non-pipelined kernel at N <= 8: config "rt", else env
    TIGHTFIT_MMA_RT, else RT_BY_TYPE, else DEFAULT_RT."""
    env = os.environ.get("TIGHTFIT_MMA_RT", "").strip()
    return (int((config or {}).get("rt", 0)) or (int(env) if env else 0)
            or RT_BY_TYPE.get(int(qtype), DEFAULT_RT))


def _pipe_choice(qtype: int, config: dict | None) -> tuple[int, int] | None:
    """(rt, nst) of the pipelined kernel for this call, or None: switch (config "pipe" / env
    TIGHTFIT_MMA_PIPE, default: PIPE_DEFAULT_TYPES), format support."""
    cfg = config or {}
    on = cfg.get("pipe")
    if on is None:
        env = os.environ.get("TIGHTFIT_MMA_PIPE", "").strip()
        if env == "":
            on = int(qtype) in PIPE_DEFAULT_TYPES
        elif env in ("0", "1"):
            on = env == "1"
        else:                                          # a list of type ids (A/B timing)
            on = int(qtype) in {int(v) for v in env.split(",") if v.strip()}
    if not on or int(qtype) not in PIPE_TYPES:
        return None
    rt = int(cfg.get("rt", 0)) or PIPE_RT.get(int(qtype), 0) or int(
        os.environ.get("TIGHTFIT_MMA_RT", DEFAULT_RT))
    nst = int(cfg.get("nst", 0)) or int(os.environ.get("TIGHTFIT_MMA_NST", DEFAULT_NST))
    if rt not in RTS or nst not in PIPE_NSTS:
        raise ValueError(f"MMA GEMV: pipe rt {rt} / nst {nst} not in {RTS} / {PIPE_NSTS}")
    return rt, nst


@lru_cache(maxsize=None)
def _smem_sm(device: int) -> int:
    p = torch.cuda.get_device_properties(device)
    return int(getattr(p, "shared_memory_per_multiprocessor", 0) or (228 << 10))


@lru_cache(maxsize=None)
def _sms(device: int) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def prepare(qtype: int, device=None, n_out: int = 0) -> None:
    """Compile (or load from cupy's cache) the module of `qtype` now, outside any graph capture,
    and size the device's fixup workspace for outputs of up to `n_out` rows (a later call that
    needs more counters must not happen inside a capture)."""
    dev = torch.device(device) if device is not None else torch.device("cuda")
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    _module(int(qtype), idx)
    _workspace(idx, -(-int(n_out) // 16), _sms(idx) * MAX_CTAS_PER_SM * WARPS)


# ---------------------------------------------------------------- fixup workspace
def _ws_layout(groups: int, warps: int) -> tuple[int, int]:
    """(byte offset of the slots, total bytes): int32 counters [groups], then (at a CNT_ALIGN
    boundary) fp32 slots [warps][2][SLOT_FLOATS][32] (gemv_mma.cuh tf_mma_finish)."""
    off = -(-max(1, groups) * 4 // CNT_ALIGN) * CNT_ALIGN
    return off, off + warps * 2 * 32 * SLOT_FLOATS * 4


def fixup_workspace_bytes(n_out_max: int, sms: int, ctas_per_sm: int = MAX_CTAS_PER_SM) -> int:
    """Bytes of the fixup workspace for outputs of up to n_out_max rows on `sms` SMs: a counter per
    16-row tile (rt 1 has the most tile groups) and 2 slots per warp of the largest grid (one wave
    of sms * ctas_per_sm CTAs; gemv_mma accepts ctas_per_sm <= 8)."""
    return _ws_layout(-(-int(n_out_max) // 16), int(sms) * int(ctas_per_sm) * WARPS)[1]


class _Workspace:
    def __init__(self, buf: torch.Tensor, groups: int, warps: int):
        self.buf, self.groups, self.warps = buf, groups, warps
        self.cnt = buf.data_ptr()
        self.part = buf.data_ptr() + _ws_layout(groups, warps)[0]


_ws: dict[int, _Workspace] = {}
_ws_retired: list[torch.Tensor] = []   # replaced buffers: graphs captured on them stay valid


def use_workspace(buf: torch.Tensor, n_out_max: int) -> None:
    """Adopt a planned buffer (the plan's `mma_fixup` line, uint8, counter region zeroed) as its
    device's fixup workspace, laid out for n_out_max rows; its slot capacity follows from its size.
    A call that needs more later reallocates (outside capture)."""
    if buf.dtype != torch.uint8 or not buf.is_cuda or not buf.is_contiguous():
        raise ValueError("MMA GEMV: the fixup workspace must be a contiguous CUDA uint8 tensor")
    groups = -(-int(n_out_max) // 16)
    off, _ = _ws_layout(groups, 0)
    warps = (buf.numel() - off) // (2 * 32 * SLOT_FLOATS * 4)
    if warps < 1 or buf.data_ptr() % 16:
        raise ValueError(f"MMA GEMV: fixup workspace of {buf.numel()} B too small or misaligned")
    with _lock:
        old = _ws.get(buf.device.index)
        if old is not None:
            _ws_retired.append(old.buf)
        _ws[buf.device.index] = _Workspace(buf, groups, warps)


def _workspace(device: int, groups: int, warps: int) -> _Workspace:
    """The device's workspace, grown (a fresh zeroed allocation) when it has fewer than `groups`
    counters or `warps` slot pairs. Growing inside a CUDA graph capture is refused: call
    prepare(n_out=...) (or one eager call of the largest shape) before capturing."""
    ws = _ws.get(device)
    if ws is not None and ws.groups >= groups and ws.warps >= warps:
        return ws
    with _lock:
        ws = _ws.get(device)
        if ws is not None and ws.groups >= groups and ws.warps >= warps:
            return ws
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"MMA GEMV: the fixup workspace of device {device} needs {groups} counters / "
                f"{warps} warps' slots but holds {ws.groups if ws else 0} / {ws.warps if ws else 0}"
                "; it cannot grow during CUDA graph capture: call gemv_mma.prepare(qtype, device, "
                "n_out) for the largest output first")
        g = max(groups, ws.groups if ws else 0)
        w = max(warps, ws.warps if ws else 0, _sms(device) * MAX_CTAS_PER_SM * WARPS)
        buf = torch.zeros(_ws_layout(g, w)[1], dtype=torch.uint8, device=torch.device("cuda", device))
        if ws is not None:      # kernels queued on it may still run, and captured graphs use it
            _ws_retired.append(ws.buf)
        ws = _ws[device] = _Workspace(buf, g, w)
    return ws


def fixup_counters(device=None) -> torch.Tensor | None:
    """The device's counter region (int32 view; all zero at rest), or None before the first use."""
    dev = torch.device(device) if device is not None else torch.device("cuda")
    ws = _ws.get(dev.index if dev.index is not None else torch.cuda.current_device())
    return None if ws is None else ws.buf[:ws.groups * 4].view(torch.int32)


# ---------------------------------------------------------------- fixup bookkeeping, host model
# The same integer formulas as gemv_mma.cuh (tf_mma_start / tf_mma_owner / tf_mma_slot /
# tf_mma_pieces / tf_mma_piece); tests/test_gemv_mma.py checks them against the header's own code
# (g++) and against a brute-force walk of every warp's range.
def _start(items: int, nw: int, w: int) -> int:
    return items * w // nw


def _owner(items: int, nw: int, i: int) -> int:
    return ((i + 1) * nw - 1) // items


def fixup_pieces(items: int, spt: int, nw: int, tg: int) -> list[tuple[int, int]]:
    """(warp, slot) of every piece of tile group tg, in the reducer's (ascending warp) order, as
    tf_mma_finish computes them (one piece: the group is covered whole, no fixup)."""
    a = tg * spt
    if items >= nw:
        p = _owner(items, nw, a + spt - 1) - _owner(items, nw, a) + 1
    else:
        p = spt
    wf = _owner(items, nw, a)
    out = []
    for k in range(p):
        v = wf + k if items >= nw else _owner(items, nw, a + k)
        out.append((v, (0 if _start(items, nw, v) >= a else 1) if k == 0 else 0))
    return out


def fixup_plan(items: int, spt: int, nw: int) -> dict[int, list[tuple[int, int]]]:
    """{tile group: [(warp, slot), ...] in summation order} for every tile group that the split
    of `items` = groups * spt items over nw warps cuts (P >= 2 pieces)."""
    out = {}
    for tg in range(items // spt):
        p = fixup_pieces(items, spt, nw, tg)
        if len(p) > 1:
            out[tg] = p
    return out


def step_blocks(qtype: int, nt: int, rt: int = 1) -> int:
    """Blocks per work item of tf_mma<M, nt, rt> (mirrors tf_mma_u in gemv_mma.cuh)."""
    u, qk = _fmt_const(qtype, "U"), _fmt_const(qtype, "QK")
    if qk == 32:
        return u // rt
    return u if (nt == 1 and rt == 1) else 1


def geometry(qtype: int, n_in: int, n_out: int, sms: int, ctas_per_sm: int = 2,
             nt: int = 1, rt: int = 1, fill: bool = True) -> tuple[int, bool]:
    """(CTAs, split) of the stream-K launch (gemv_mma.cuh tf_mma): items = 16-row tiles x steps of
    U blocks; one wave of at most sms * ctas_per_sm CTAs (launch bounds: 2 resident per SM) in which
    every warp gets ceil(items / resident warps) or one item fewer, so no SM waits on a tail wave.
    fill: every resident slot gets a warp (each SM the same share of items); without it the grid
    shrinks to ceil(items / per) warps of `per` items, which on the 27B's FFN shapes left 37 of 132
    SMs with one CTA while the others ran two (227 CTAs: ncu, session 10 call 2).
    split (informational): some warp's item range starts or ends inside a tile group, i.e. the
    launch takes the fixup path (gemv_mma.cuh tf_mma_finish) for those groups."""
    qk, u = _fmt_const(qtype, "QK"), step_blocks(qtype, nt, rt)
    spt = (n_in // qk + u - 1) // u
    items = ((n_out + 16 * rt - 1) // (16 * rt)) * spt
    slots = sms * ctas_per_sm * WARPS
    per = -(-items // slots)                       # items per warp
    ctas = -(-min(items, slots) // WARPS) if fill else -(-(-(-items // per)) // WARPS)
    nw = ctas * WARPS
    if items * nw >= 1 << 32:
        # the kernels' split arithmetic is 32-bit (gemv_mma.cuh tf_mma_ix)
        raise ValueError(f"MMA GEMV: {items} work items x {nw} warps >= 2^32 ({n_out} x {n_in})")
    bounds = items * np.arange(1, nw, dtype=np.int64) // nw
    split = bool((bounds % spt != 0).any())
    return ctas, split


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(c, min(16, n - c)) for c in range(0, n, 16)]


def gemv_mma(act, w_raw: torch.Tensor, qtype: int, n_out: int, out: torch.Tensor,
             config: dict | None = None) -> torch.Tensor:
    """out[N, n_out] (fp32) = x . W^T, x given as a layout-0 QuantAct (quantize_act).
    config: {"fill": 0|1} (env TIGHTFIT_MMA_FILL; default 1): grid over every resident slot
    (geometry()); {"pipe": 0|1, "nst": 2|3} (or env TIGHTFIT_MMA_PIPE / TIGHTFIT_MMA_NST): the
    pipelined kernel at N <= 8 for PIPE_TYPES; {"ctas_per_sm": n} sizes the stream-K grid for n
    resident CTAs per SM (default 2);
    {"rt": 1|2} (or env TIGHTFIT_MMA_RT): 16-row tiles per warp at N <= 8 (default 2: each x
    fragment and column scale serves 32 rows, RT_BY_TYPE the exceptions; N > 8 chunks always
    run 1)."""
    qtype = check_type("MMA GEMV", qtype, supported)
    n, k, q, d, s16 = layout0("MMA GEMV", act)
    dev = w_raw.device
    pipe = _pipe_choice(qtype, config)
    fill = bool(int((config or {}).get("fill", os.environ.get("TIGHTFIT_MMA_FILL", "1"))))
    gkey = (qtype, n, k, int(n_out), dev.index,
            None if config is None else tuple(sorted(config.items())), pipe, fill)
    g = _geom.get(gkey)
    if g is None:
        rb = check_shape("MMA GEMV", qtype, act, dev)
        if n_out < 1:
            raise ValueError("MMA GEMV: no output rows")
        cps = int((config or {}).get("ctas_per_sm", 0)) or int(
            os.environ.get("TIGHTFIT_MMA_CPS", str(_min_blocks())))
        if not 1 <= cps <= 8:
            raise ValueError(f"MMA GEMV: ctas_per_sm {cps} not in 1..8")
        rt = rt_choice(qtype, config)
        if rt not in RTS:
            raise ValueError(f"MMA GEMV: rt {rt} not in {RTS}")
        mods = _module(qtype, dev.index)
        launches = []
        for c0, nc in _chunks(n):
            nt = 1 if nc <= 8 else 2
            if nt == 1 and pipe is not None:
                prt, nst = pipe
                sm = pipe_smem(qtype, prt, nst)
                fit = min(cps, _smem_sm(dev.index) // (sm + 1024))
                if fit >= 1:
                    ctas, _ = geometry(qtype, k, int(n_out), _sms(dev.index), fit, 1, prt, fill)
                    launches.append((_pipe_fn(qtype, dev.index, prt, nst), c0, nc, (ctas, 1, 1),
                                     sm))
                    continue
            r = rt if (nt, rt) in KERNELS else 1
            ctas, _ = geometry(qtype, k, int(n_out), _sms(dev.index), cps, nt, r, fill)
            launches.append((mods[(nt, r)], c0, nc, (ctas, 1, 1), 0))
        # workspace needs: a counter per 16-row tile (rt 1 has the most groups), slots per warp
        g = (rb, (-(-int(n_out) // 16), max(ln[3][0] for ln in launches) * WARPS), launches)
        _geom[gkey] = g
    rb, need, launches = g
    check_operands("MMA GEMV", act, w_raw, int(n_out), out, rb)
    if w_raw.data_ptr() % 16:
        raise ValueError("MMA GEMV: weights must be 16-byte aligned")
    stream = _rt.stream(torch.cuda.current_stream(dev).cuda_stream, dev.index)
    pw, pq, pd, ps, py = (w_raw.data_ptr(), q.data_ptr(), d.data_ptr(), s16.data_ptr(),
                          out.data_ptr())
    K, N_OUT = np.int32(k), np.int32(n_out)
    ws = _workspace(dev.index, *need)
    pc, pp = np.uint64(ws.cnt), np.uint64(ws.part)
    with stream:    # the chunks' launches are stream-ordered: they reuse the same counters / slots
        for fn, c0, nc, grid, sm in launches:
            fn(grid, (THREADS, 1, 1),
               (np.uint64(pw), np.uint64(pq + c0 * k), np.uint64(pd + c0 * (k // 32) * 4),
                np.uint64(ps + c0 * (k // 16) * 4), np.uint64(py + c0 * n_out * 4), N_OUT, K,
                np.int32(nc), pc, pp), shared_mem=sm)
    return out


# ---------------------------------------------------------------- host harness (g++, no GPU)
_HOST_DRIVER = r"""
// ---- host driver (gemv_mma.py)
template <class M>
static int tf_mma_host_frag1(const uint8_t* blk, const int8_t* xb, int t, int j, uint32_t* a,
                             uint32_t* b, float* s) {
  typename M::Raw r;
  M::load(blk, t, r);
  uint32_t aa[M::KS / 16], bb[M::KS / 16];
  M::afrag(r, t, j, aa);
  M::xfrag(xb, t, j, bb);
  for (int i = 0; i < M::KS / 16; ++i) { a[i] = aa[i]; b[i] = bb[i]; }
  M::scale(r, j, s[0], s[1]);
  return 0;
}
extern "C" int tf_mma_host_frag(int qtype, const uint8_t* blk, const int8_t* xb, int t, int j,
                                uint32_t* a, uint32_t* b, float* s) {
  switch (qtype) {
#define TF_CASE(M, T) case T: return tf_mma_host_frag1<M>(blk, xb, t, j, a, b, s);
    TF_MMA_FORMATS(TF_CASE)
#undef TF_CASE
  }
  return -1;
}
extern "C" int tf_mma_host_info(int qtype, int* out) {  // QK, BB, KS, NG, U, MINS, U1, U2, .., SPLIT
  switch (qtype) {
#define TF_CASE(M, T) case T: out[0] = M::QK; out[1] = M::BB; out[2] = M::KS; out[3] = M::NG; \
    out[4] = M::U; out[5] = M::MINS; out[6] = tf_mma_u<M, 1>::U; out[7] = tf_mma_u<M, 2>::U; \
    out[8] = tf_mma_u<M, 1, 2>::U; out[9] = tf_mma_u<M, 2, 2>::U; out[10] = tf_mma_split<M>::v; \
    return 0;
    TF_MMA_FORMATS(TF_CASE)
#undef TF_CASE
  }
  return -1;
}
extern "C" int tf_mma_host_slot_floats() { return TF_MMA_SLOT_FLOATS; }
// the lean K4 epilogue's per-block values of one row (blk: a Q4_K / Q5_K block; its first 16
// bytes are the header words): ws[j], nws[j] (tf_mma_k4_ws), m[2t], m[2t+1] = groups t, t + 4
// (tf_mma_k4_mins_t), dmin
extern "C" void tf_mma_host_k4_lean(const uint8_t* blk, float* ws, float* nws, float* m,
                                    float* dmin) {
  uint32_t h[4];
  tf_ld_words<16, 4>(blk, h);
  const tf_mma_k4_row k = tf_mma_k4_consts(h);
  for (int j = 0; j < 8; ++j) tf_mma_k4_ws(h, j, k.d, k.dn, k.bd, k.bdn, ws[j], nws[j]);
  for (int t = 0; t < 4; ++t) tf_mma_k4_mins_t(h, t, m[2 * t], m[2 * t + 1]);
  *dmin = k.dmin;
}
// the header's fixup bookkeeping for tile group tg: returns P, writes (warp, slot) of each piece
extern "C" int tf_mma_host_fixup(int64_t items, int64_t nw, int spt, int tg, int64_t* warps,
                                 int* slots, int cap) {
  const int64_t a = (int64_t)tg * spt;
  const int P = tf_mma_pieces(items, nw, spt, a);
  const int64_t wf = tf_mma_owner(items, nw, a);
  for (int k = 0; k < P && k < cap; ++k) {
    warps[k] = tf_mma_piece(items, nw, a, wf, k);
    slots[k] = k == 0 ? tf_mma_slot(items, nw, a, warps[k]) : 0;
  }
  return P;
}
extern "C" int tf_mma_host_pipe_smem(int qtype, int rt, int nst) {  // tf_mmp_geo::CTA_BYTES
#define TF_GEO(M, R, S) if (rt == R && nst == S) return tf_mmp_geo<M, R, S>::CTA_BYTES;
  switch (qtype) {
#define TF_CASE(M, T) case T: TF_GEO(M, 1, 2) TF_GEO(M, 1, 3) TF_GEO(M, 2, 2) TF_GEO(M, 2, 3) break;
    TF_MMA_FORMATS(TF_CASE)
#undef TF_CASE
  }
#undef TF_GEO
  return -1;
}
"""
_host_lock = threading.Lock()
_host_lib: dict[str, ctypes.CDLL] = {}


def _host() -> ctypes.CDLL:
    from tightfit.kernels.cuda_host import compile_host
    src = source() + _HOST_DRIVER
    key = source_hash(src)
    with _host_lock:
        lib = _host_lib.get(key)
        if lib is None:
            lib = ctypes.CDLL(str(compile_host(src)))
            P = ctypes.c_void_p
            lib.tf_mma_host_frag.argtypes = [ctypes.c_int, P, P, ctypes.c_int, ctypes.c_int, P, P, P]
            lib.tf_mma_host_frag.restype = ctypes.c_int
            lib.tf_mma_host_info.argtypes = [ctypes.c_int, P]
            lib.tf_mma_host_info.restype = ctypes.c_int
            lib.tf_mma_host_k4_lean.argtypes = [P] * 5
            lib.tf_mma_host_k4_lean.restype = None
            lib.tf_mma_host_slot_floats.argtypes = []
            lib.tf_mma_host_slot_floats.restype = ctypes.c_int
            lib.tf_mma_host_fixup.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                              ctypes.c_int, P, P, ctypes.c_int]
            lib.tf_mma_host_fixup.restype = ctypes.c_int
            lib.tf_mma_host_pipe_smem.argtypes = [ctypes.c_int] * 3
            lib.tf_mma_host_pipe_smem.restype = ctypes.c_int
            _host_lib[key] = lib
    return lib


def host_info(qtype: int) -> dict:
    out = np.zeros(11, np.int32)
    if _host().tf_mma_host_info(int(qtype), out.ctypes.data):
        raise ValueError(f"MMA GEMV: no format for GGML type {qtype}")
    return dict(zip(("QK", "BB", "KS", "NG", "U", "MINS", "U1", "U2", "U1R2", "U2R2", "SPLIT"),
                    (int(v) for v in out)))


def host_slot_floats() -> int:
    """TF_MMA_SLOT_FLOATS as the header defines it (g++, no GPU)."""
    return int(_host().tf_mma_host_slot_floats())


def host_fixup_pieces(items: int, spt: int, nw: int, tg: int) -> list[tuple[int, int]]:
    """fixup_pieces computed by the header's own tf_mma_pieces / tf_mma_piece / tf_mma_slot."""
    cap = max(1, spt)
    w = np.zeros(cap, np.int64)
    sl = np.zeros(cap, np.int32)
    p = _host().tf_mma_host_fixup(int(items), int(nw), int(spt), int(tg), w.ctypes.data,
                                  sl.ctypes.data, cap)
    if p > cap:
        raise RuntimeError(f"host_fixup_pieces: {p} pieces > {cap}")
    return [(int(w[k]), int(sl[k])) for k in range(p)]


def host_pipe_smem(qtype: int, rt: int, nst: int) -> int:
    """tf_mmp_geo<M, rt, nst>::CTA_BYTES as the header computes it (g++, no GPU)."""
    return int(_host().tf_mma_host_pipe_smem(int(qtype), int(rt), int(nst)))


def host_k4_lean(blk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The lean K4 epilogue's values of one Q4_K / Q5_K block row, by the header's own code on the
    CPU: ws [8], nws [8] (tf_mma_k4_ws), m [4, 2] (lane t's mins of groups t, t + 4), dmin."""
    buf = np.zeros(32, np.uint8)
    buf[:16] = np.asarray(blk, np.uint8)[:16]
    ws, nws, m = np.zeros(8, np.float32), np.zeros(8, np.float32), np.zeros(8, np.float32)
    dmin = np.zeros(1, np.float32)
    _host().tf_mma_host_k4_lean(buf.ctypes.data, ws.ctypes.data, nws.ctypes.data, m.ctypes.data,
                                dmin.ctypes.data)
    return ws, nws, m.reshape(4, 2), float(dmin[0])


def host_frag(qtype: int, blk: np.ndarray, xb: np.ndarray, t: int, j: int
              ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """One lane's view of group j of one block, computed by the header's own code on the CPU:
    (a bytes int8 [KS/4] = afrag's words, slot 4t.. then 16+4t.., b bytes int8 [KS/4] = xfrag's
    words on the column's x `xb` (int8 [QK]), ws, wm)."""
    info = host_info(qtype)
    blk = np.ascontiguousarray(blk, dtype=np.uint8)
    # the device guarantees 16-byte aligned blocks where BB allows (TF_BLK_ALIGN); numpy's
    # buffers are at least 16-aligned, so copy into a fresh one
    buf = np.zeros(info["BB"] + 16, np.uint8)
    buf[:info["BB"]] = blk
    xbuf = np.ascontiguousarray(xb, dtype=np.int8)
    kw = info["KS"] // 16
    a = np.zeros(kw, np.uint32)
    b = np.zeros(kw, np.uint32)
    s = np.zeros(2, np.float32)
    rc = _host().tf_mma_host_frag(int(qtype), buf.ctypes.data, xbuf.ctypes.data, int(t), int(j),
                                  a.ctypes.data, b.ctypes.data, s.ctypes.data)
    if rc:
        raise ValueError(f"host_frag failed (rc={rc})")
    return a.view(np.int8), b.view(np.int8), float(s[0]), float(s[1])


# ---------------------------------------------------------------- offline compile report (nvcc)
def compile_report(arch: str = "sm_90", nvcc: str | None = None) -> list[dict]:
    """nvcc -cubin -Xptxas -v of every tf_mma<M, NT> (the runtime's NVRTC options, so the A/B
    switches apply): format, type, NT, registers, spill stores / loads (bytes), static shared
    memory (bytes)."""
    nvcc = nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = source() + "\n"
    for t, name in sorted(_formats().items()):
        for v in KERNELS.values():
            src += (f"template __global__ void {v.format(m=name)}(const uint8_t*, "
                    "const int8_t*, const float*, const int*, float*, int, int, int, int*, "
                    "float*);\n")
        if t in PIPE_TYPES:
            for rt in RTS:
                for nst in PIPE_NSTS:
                    src += (f"template __global__ void {PIPE_KERNEL.format(m=name, rt=rt, nst=nst)}"
                            "(const uint8_t*, const int8_t*, const float*, const int*, float*, "
                            "int, int, int, int*, float*);\n")
    with tempfile.TemporaryDirectory() as td:
        cu = os.path.join(td, "tf_mma.cu")
        Path(cu).write_text(src)
        r = subprocess.run([nvcc, *_options(), f"-arch={arch}", "-cubin", "-Xptxas", "-v", cu,
                            "-o", os.path.join(td, "tf_mma.cubin")], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvcc failed:\n{r.stderr[-6000:]}")
    types = {n: t for t, n in _formats().items()}
    pat = re.compile(r"Compiling entry function '_Z\d+tf_mma(_rt|_pipe)?I(\d*)(M_\w+?)Li(\d+)E"
                     r"(?:Li(\d+)E)?\w*'.*?"
                     r"(\d+) bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) registers"
                     r"(?:.*?(\d+) bytes smem)?", re.S)
    out = []
    for m in pat.finditer(r.stderr + r.stdout):
        pipe = m.group(1) == "_pipe"      # tf_mma_pipe<M, RT, NST>: NT = 1
        a, b = int(m.group(4)), int(m.group(5) or 1)
        out.append({"format": m.group(3), "type": types.get(m.group(3), -1),
                    "kernel": "pipe" if pipe else "rt" if m.group(1) else "mma",
                    "nt": 1 if pipe else a, "rt": a if pipe else b, "nst": b if pipe else 0,
                    "regs": int(m.group(8)), "spill_stores": int(m.group(6)),
                    "spill_loads": int(m.group(7)), "smem": int(m.group(9) or 0)})
    out.sort(key=lambda d: (d["type"], d["kernel"], d["rt"], d["nt"], d["nst"]))
    return out


__all__ = ["available", "capable", "supported", "gemv_mma", "prepare", "geometry", "kernel_names",
           "host_frag", "host_info", "compile_report", "source", "NTS", "RTS", "KERNELS", "step_blocks",
           "pipe_smem", "host_pipe_smem", "pipe_default", "PIPE_TYPES", "PIPE_NSTS",
           "fixup_workspace_bytes", "fixup_plan", "fixup_pieces", "fixup_counters",
           "use_workspace", "host_fixup_pieces", "host_slot_floats", "SLOT_FLOATS"]
