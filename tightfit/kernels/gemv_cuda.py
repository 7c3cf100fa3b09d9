"""Decode GEMV in CUDA C++ (NVRTC through cupy): y[N, n_out] = x[N, n_in] . W^T, W raw GGUF blocks.

The kernel and the per-format dot products live in tightfit/kernels/cuda/*.cuh (CONTRACT.md); the
same format code is tested on the CPU by tightfit.kernels.cuda_host. Activations are
quantize_act's layout 0 (int8 per 32, fp32 scale, int32 16-sums). The Triton kernels stay the
fallback: `available()` is False without cupy / CUDA or with TIGHTFIT_GEMV=triton|v1.

Launch path: one module per (device, qtype) compiled at first use (cupy caches the binary on disk),
per-shape launch geometry cached, the kernel launched on torch's current stream with raw pointers,
so a call allocates nothing and never synchronizes (safe inside torch.cuda.graph capture once the
module is compiled, i.e. after one warm-up call per type; `prepare()` does that explicitly).
With PDL on (tightfit/kernels/pdl.py, TIGHTFIT_PDL=1, sm_90) the modules are built with TF_PDL
(gemv_kernel.cuh: L2 prefetch of the first weights, griddepcontrol.wait before any activation
read) and launched with the programmatic-serialization attribute (cuda_runtime.launch);
TIGHTFIT_PDL_PF=n sets the L2 prefetch depth in loop steps (default 1, 0 = none) of every kernel
but tf_gemv3, TIGHTFIT_PDL_PF_V3=n the one of tf_gemv3 in chunks (default 0: its prefetch moves
ptxas' register allocation, see gemv_kernel.cuh).

N > 8 columns: N = 16 runs the NC = 16 instantiation (weights read once); N in 9..15 runs an
8-column launch and an (N-8)-column one (weights read twice).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache

import numpy as np
import torch

from tightfit.kernels import cuda_runtime as _rt
from tightfit.kernels import pdl as _pdl
from tightfit.kernels.cuda_source import format_list, formats_source, source_hash
from tightfit.quant.traits import traits

NCS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
THREADS = 256          # gemv_kernel.cuh TF_THREADS
WARPS = THREADS // 32
_lock = threading.Lock()
_modules: dict[tuple, dict[int, object]] = {}
_geom: dict[tuple, tuple] = {}


KERNS = ("auto", "v2", "v2h", "v3", "v4", "v5", "v5s")
# Measured on the H200 (bench/RESULTS.md session 4 calls 1 and 4, % of copy bandwidth at
# 5120->17408 / 17408->5120): at N = 1, v2h lifts IQ4_XS from 46/42 % (v1) to 51/51 % and Q5_K
# 17408->5120 from 57 to 62 %, the other formats within +-2 %; tf_gemv4 lifts IQ4_XS further to
# 57/58 % but slows Q5_K to 55/57 %, so v4 runs it for IQ4_XS only (V4_FORMATS); at N = 8, v3 lifts
# every format on the wide shapes by 20-40 % (Q8_0 31/27 -> 40/38 %) but loses on 5120->1024
# (Q8_0 14 -> 11 %). "auto" takes each winner: v4 at NC = 1, v3 from auto_v3_min_nc(type) columns
# on matrices with >= V3_MIN_OUT rows, the v2 bodies (v4's module) otherwise.
DEFAULT_KERN = "auto"
V4_FORMATS = ("F_IQ4_XS",)
# Session 5 call 1 (bench/RESULTS.md): at N = 1 tf_gemv5 took Q6_K from 56/47 % to 60/57 % of the
# copy bandwidth (5120->17408 / 17408->5120) and lost 1 point on Q5_K (tf_gemv5s lost on both), so
# v4 (and with it "auto") runs tf_gemv5 for Q6_K only.
V4_V5_FORMATS = ("F_Q6_K",)
V3_MIN_OUT = 4096
# Session 15 call 2 (bench/RESULTS.md): at NC = 2 and 3 the v2 bodies (v4's module: tf_gemv2, the
# two-phase formats at U = 4 for NC <= 2) beat tf_gemv3 on every wide shape of the 27B, e.g. at
# NC = 2 Q6_K 17408->5120 36.6 against 58.5 us, IQ4_XS 5120->17408 24.8 against 30.7; at NC = 3
# IQ4_XS 29.6 against 35.3 (v3 kept 3-14 % on 5120->6144); at NC = 5 v3 wins (IQ4_XS 42.1 against
# 42.8, Q6_K 17408->5120 60.8 against 81.2); at NC = 4 they split by shape (call 4: the verify
# block M = 4 13.43 / 13.41 ms either way), so NC = 4 keeps v3. So "auto"
# runs v3 from AUTO_V3_MIN_NC columns (it ran it from 2). The 2-3-bit formats of the seed mix keep
# the v2 bodies through NC = 5 (call 5: at NC = 5 IQ2_S 17408->5120 47.7 against 66.7 us, 5120->17408
# 46.3 / 56.4, IQ2_XS 46.3 / 66.0, Q3_K 60.2 / 65.3, IQ3_XXS 55.1 / 58.2, IQ3_S 54.8 / 61.2; at
# NC = 8 v3 is ahead on the 2-bit ones; NC = 6, 7 not measured). TIGHTFIT_CU_AUTO_V3_MIN_NC=N sets
# one threshold for every type (2: the old rule), for A/B timing; read once at import.
AUTO_V3_MIN_NC = 4
AUTO_V3_MIN_NC_BY_TYPE = {11: 6, 17: 6, 18: 6, 21: 6, 22: 6}   # Q3_K IQ2_XS IQ3_XXS IQ3_S IQ2_S
_AUTO_V3_ENV = os.environ.get("TIGHTFIT_CU_AUTO_V3_MIN_NC", "").strip()


def auto_v3_min_nc(qtype: int | None = None) -> int:
    """Columns from which "auto" runs tf_gemv3 on wide matrices of GGML type `qtype`."""
    if _AUTO_V3_ENV:
        return max(2, int(_AUTO_V3_ENV))
    return AUTO_V3_MIN_NC_BY_TYPE.get(int(qtype), AUTO_V3_MIN_NC) if qtype is not None \
        else AUTO_V3_MIN_NC
# Opt-in (not yet measured): "v5" / "v5s" = "auto", except NC = 1 of V5_FORMATS runs tf_gemv5 /
# tf_gemv5s (gemv_kernel.cuh: compute1 of F_Q5_K / F_Q6_K with tf_gemv2h's item-to-lane mapping,
# compile-time item offsets; v5: U = 4, <= 80 registers; v5s: U = 2, <= 64 registers).
V5_FORMATS = ("F_Q5_K", "F_Q6_K")
V5_KERNS = {"v5": "tf_gemv5", "v5s": "tf_gemv5s"}


def _kern(config: dict | None = None) -> str:
    """Kernel variant: config["kern"], else env TIGHTFIT_CU_GEMV, else DEFAULT_KERN.
    (v1, the session-3 dot bodies, measured no faster than v2h on any format and was removed.)
    v2: tf_gemv2 (block loop with fixed part, two-phase load/compute for IQ4_XS / Q5_K, U=4 at
        NC <= 2 for those, cheaper IQ4 lookup). v2h: v2, but NC = 1 uses tf_gemv2h (min 4
        CTAs/SM, <= 64 registers: ptxas keeps the U items' loads hoisted).
    v3: tf_gemv3 for NC >= V3_MIN_NC (x staged in shared memory per CTA, RPW rows per warp,
        v2 format bodies); NC below that runs tf_gemv with the v2 bodies.
    v4: v2h, except NC = 1 of V4_FORMATS runs tf_gemv4 (fewer instructions per item: the
        format's single-column compute1, constant-offset item addressing).
    auto: v4 below auto_v3_min_nc(type) columns and on narrow matrices, v3 from there on wide
        ones (measured winners).
    v5 / v5s: auto, but NC = 1 of V5_FORMATS (Q5_K, Q6_K) runs tf_gemv5 / tf_gemv5s (opt-in A/B;
        their module holds v4's kernels for every other launch that auto gives v4)."""
    k = (config or {}).get("kern") or os.environ.get("TIGHTFIT_CU_GEMV") or DEFAULT_KERN
    k = str(k).strip().lower()
    if k not in KERNS:
        raise ValueError(f"CUDA GEMV: kern {k!r} not in {KERNS}")
    return k


def concrete(kern: str, nc: int, n_out: int | None = None, qtype: int | None = None) -> str:
    """The variant that runs an NC-column launch: `kern` itself unless it is "auto" (see KERNS).
    n_out None (no shape known: compile-time) counts as a large matrix; qtype None takes the
    default column threshold (auto_v3_min_nc)."""
    if kern not in ("auto",) + tuple(V5_KERNS):
        return kern
    # v5 / v5s: their own module stands in for v4's (same kernels but NC = 1 of V5_FORMATS)
    alt = "v4" if kern == "auto" else kern
    if nc < auto_v3_min_nc(qtype):
        return alt
    return "v3" if (n_out is None or n_out >= V3_MIN_OUT) else alt


def module_kerns(kern: str) -> tuple[str, ...]:
    """Concrete variants whose modules `kern` may launch (v4's module holds tf_gemv2 at NC >= 2)."""
    return {"auto": ("v4", "v3"), "v5": ("v5", "v3"), "v5s": ("v5s", "v3")}.get(kern, (kern,))


PDL_PF_DEFAULT, PDL_PF_V3_DEFAULT = 1, 0


def pdl_pf() -> tuple[int, int]:
    """L2 prefetch depths of a PDL build before griddepcontrol.wait: (loop steps of the v1 / v2 /
    v4 / v5 kernels: TIGHTFIT_PDL_PF, chunks of tf_gemv3: TIGHTFIT_PDL_PF_V3); 0 = wait only."""
    return (max(0, int(os.environ.get("TIGHTFIT_PDL_PF", PDL_PF_DEFAULT))),
            max(0, int(os.environ.get("TIGHTFIT_PDL_PF_V3", PDL_PF_V3_DEFAULT))))


def pdl_state(device_index: int) -> tuple[int, int] | None:
    """None: launch without PDL (the unchanged build); else the prefetch depths of the PDL build."""
    return pdl_pf() if _pdl.enabled(device_index) else None


def _prefix(kern: str, pf: tuple[int, int] | None = None) -> str:
    """Defines prepended to the source: v3 -> TF_CSE_FRIENDLY (tf_dp4a /
    tf_h2f without volatile asm, so NVVM can merge the identical x loads of a warp's rows);
    pf not None -> TF_PDL + TF_PDL_PF + TF_PDL_PF_V3 (gemv_common.cuh)."""
    pre = {"v3": "#define TF_CSE_FRIENDLY 1\n"}.get(kern, "")
    if pf is not None:
        pre += f"#define TF_PDL 1\n#define TF_PDL_PF {int(pf[0])}\n#define TF_PDL_PF_V3 {int(pf[1])}\n"
    return pre


def _source(kern: str, pf: tuple[int, int] | None = None) -> str:
    return _prefix(kern, pf) + formats_source(True)


def _mode() -> str:
    return os.environ.get("TIGHTFIT_GEMV", "auto").strip().lower()


def _cupy():
    return _rt.cupy()


def available() -> bool:
    """cupy importable, a CUDA device present, TIGHTFIT_GEMV not forcing triton / v1."""
    if _mode() in ("triton", "v1"):
        return False
    if not torch.cuda.is_available():
        return False
    return _cupy() is not None


@lru_cache(maxsize=1)
def _formats() -> dict[int, str]:
    return {t: name for name, t in format_list()}


def supported(qtype: int) -> bool:
    return int(qtype) in _formats()


@lru_cache(maxsize=None)
def parts(qtype: int) -> int:
    """PARTS of a format's struct (lanes per block), parsed from the source."""
    name = _formats()[int(qtype)]
    src = formats_source(False)
    m = re.search(r"struct\s+" + re.escape(name) + r"\s*\{(.*?)template", src, re.S)
    p = re.search(r"PARTS\s*=\s*(\d+)", m.group(1)) if m else None
    if p is None:
        raise RuntimeError(f"cannot find PARTS of {name}")
    return int(p.group(1))


def pick_wpr(qtype: int, n_in: int, n_out: int) -> int:
    """Warps per row: enough warps in the grid (>= 8192, ~2 per resident slot on 132 SMs) while
    each warp keeps >= 2 steps of 32 items (>= 1 for small matrices, which are latency-bound)."""
    env = os.environ.get("TIGHTFIT_CU_WPR")
    if env:
        return int(env)
    items = n_in // traits(qtype).block_size * parts(qtype)
    min_steps = 2 if n_out >= 2048 else 1
    # tiny matrices (the GDN gates, 5120 -> 48 / 96) are pure latency: half a step per warp is
    # enough (session 23, bench/gemv.py: Q8_0 5120 -> 96 at N = 5 3.8 us at 8 warps per row
    # against 4.5 at 4, at N = 1 2.7 against 3.0)
    per_warp = 16 if n_out < 256 else 32 * min_steps
    wpr = 1
    while wpr < WARPS and n_out * wpr < 8192 and items >= per_warp * (2 * wpr):
        wpr *= 2
    return wpr


def pick_wpr_v3(n_in: int, n_out: int, nc: int, sms: int = 132) -> int:
    """v3 warps per row group: 1 unless the grid would have < 2 CTAs per SM (132 SMs on the H200),
    then 2 when the chunk has items for it (KC >= 2048) and K has >= 2 chunks' worth of work.
    TIGHTFIT_CU_WPR overrides (clipped to what the chunk allows)."""
    kc, rpw = v3_geom(nc)
    wmax = kc // 1024
    env = os.environ.get("TIGHTFIT_CU_WPR")
    if env:
        return max(1, min(int(env), wmax))
    rpc = WARPS * rpw
    if (n_out + rpc - 1) // rpc < 2 * sms and wmax >= 2 and n_in >= 2 * kc:
        return 2
    return 1


TWO_PHASE = ("F_IQ4_XS", "F_Q5_K")   # formats with Raw/load/compute (gemv_fmt_main.cuh, v2 only)

# v3 (tf_gemv3, gemv_kernel.cuh): every format, NC >= V3_MIN_NC. At NC = 1 there is no x reuse to
# win (x is 1 byte per weight per column, the weights ~0.5 byte: L1 keeps up) and the staging adds
# two barriers per chunk, so N = 1 keeps the v1 kernel structure.
V3_MIN_NC = 2


def v3_geom(nc: int) -> tuple[int, int]:
    """(KC elements per staged chunk, RPW rows per warp) of tf_gemv3<F, nc> -- mirrors
    tf_v3_geom in gemv_kernel.cuh (tests/test_gemv_cuda_v3.py checks the two agree)."""
    return (2048, 2) if nc <= 8 else (1024, 1)


def v3_smem(nc: int, s16: bool = True) -> int:
    """Static shared memory of tf_gemv3 (two staging buffers + reduction), bytes; < 48 KiB."""
    kc, rpw = v3_geom(nc)
    buf = nc * kc + nc * (kc // 32) * 4 + (nc * (kc // 16) * 4 if s16 else 0)
    return 2 * buf + WARPS * rpw * nc * 4


def _v3(kern: str, nc: int) -> bool:
    return kern == "v3" and nc >= V3_MIN_NC


def _kname(kern: str, nc: int, name: str = "") -> str:
    """v2 / v2h change only the two-phase formats; every other format keeps tf_gemv.
    v3: tf_gemv3 for every format at NC >= V3_MIN_NC, else tf_gemv."""
    if _v3(kern, nc):
        return "tf_gemv3"
    if kern in V5_KERNS:
        if nc == 1 and name in V5_FORMATS:
            return V5_KERNS[kern]
        kern = "v4"
    if nc == 1 and kern == "v4" and name in V4_V5_FORMATS:
        return "tf_gemv5"
    if kern == "v3" or name not in TWO_PHASE:
        return "tf_gemv"
    if nc == 1 and kern in ("v2h", "v4"):
        return "tf_gemv4" if (kern == "v4" and name in V4_FORMATS) else "tf_gemv2h"
    return "tf_gemv2"


def kernel_names(qtype: int, kern: str | None = None) -> list[str]:
    name = _formats()[int(qtype)]
    kern = kern or _kern()
    if kern == "auto":
        raise ValueError("kernel_names needs a concrete variant (see concrete())")
    return [f"{_kname(kern, nc, name)}<{name}, {nc}>" for nc in NCS]


def _module(qtype: int, device: int, kern: str | None = None,
            pf: tuple[int, int] | None = None) -> dict[int, object]:
    """Functions per NC of one concrete variant's module (pf: pdl_state, None = no PDL)."""
    kern = kern or _kern()
    key = (device, int(qtype), kern, pf)
    mods = _modules.get(key)
    if mods is not None:
        return mods
    with _lock:
        mods = _modules.get(key)
        if mods is None:
            cp = _cupy()
            names = kernel_names(qtype, kern)
            with cp.cuda.Device(device):
                mod = cp.RawModule(code=_source(kern, pf), options=("-std=c++17",),
                                   name_expressions=names)
                mods = {nc: mod.get_function(n) for nc, n in zip(NCS, names)}
            _modules[key] = mods
    return mods


def prepare(qtype: int, device=None, config: dict | None = None) -> None:
    """Compile (or load from cupy's cache) the module of `qtype` now, outside any graph capture."""
    dev = torch.device(device) if device is not None else torch.device("cuda")
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    for k in module_kerns(_kern(config)):
        _module(int(qtype), idx, k, pdl_state(idx))


def _stream(ptr: int, device: int):
    return _rt.stream(ptr, device)


def _chunks(n: int) -> list[tuple[int, int]]:
    if n <= 8 or n == 16:
        return [(0, n)]
    return [(0, 8), (8, n - 8)] if n <= 16 else [(c, min(8, n - c)) for c in range(0, n, 8)]


def check_type(who: str, qtype: int, is_supported) -> int:
    """The type gate every raw-block GEMV entry point starts with (gemv_cuda, gemv_mma)."""
    qtype = int(qtype)
    if not is_supported(qtype):
        raise ValueError(f"{who}: GGML type {qtype} not supported")
    return qtype


def layout0(who: str, act) -> tuple:
    """(N, K, q, d, s16) of a layout-0 QuantAct (quantize_act), the activations every raw-block
    GEMV (gemv_cuda, gemv_mma) reads."""
    if getattr(act, "layout", None) != 0:
        raise ValueError(f"{who} needs layout-0 activations, got layout {getattr(act, 'layout', None)}")
    return int(act.n), int(act.k), act.q, act.d, act.s16


def check_shape(who: str, qtype: int, act, dev: torch.device) -> int:
    """Shape checks of a raw-block GEMV launch (gemv_cuda, gemv_mma), made once per geometry;
    returns the bytes per weight row."""
    tr = traits(qtype)
    n, k = int(act.n), int(act.k)
    if dev.type != "cuda":
        raise ValueError(f"{who}: weights are not on a CUDA device")
    if k % tr.block_size or k % 32:
        raise ValueError(f"{who}: n_in={k} not a multiple of the block size {tr.block_size}")
    if n < 1:
        raise ValueError(f"{who}: no activation columns")
    return k // tr.block_size * tr.type_size


def check_operands(who: str, act, w_raw: torch.Tensor, n_out: int, out: torch.Tensor,
                   rb: int) -> None:
    """Buffer checks of every raw-block GEMV launch (gemv_cuda, gemv_mma): contiguous uint8
    weights of n_out rows of rb bytes, layout-0 QuantAct buffers [N, K] with q 16-byte aligned,
    a contiguous fp32 [N, n_out] output on the weights' device."""
    n, k = int(act.n), int(act.k)
    q, d, s16 = act.q, act.d, act.s16
    dev = w_raw.device
    if w_raw.dtype != torch.uint8 or w_raw.numel() != n_out * rb or not w_raw.is_contiguous():
        raise ValueError(f"{who}: weights must be contiguous uint8 with {n_out * rb} bytes, "
                         f"got {w_raw.dtype} {tuple(w_raw.shape)}")
    if (q.dtype != torch.int8 or q.shape != (n, k) or not q.is_contiguous()
            or d.dtype != torch.float32 or d.numel() != n * (k // 32) or not d.is_contiguous()
            or s16.dtype != torch.int32 or s16.numel() != n * (k // 16) or not s16.is_contiguous()):
        raise ValueError(f"{who}: activation buffers do not match QuantAct layout 0 [N, K]")
    if (out.dtype != torch.float32 or out.numel() != n * n_out or not out.is_contiguous()
            or out.device != dev or q.device != dev):
        raise ValueError(f"{who}: out must be contiguous fp32 [{n}, {n_out}] on {dev}")
    if q.data_ptr() % 16:
        raise ValueError(f"{who}: activation q must be 16-byte aligned")


def gemv_cuda(act, w_raw: torch.Tensor, qtype: int, n_out: int, out: torch.Tensor,
              config: dict | None = None) -> torch.Tensor:
    """out[N, n_out] (fp32) = x . W^T, x given as a layout-0 QuantAct (quantize_act)."""
    qtype = check_type("CUDA GEMV", qtype, supported)
    n, k, q, d, s16 = layout0("CUDA GEMV", act)
    dev = w_raw.device
    kern = _kern(config)
    pf = pdl_state(dev.index) if dev.type == "cuda" else None
    gkey = (qtype, n, k, int(n_out), dev.index, kern, pf,
            None if config is None else tuple(sorted(config.items())))
    g = _geom.get(gkey)
    if g is None:
        rb = check_shape("CUDA GEMV", qtype, act, dev)
        wpr = int((config or {}).get("wpr", 0)) or pick_wpr(qtype, k, n_out)
        if wpr not in (1, 2, 4, 8):
            raise ValueError(f"CUDA GEMV: wpr {wpr} not in 1, 2, 4, 8")
        launches = []
        for c0, nc in _chunks(n):
            ck = concrete(kern, nc, int(n_out), qtype)
            mods = _module(qtype, dev.index, ck, pf)
            if _v3(ck, nc):
                kc, rpw = v3_geom(nc)
                w3 = int((config or {}).get("wpr", 0)) or pick_wpr_v3(k, n_out, nc)
                if w3 not in (1, 2, 4, 8) or w3 > kc // 1024:
                    raise ValueError(f"CUDA GEMV v3: wpr {w3} not in 1..{kc // 1024} (NC={nc})")
                rpc = WARPS // w3 * rpw
                launches.append((mods[nc], c0, nc, ((int(n_out) + rpc - 1) // rpc, 1, 1),
                                 w3.bit_length() - 1))
            else:
                rpc = WARPS // wpr
                launches.append((mods[nc], c0, nc, ((int(n_out) + rpc - 1) // rpc, 1, 1),
                                 wpr.bit_length() - 1))
        g = (rb, launches)
        _geom[gkey] = g
    rb, launches = g
    check_operands("CUDA GEMV", act, w_raw, int(n_out), out, rb)
    if (kern in V5_KERNS or _formats()[qtype] in V4_V5_FORMATS) and (d.data_ptr() % 8
                                                                      or s16.data_ptr() % 8):
        raise ValueError(f"CUDA GEMV {kern}: activation d / s16 must be 8-byte aligned")
    sptr = torch.cuda.current_stream(dev).cuda_stream
    pw, pq, pd, ps, py = (w_raw.data_ptr(), q.data_ptr(), d.data_ptr(), s16.data_ptr(),
                          out.data_ptr())
    K, N_OUT = np.int32(k), np.int32(n_out)
    for fn, c0, _nc, grid, wlog in launches:
        _rt.launch(fn, grid, (THREADS, 1, 1),
                   (np.uint64(pw), np.uint64(pq + c0 * k), np.uint64(pd + c0 * (k // 32) * 4),
                    np.uint64(ps + c0 * (k // 16) * 4), np.uint64(py + c0 * n_out * 4), N_OUT, K,
                    np.int32(wlog)),
                   stream_ptr=sptr, device=dev.index, pdl=pf is not None)
    return out


# ---------------------------------------------------------------- offline compile report (nvcc)
def _report_pf(pdl: bool | None) -> tuple[int, int] | None:
    """Offline builds: pdl None follows TIGHTFIT_PDL alone (no device to ask)."""
    on = _pdl._env_on() if pdl is None else pdl
    return pdl_pf() if on else None


def report_source(lowbit: bool | None = None, kern: str | None = None, pdl: bool | None = None
                  ) -> tuple[str, list[tuple[str, int, int]]]:
    kern = kern or _kern()
    if kern == "auto":
        raise ValueError("compile_report needs a concrete variant: v2, v2h, v3, v4, v5 or v5s")
    src = _prefix(kern, _report_pf(pdl)) + formats_source(True, lowbit=lowbit)
    inst, rows = [], []
    for name, t in format_list(src):
        for nc in NCS:
            inst.append(f"template __global__ void {_kname(kern, nc, name)}<{name}, {nc}>(const uint8_t*, "
                        "const int8_t*, const float*, const int*, float*, int, int, int);\n")
            rows.append((name, t, nc))
    return src + "\n" + "".join(inst), rows


def compile_report(arch: str = "sm_90", nvcc: str | None = None,
                   lowbit: bool | None = None, kern: str | None = None,
                   pdl: bool | None = None) -> list[dict]:
    """Compile the kernel source with nvcc -cubin -Xptxas -v; per instantiation: format, type,
    NC, registers, spill stores/loads (bytes), static shared memory (bytes). pdl: the PDL build
    (None: as TIGHTFIT_PDL says)."""
    nvcc = nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src, _ = report_source(lowbit, kern, pdl)
    with tempfile.TemporaryDirectory() as td:
        cu = os.path.join(td, "tf_gemv.cu")
        with open(cu, "w") as f:
            f.write(src)
        r = subprocess.run([nvcc, "-std=c++17", f"-arch={arch}", "-cubin", "-Xptxas", "-v", cu,
                            "-o", os.path.join(td, "tf_gemv.cubin")], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvcc failed:\n{r.stderr[-6000:]}")
    out = []
    types = {n: t for n, t in format_list(src)}
    pat = re.compile(r"Compiling entry function '_Z\d+tf_gemv\w*?I\d+(F_\w+?)Li(\d+)E\w*'.*?"
                     r"(\d+) bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) registers"
                     r"(?:.*?(\d+) bytes smem)?", re.S)
    for m in pat.finditer(r.stderr + r.stdout):
        out.append({"format": m.group(1), "type": types.get(m.group(1), -1), "nc": int(m.group(2)),
                    "regs": int(m.group(5)), "spill_stores": int(m.group(3)),
                    "spill_loads": int(m.group(4)), "smem": int(m.group(6) or 0)})
    out.sort(key=lambda d: (d["type"], d["nc"]))
    return out


__all__ = ["available", "supported", "gemv_cuda", "prepare", "pick_wpr", "compile_report",
           "NCS", "source_hash", "KERNS", "concrete", "auto_v3_min_nc", "module_kerns", "v3_geom",
           "v3_smem", "pick_wpr_v3"]
