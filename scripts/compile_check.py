"""Offline compile check of every Triton kernel in tightfit for the H200 (CUDA sm_90), no GPU.

Run it before each device call; it must pass under the device's Triton (3.6) and this machine's:

    PYTHONPATH=/work/main /tmp/tri36/bin/python scripts/compile_check.py    # Triton 3.6
    PYTHONPATH=/work/main python scripts/compile_check.py                   # local Triton (3.9)

(/tmp/tri36: `python -m venv --system-site-packages /tmp/tri36 && PIP_CONSTRAINT=
/tmp/tri36/bin/pip install triton==3.6.0`; torch/numpy come from the system site-packages.)

Cost: ~350 variants; ~9 min cold on this 2-core machine (-j 2, under load), ~1 min once
Triton's cache (~/.triton/cache, per version) holds them; -k narrows it (e.g. -k "FMT=34 ").

Options: -k SUBSTR (only variants whose kernel or label contains SUBSTR; repeatable),
-j N (worker processes; default: all cores), --fresh (empty Triton cache in a temp dir, so
nothing is served from ~/.triton/cache), --list (print the variants, compile nothing),
--strict (a @triton.jit kernel that no scenario launches is a failure too), --pdl (the
programmatic-dependent-launch variants instead: every recorded launch of a kernel with a `PDL`
constexpr is compiled with PDL=True and launch_pdl=True, its PTX must contain
griddepcontrol.wait, and every kernel of PDL_KERNELS must have such a variant; at most 3
variants per kernel unless --pdl-all), --regs (append
each variant's REG / STACK / LOCAL from its cubin (the bundled cuobjdump) and Triton's dynamic
SMEM bytes; LOCAL or STACK > 0: spills).

How: the real host launchers (gemv, gemv2, gemm_q, embed_rows, attn_decode, ...) are called
with CPU tensors at the 27B shapes, under a fake CUDA driver (target cuda:90) and with
JITFunction._do_compile replaced by a recorder, so every launch yields exactly the signature,
specialization (alignment, ints == 1 -> constexpr), constexprs and options a GPU launch would
compile; EMU constexprs are forced to False (the PTX bodies). The recorded variants are then
compiled all the way to a cubin (Triton's bundled ptxas) in a process pool. Prints a table
kernel | variant | ok / error (first line of the innermost error) and exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

os.environ["TRITON_INTERPRET"] = "0"          # launchers must take their GPU paths
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # silence 3.9's warning; same default

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


class _FakeDriver:
    """Just enough of a driver for JITFunction.run to bind and specialize arguments."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return TARGET

    def get_active_torch_device(self):
        return torch.device("cpu")


# ---- recording launches ---------------------------------------------------------------------------
RECORDS: list = []        # (scenario, fn, signature, constexprs, options dict, attrs)
_SCENARIO = ["?"]
_PDL = [False]            # --pdl: record the PDL=True variants only

# the Triton kernels of the decode step that follow tightfit.kernels.pdl's rules (--pdl checks
# that each has a PDL=True variant that compiles and waits)
PDL_KERNELS = {("norm", "_add_rmsnorm_kernel"), ("norm", "_swiglu_kernel"),
               ("norm", "_gated_rmsnorm_kernel"), ("norm", "_commit_kernel"),
               ("gdn", "_conv_step_kernel"), ("gdn", "_gdn_step_kernel"),
               ("attn_decode", "_qk_prep_kernel"), ("attn_decode", "_attn_kernel"),
               ("attn_decode", "_reduce_kernel"), ("kv_write_q", "_qkv_write_kernel"),
               ("embed", "_embed_q_kernel"), ("embed", "_embed_f_kernel"),
               ("quantize_act", "_quant_kernel"), ("gemv2_act", "_prep_kernel"),
               ("gemv2_small", "gemv2s_kernel"), ("gemv2", "_reduce_kernel")}


def _record(self, key, signature, device, constexprs, options, attrs, warmup):
    ce = dict(constexprs)
    if "EMU" in self.arg_names:
        ce[(self.arg_names.index("EMU"),)] = False
    opts = dict(options.__dict__)
    if _PDL[0]:
        if "PDL" not in self.arg_names:
            return None
        ce[(self.arg_names.index("PDL"),)] = True
        opts["launch_pdl"] = True
    RECORDS.append((_SCENARIO[0], self, dict(signature), ce, opts, attrs))
    return None          # run() returns before launching


def _scn(name, f, *a, **k):
    _SCENARIO[0] = name
    try:
        f(*a, **k)
    except Exception as e:    # a launcher that breaks on CPU tensors: report, keep going
        RECORDS.append((name, None, None, None, None, f"{type(e).__name__}: {e}"))


# ---- scenarios: the launches the engine makes (27B shapes) ---------------------------------------
H, HKV, D, NROT = 24, 4, 256, 64            # full attention
HIDDEN, FFN = 5120, 17408
SHAPES = [(FFN, HIDDEN), (1024, HIDDEN)]     # (n_out, n_in): SPLIT = 1 and SPLIT > 1


def _u8(n):
    return torch.empty(int(n), dtype=torch.uint8)


def scen_gemv_v1():
    from tightfit.kernels.gemv import QUANT_TYPES, FLOAT_TYPES, gemv, gemv_quantized, type_name
    from tightfit.kernels.gemv_kernel import MACRO_BYTES, ACT_LAYOUT
    from tightfit.kernels.quantize_act import quantize_act
    for t in sorted(QUANT_TYPES):
        for (n_out, n_in), ns in ((SHAPES[0], (1, 2, 8)), (SHAPES[1], (1,))):
            for n in ns:
                w = _u8(n_out * n_in // 256 * MACRO_BYTES[t])
                act = quantize_act(torch.zeros(n, n_in), ACT_LAYOUT.get(t, 0))
                _scn(f"gemv v1 {type_name(t)} N={n} {n_out}x{n_in}", gemv_quantized, act, w, t,
                     n_out)
    # the verify block (tightfit.model.verify_graph) runs v1 at N = M <= 16 columns: NP = 4, 16
    for t in sorted(QUANT_TYPES):
        for n_out, n_in in SHAPES:
            w = _u8(n_out * n_in // 256 * MACRO_BYTES[t])
            for n in (3, 16):
                act = quantize_act(torch.zeros(n, n_in), ACT_LAYOUT.get(t, 0))
                _scn(f"gemv v1 block {type_name(t)} N={n} {n_out}x{n_in}", gemv_quantized, act,
                     w, t, n_out)
    bpe = {0: 4, 1: 2, 30: 2}
    for t in sorted(FLOAT_TYPES):
        for n in (1, 8):
            _scn(f"gemv float {type_name(t)} N={n}", gemv, torch.zeros(n, HIDDEN),
                 _u8(1024 * HIDDEN * bpe[t]), t, 1024, HIDDEN)


def scen_gemv_v2():
    from tightfit.kernels.gemv2 import gemv2
    from tightfit.kernels.gemv2_layout import MACRO, V2_TYPES
    for t in sorted(V2_TYPES):
        for planar in (False, True):
            for n_out, n_in in SHAPES:
                w = _u8(n_out * n_in // 256 * MACRO[t])
                for n in (1, 2):
                    for u in (1, 2, 4):      # U: chunks per iteration (bench sweeps it)
                        _scn(f"gemv v2 dp4a t={t} N={n} planar={planar} U={u}", gemv2,
                             torch.zeros(n, n_in), w, t, n_out, n_in, planar=planar,
                             config={"PATH": "dp4a", "U": u})
                for n in (3, 8, 16):
                    _scn(f"gemv v2 tc t={t} N={n} planar={planar}", gemv2,
                         torch.zeros(n, n_in), w, t, n_out, n_in, planar=planar)


def scen_quant_act():
    from tightfit.kernels.quantize_act import quantize_act
    for layout in (0, 1, 2, 3):
        _scn(f"quantize_act layout={layout}", quantize_act, torch.zeros(1, HIDDEN), layout)


def scen_gemm_q():
    from tightfit.kernels.gemm_q import FUSED_TYPES, _ROW_BYTES, gemm_q, dequant_chunk
    for t in sorted(FUSED_TYPES):
        n_out, n_in = 1024, HIDDEN
        w = _u8(n_out * n_in // 256 * _ROW_BYTES[t])
        for m in (16, 64):
            _scn(f"gemm_q fused t={t} M={m}", gemm_q, torch.zeros(m, n_in), w, t, n_out, n_in,
                 mode="fused")
        _scn(f"gemm_q dequant t={t}", dequant_chunk, w, t, n_in, 0, 256,
             out=torch.empty(256, n_in, dtype=torch.bfloat16), use_triton=True)
    # large M (prefill chunks): every (format, shape class) of CONFIGS that routes to the fused
    # kernel ("mode": "fused"), at M = 1024 on a 27B shape of that class
    from tightfit.kernels.gemm_q import CONFIGS, shape_class
    cls_shape = {shape_class(*sh): sh for sh in ((FFN, HIDDEN), (HIDDEN, FFN), (1024, HIDDEN),
                                                 (248320, HIDDEN))}
    for (t, cls), cfg in sorted(CONFIGS.items(), key=str):
        if cfg.get("mode") != "fused" or t == "*":
            continue
        n_out, n_in = cls_shape[cls]
        w = _u8(n_out * n_in // 256 * _ROW_BYTES[t])
        _scn(f"gemm_q fused t={t} {cls} M=1024", gemm_q, torch.zeros(1024, n_in), w, t, n_out,
             n_in, mode="fused")


def scen_embed():
    from tightfit.kernels import embed
    from tightfit.quant.traits import row_bytes
    real, embed._interpret = embed._interpret, lambda: True     # take the device path on CPU
    try:
        for t in sorted(embed.DEVICE_TYPES):
            _scn(f"embed t={t}", embed.embed_rows, torch.zeros(3, dtype=torch.int64),
                 _u8(64 * row_bytes(t, HIDDEN)), t, HIDDEN)
    finally:
        embed._interpret = real


def scen_gemv_t3():
    from tightfit.kernels.gemv_t3 import gemv_t3
    from tightfit.tools.repack import T3_TYPES
    for tid, tt in sorted(T3_TYPES.items()):
        nb = HIDDEN // tt.block_size
        _scn(f"gemv_t3 {tt.name}", gemv_t3, torch.empty(1024, nb * tt.type_size,
                                                         dtype=torch.uint8), tid,
             torch.zeros(HIDDEN))


def scen_attention():
    from tightfit.kernels import attn_decode as A
    st = torch.zeros(4, dtype=torch.int32)
    qg, k, v = torch.zeros(H, 2 * D), torch.zeros(HKV * D), torch.zeros(HKV * D)
    nw = torch.zeros(D)
    cos, sin = torch.zeros(4096, NROT // 2), torch.zeros(4096, NROT // 2)
    kc = torch.zeros(4096, HKV, D, dtype=torch.float16)
    q = torch.zeros(H, D)
    _scn("attn qk_prep", A.qk_prep, qg, k, v, nw, nw, cos, sin, kc, kc.clone(), q, st, 1e-6)
    out = torch.zeros(H, D)
    _scn("attn single", A.attn_decode, q, kc, kc, qg, out, st)
    ws = A.make_workspace(H, D, 8192)
    _scn("attn split", A.attn_decode, q, kc, kc, qg, out, st, ws=ws, n_chunks=16)
    # the even split-K configuration the device sweep picks (bench/attn_f16_sweep.py)
    os.environ[A.CFG_ENV] = "bt=64;nw=8;ns=3;nl=32"
    try:
        _scn("attn split even", A.attn_decode, q, kc, kc, qg, out, st, ws=ws, n_chunks=16)
    finally:
        os.environ.pop(A.CFG_ENV, None)

    from tightfit.kernels import attn_decode_q as AQ
    from tightfit.kernels import kv_write_q as KW
    from tightfit.kvquant.formats import FORMATS, MIXED, get_format, split_kv_type
    for kv in list(FORMATS) + list(MIXED):
        kn, vn = split_kv_type(kv)
        kf, vf = get_format(kn), get_format(vn)
        kcq = torch.zeros(64, HKV, kf.row_bytes(D), dtype=torch.uint8)
        vcq = torch.zeros(64, HKV, vf.row_bytes(D), dtype=torch.uint8)
        wsq = AQ.make_workspace(kv, H, D, 8192)
        _scn(f"attn_q single {kv}", AQ.attn_decode_q, q, kcq, vcq, qg, out, st, wsq)
        _scn(f"attn_q split {kv}", AQ.attn_decode_q, q, kcq, vcq, qg, out, st, wsq, n_chunks=16)
        wsw = KW.make_write_workspace(kv, HKV, D)
        _scn(f"kv_write_q {kv}", KW.qk_prep_q, qg, k, v, nw, nw, cos, sin, kcq, vcq, q, st,
             1e-6, wsw)


def scen_norm_gdn():
    from tightfit.kernels import norm, gdn
    st = torch.zeros(4, dtype=torch.int32)
    x, w = torch.zeros(1, HIDDEN), torch.zeros(HIDDEN)
    _scn("norm add_rmsnorm delta", norm.add_rmsnorm, x, torch.zeros_like(x), w, 1e-6,
         torch.zeros_like(x))
    _scn("norm add_rmsnorm", norm.add_rmsnorm, x, None, w, 1e-6, torch.zeros_like(x))
    g = torch.zeros(FFN)
    _scn("norm swiglu", norm.swiglu, g, g, g.clone())
    o = torch.zeros(48, 128)
    _scn("norm gated_rmsnorm", norm.gated_rmsnorm, o, o, torch.zeros(128), 1e-6, o.clone())
    _scn("norm commit", norm.commit, torch.zeros(248320), torch.zeros(HIDDEN), st)
    conv_dim = 2 * 16 * 128 + 48 * 128
    cb = torch.zeros(2, 1, 3, conv_dim)
    _scn("gdn conv_step", gdn.conv_step, torch.zeros(conv_dim), cb, torch.zeros(conv_dim, 4),
         torch.zeros(conv_dim), st, 0)
    ssm = torch.zeros(2, 1, 48, 128, 128)
    _scn("gdn step", gdn.gdn_step, torch.zeros(conv_dim), torch.zeros(48), torch.zeros(48),
         torch.zeros(48), torch.zeros(48), ssm, torch.zeros(48, 128), st, 0, 16, 1e-6)


def scen_norm_quant():
    """The fused activation quantization of norm.py (quant_out=(q, d, s16), layouts 0..3) at the
    27B widths: add_rmsnorm 5120 (one row and a verify block of 16), swiglu 17408, gated norm
    48 heads x 128."""
    from tightfit.kernels import norm

    def qo(rows, n):
        return (torch.zeros(rows, n, dtype=torch.int8), torch.zeros(rows, n // 32),
                torch.zeros(rows, n // 16, dtype=torch.int32))
    w = torch.zeros(HIDDEN)
    for lay in (0, 1, 2, 3):
        for rows in (1, 16):
            x = torch.zeros(rows, HIDDEN)
            _scn(f"norm add_rmsnorm quant delta L={lay} rows={rows}", norm.add_rmsnorm, x,
                 torch.zeros_like(x), w, 1e-6, torch.zeros_like(x), quant_out=qo(rows, HIDDEN),
                 quant_layout=lay)
            _scn(f"norm add_rmsnorm quant L={lay} rows={rows}", norm.add_rmsnorm, x, None, w,
                 1e-6, torch.zeros_like(x), quant_out=qo(rows, HIDDEN), quant_layout=lay)
            g = torch.zeros(rows, FFN)
            _scn(f"norm swiglu quant L={lay} rows={rows}", norm.swiglu, g, g, g.clone(),
                 quant_out=qo(rows, FFN), quant_layout=lay)
            o = torch.zeros(rows, 48, 128)
            _scn(f"norm gated_rmsnorm quant L={lay} rows={rows}", norm.gated_rmsnorm, o, o,
                 torch.zeros(128), 1e-6, o.clone(), quant_out=qo(rows, 48 * 128),
                 quant_layout=lay)


def scen_block_step():
    """tightfit.kernels.block_step as tightfit.model.verify_graph launches it at the 27B geometry
    for M = 1..16 block tokens (M == 1 and M % 16 == 0 specialize differently), single-pass and
    split-K attention, commit of j = 1..M tokens."""
    from tightfit.kernels import block_step as BS
    m_max, n_rec, hk, hv, s, k = 16, 48, 16, 48, 128, 4
    conv_dim = 2 * hk * s + hv * s
    st = torch.zeros(4, dtype=torch.int32)
    conv_buf = torch.zeros(2, n_rec, k - 1, conv_dim)
    conv_rows = torch.zeros(n_rec, m_max, conv_dim)
    cw = torch.zeros(conv_dim, k)
    # the SSM banks / replay inputs at the real inner shapes; fewer recurrent slots than
    # the 27B's 48 (strides stay multiples of 16, so the specialization is the same)
    ssm = torch.empty(2, 2, hv, s, s)
    ssm_in = torch.empty(2, m_max - 1, hv, 2 * s + 1)
    vec = torch.zeros(hv)
    cos, sin = torch.zeros(4096, NROT // 2), torch.zeros(4096, NROT // 2)
    kc = torch.zeros(4096, HKV, D, dtype=torch.float16)
    nw = torch.zeros(D)
    nch = 16                       # ctx 8192 / chunk 512
    ws = (torch.zeros(m_max * H, nch), torch.zeros(m_max * H, nch),
          torch.zeros(m_max * H, nch, D))
    for M in range(1, m_max + 1):
        y = torch.zeros(m_max, conv_dim)[:M]
        _scn(f"block conv M={M}", BS.conv_block, conv_rows[1, :M], conv_buf, cw, y, st, 1)
        _scn(f"block gdn M={M}", BS.gdn_block, y, torch.zeros(M, hv), torch.zeros(M, hv), vec,
             vec, ssm, ssm_in[1], torch.zeros(M, hv, s), st, 1, hk, 1e-6)
        qg = torch.zeros(m_max, 2 * H * D)[:M]
        kk, vv = torch.zeros(M, HKV * D), torch.zeros(M, HKV * D)
        q = torch.zeros(m_max, H, D)[:M]
        _scn(f"block qk_prep M={M}", BS.qk_prep_block, qg, kk, vv, nw, nw, cos, sin, kc,
             kc.clone(), q, st, 1e-6)
        out = torch.zeros(m_max, H * D)[:M].view(M, H, D)
        _scn(f"block attn single M={M}", BS.attn_block, q, kc, kc, qg, out, st, ws, n_chunks=1)
        _scn(f"block attn split M={M}", BS.attn_block, q, kc, kc, qg, out, st, ws,
             n_chunks=nch, chunk=512)
        for j in sorted({1, 2, M - 1, M} - {0}):
            _scn(f"block commit M={M} j={j}", BS.commit_block, conv_buf, ssm, conv_rows, ssm_in,
                 st, j, M)


def scen_attn_prefill():
    """Bounded prefill attention (attn_prefill_flash): f16 cache in place at chunk sizes of 16, 24
    and 1024 queries; quantized caches over several tiles (first / middle / last launch)."""
    from tightfit.kernels import attn_prefill_flash as AF
    from tightfit.kvquant.formats import FORMATS, MIXED, get_format, split_kv_type
    kc = torch.zeros(4096, HKV, D, dtype=torch.float16)
    for n in (16, 24, 1024):
        q = torch.zeros(n, H, D)
        _scn(f"attn_prefill flash f16 n={n}", AF.flash_attn_prefill, q, kc, kc.clone(), 2048)
    q = torch.zeros(64, H, D)
    for kv in list(FORMATS) + list(MIXED):
        kn, vn = split_kv_type(kv)
        kf, vf = get_format(kn), get_format(vn)
        kcq = torch.zeros(256, HKV, kf.row_bytes(D), dtype=torch.uint8)
        vcq = torch.zeros(256, HKV, vf.row_bytes(D), dtype=torch.uint8)
        _scn(f"attn_prefill flash {kv}", AF.flash_attn_prefill, q, kcq, vcq, 160, kv, tile=64)


def scen_attn_q_extras():
    """attn_decode_q's work around the attention kernel: the new q rotation / merge + output
    kernels with programmatic dependent launch (PDL=True variants, pdl.enabled forced on), and
    the former launches (TIGHTFIT_ATTNQ_EXTRAS=old: _rowmat_kernel, _reduce_q_kernel); each
    also as on the device's CUDA-attention path (attn_decode_q_cuda stubbed out: merge BT=16)."""
    from tightfit.kernels import attn_decode_q as AQ
    from tightfit.kernels import attn_decode_q_cuda as C
    from tightfit.kernels import pdl
    from tightfit.kvquant.formats import get_format, split_kv_type
    st = torch.zeros(4, dtype=torch.int32)
    q, qg, out = torch.zeros(H, 2 * D)[:, :D].contiguous(), torch.zeros(H, 2 * D), \
        torch.zeros(H, D)
    real, env = (pdl.enabled, C.usable, C.attn), os.environ.get(AQ.EXTRAS_ENV)
    try:
        for mode, pdl_on, cuda in (("new", True, False), ("new", True, True),
                                   ("old", False, False), ("old", False, True)):
            os.environ[AQ.EXTRAS_ENV] = mode
            pdl.enabled = (lambda device=None: True) if pdl_on else real[0]
            C.usable = (lambda *a: True) if cuda else real[1]
            C.attn = (lambda *a, **k: None) if cuda else real[2]
            for kv in ("q8_0", "tq3", "tq4", "q8_0+tq3", "tq3+q8_0"):
                kn, vn = split_kv_type(kv)
                kcq = torch.zeros(64, HKV, get_format(kn).row_bytes(D), dtype=torch.uint8)
                vcq = torch.zeros(64, HKV, get_format(vn).row_bytes(D), dtype=torch.uint8)
                wsq = AQ.make_workspace(kv, H, D, 8192)
                tag = f"attn_q extras={mode} pdl={int(pdl_on)} cuda={int(cuda)} {kv}"
                _scn(f"{tag} single", AQ.attn_decode_q, q, kcq, vcq, qg, out, st, wsq)
                _scn(f"{tag} split", AQ.attn_decode_q, q, kcq, vcq, qg, out, st, wsq,
                     n_chunks=16)
    finally:
        pdl.enabled, C.usable, C.attn = real
        if env is None:
            os.environ.pop(AQ.EXTRAS_ENV, None)
        else:
            os.environ[AQ.EXTRAS_ENV] = env


def scen_attn_q_tests():
    """attn_decode_q at the shapes of tests/test_kvquant_kernel.py and the whole-call test of
    tests/test_attn_decode_q_extras.py, as those tests launch it on the H200 (compiled kernels,
    CUDA tensors, PDL off). backend=device: attn_decode_q_cuda as the device decides it (cupy,
    sm_90: `shape_ok`, so D = 64 / 32 take the Triton attention kernel, D = 256 the CUDA one,
    stubbed out here: merge with BT = C.TILE); backend=cuda: the CUDA kernel forced (stubbed)
    at every shape; backend=triton: the Triton attention kernel at every shape."""
    from tightfit.kernels import attn_decode_q as AQ
    from tightfit.kernels import attn_decode_q_cuda as C
    from tightfit.kvquant.formats import get_format, split_kv_type

    def case(kv, h, hkv, d, t):
        kn, vn = split_kv_type(kv)
        kc = torch.zeros(t + 3, hkv, get_format(kn).row_bytes(d), dtype=torch.uint8)
        vc = torch.zeros(t + 3, hkv, get_format(vn).row_bytes(d), dtype=torch.uint8)
        st = torch.tensor([0, 0, t - 1], dtype=torch.int32)
        return torch.zeros(h, d), kc, vc, torch.zeros(h, 2 * d), torch.zeros(h, d), st

    from tightfit.kernels import attn_decode as A
    from tightfit.kernels import kv_write_q as KW
    for kv in ("q8_0", "tq3", "tq4_128+tq2", "q8_0+tq3"):     # the tests' qk_prep_q launches
        kn, vn = split_kv_type(kv)
        cos, sin = A.rope_tables(16, 32, 1e4)
        for rq in (False, True):
            _scn(f"attn_q tests kv_write_q {kv} rotate_q={rq}", KW.qk_prep_q,
                 torch.zeros(4, 256), torch.zeros(256), torch.zeros(256), torch.zeros(128),
                 torch.zeros(128), cos, sin,
                 torch.zeros(8, 2, get_format(kn).row_bytes(128), dtype=torch.uint8),
                 torch.zeros(8, 2, get_format(vn).row_bytes(128), dtype=torch.uint8),
                 torch.zeros(4, 128), torch.zeros(4, dtype=torch.int32), 1e-6,
                 KW.make_write_workspace(kv, 2, 128), rotate_q=rq)
    real, xenv = (C.usable, C.attn), os.environ.get(AQ.XCFG_ENV)
    try:
        for backend in ("device", "cuda", "triton"):
            if backend == "device":
                C.usable = lambda q, kf, vf, hkv: C.shape_ok(kf, vf, q.shape[0], hkv, q.shape[1])
            else:
                C.usable = (lambda *a: True) if backend == "cuda" else (lambda *a: False)
            C.attn = lambda *a, **k: None
            tag = f"attn_q tests backend={backend}"
            os.environ.pop(AQ.XCFG_ENV, None)
            # test_kvquant_kernel.test_single_pass_and_split: H 4, Hkv 2, D 64, T 77
            for kv in ("q8_0", "tq4", "tq3", "tq2", "q8_0+tq3", "tq4+tq3", "tq3+q8_0"):
                a = case(kv, 4, 2, 64, 77)
                ws = AQ.make_workspace(kv, 4, 64, max_ctx=2048, chunk=32)
                _scn(f"{tag} single_pass_and_split {kv} single", AQ.attn_decode_q, *a, ws)
                _scn(f"{tag} single_pass_and_split {kv} split", AQ.attn_decode_q, *a, ws,
                     n_chunks=4, chunk=32)
            # test_27b_head_shape: H 24, Hkv 4, D 256, T 40, n_chunks 3, chunk 16, BT 16
            for kv in ("tq3", "tq4_128+tq3_128", "tq3_128+q8_0"):
                ws = AQ.make_workspace(kv, 24, 256, max_ctx=4096, chunk=16)
                _scn(f"{tag} 27b_head_shape {kv}", AQ.attn_decode_q, *case(kv, 24, 4, 256, 40),
                     ws, n_chunks=3, chunk=16, BT=16)
            # test_position_from_status: H 2, Hkv 1, D 32, T 20
            ws = AQ.make_workspace("tq3", 2, 32, max_ctx=2048, chunk=16)
            _scn(f"{tag} position_from_status tq3", AQ.attn_decode_q, *case("tq3", 2, 1, 32, 20),
                 ws, n_chunks=2, chunk=16, BT=16)
            # test_split_rows_from_device_T: tq4+tq3, (8, 4) and (3, 8)
            ws = AQ.make_workspace("tq4+tq3", 4, 64, max_ctx=2048, chunk=4)
            for n, ch in ((8, 4), (3, 8)):
                _scn(f"{tag} split_rows tq4+tq3 n={n}", AQ.attn_decode_q,
                     *case("tq4+tq3", 4, 2, 64, 77), ws, n_chunks=n, chunk=ch, BT=16)
            # test_attn_decode_q_extras.test_whole_call_modes (new launches, small tiles) and
            # test_whole_call_msplit_and_q_rotated (XCFG msplit=1, q_rotated)
            for x in ("qbn=16,obn=16,rc=2", "qbn=16,obn=16,rc=2,msplit=1,mbn=32,mnw=2",
                      "obn=64,rc=4,msplit=1,mbn=16"):
                os.environ[AQ.XCFG_ENV] = x
                for kv in ("q8_0", "tq3", "q8_0+tq3", "tq3+q8_0"):
                    ws = AQ.make_workspace(kv, 4, 64, max_ctx=2048, chunk=16)
                    for n in (1, 6):
                        for qr in (False, True):
                            _scn(f"{tag} whole_call {x} {kv} n={n} q_rotated={qr}",
                                 AQ.attn_decode_q, *case(kv, 4, 2, 64, 77), ws, n_chunks=n,
                                 chunk=16, BT=16, q_rotated=qr)
            os.environ.pop(AQ.XCFG_ENV, None)
            # test_kvquant_kernel.test_write_kernel_rotate_q: H 4, Hkv 2, D 128, T 7
            for kv in ("tq3", "q8_0", "tq4_128+tq2", "q8_0+tq3"):
                ws = AQ.make_workspace(kv, 4, 128, max_ctx=2048, chunk=16)
                for n in (1, 2):
                    for qr in (False, True):
                        _scn(f"{tag} write_rotate_q {kv} n={n} q_rotated={qr}",
                             AQ.attn_decode_q, *case(kv, 4, 2, 128, 7), ws, n_chunks=n,
                             chunk=16, BT=16, q_rotated=qr)
    finally:
        C.usable, C.attn = real
        if xenv is None:
            os.environ.pop(AQ.XCFG_ENV, None)
        else:
            os.environ[AQ.XCFG_ENV] = xenv


def scen_attn_q_step_cuts():
    """The decode step's cuts around the quantized attention at the 27B shapes: qk_prep_q with
    rotate_q=True (q = R q in the write kernel), attn_decode_q with q_rotated=True (no qrot
    launch), and the XCFG merge variants (msplit=1: "merge" + "out" launches; larger obn), each
    with PDL on and off and with the CUDA attention kernel stubbed (as on the device) or the
    Triton one."""
    from tightfit.kernels import attn_decode_q as AQ
    from tightfit.kernels import attn_decode_q_cuda as C
    from tightfit.kernels import kv_write_q as KW
    from tightfit.kernels import pdl
    from tightfit.kvquant.formats import get_format, split_kv_type
    st = torch.zeros(4, dtype=torch.int32)
    qg, k, v = torch.zeros(H, 2 * D), torch.zeros(HKV * D), torch.zeros(HKV * D)
    nw = torch.zeros(D)
    cos, sin = torch.zeros(4096, NROT // 2), torch.zeros(4096, NROT // 2)
    q, out = torch.zeros(H, D), torch.zeros(H, D)
    real, xenv = (pdl.enabled, C.usable, C.attn), os.environ.get(AQ.XCFG_ENV)
    xcfgs = ("", "msplit=1", "msplit=1,mbn=32,mnw=4", "msplit=1,mbn=128,mnw=8,obn=64",
             "obn=64", "obn=64,onw=4", "obn=128,onw=8", "msplit=1,mbn=256,mnw=8,obn=16,onw=4")
    try:
        for pdl_on in (False, True):
            pdl.enabled = (lambda device=None: True) if pdl_on else real[0]
            for kv in ("tq3", "tq4", "q8_0+tq3", "tq3+q8_0", "tq4_128+tq3_128"):
                kn, vn = split_kv_type(kv)
                kcq = torch.zeros(64, HKV, get_format(kn).row_bytes(D), dtype=torch.uint8)
                vcq = torch.zeros(64, HKV, get_format(vn).row_bytes(D), dtype=torch.uint8)
                wsw = KW.make_write_workspace(kv, HKV, D)
                _scn(f"step cuts pdl={int(pdl_on)} kv_write_q rotate_q {kv}", KW.qk_prep_q, qg,
                     k, v, nw, nw, cos, sin, kcq, vcq, q, st, 1e-6, wsw, rotate_q=True)
                wsq = AQ.make_workspace(kv, H, D, 32768)
                for cuda in (False, True):
                    C.usable = (lambda *a: True) if cuda else real[1]
                    C.attn = (lambda *a, **kw: None) if cuda else real[2]
                    for x in xcfgs:
                        os.environ[AQ.XCFG_ENV] = x
                        tag = f"step cuts pdl={int(pdl_on)} cuda={int(cuda)} xcfg={x} {kv}"
                        _scn(f"{tag} single", AQ.attn_decode_q, q, kcq, vcq, qg, out, st, wsq,
                             q_rotated=True)
                        _scn(f"{tag} split", AQ.attn_decode_q, q, kcq, vcq, qg, out, st, wsq,
                             n_chunks=64, q_rotated=True)
    finally:
        pdl.enabled, C.usable, C.attn = real
        if xenv is None:
            os.environ.pop(AQ.XCFG_ENV, None)
        else:
            os.environ[AQ.XCFG_ENV] = xenv


SCENARIOS = [scen_gemv_v1, scen_gemv_v2, scen_quant_act, scen_gemm_q, scen_embed, scen_gemv_t3,
             scen_attention, scen_attn_q_extras, scen_attn_q_tests, scen_attn_q_step_cuts,
             scen_attn_prefill, scen_norm_gdn,
             scen_norm_quant, scen_block_step]


# ---- compiling ------------------------------------------------------------------------------------
def _label(fn, ce, opts):
    parts = []
    for path, v in sorted(ce.items()):
        name = fn.arg_names[path[0]]
        parts.append(f"{name}={v}")
    parts.append(f"w{opts.get('num_warps')}")
    return " ".join(parts)


def _first_error(e: BaseException) -> str:
    """Innermost cause's first line, with the innermost 'at L:C' location of the chain."""
    chain, cur = [], e
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    loc = ""
    for c in chain:
        s = str(c).strip()
        if s.startswith("at ") and ":" in s.split("\n", 1)[0]:
            loc = s.split("\n", 1)[0].rstrip(":")
            lines = s.split("\n")
            if len(lines) > 1:
                loc += " `" + lines[1].strip()[:60] + "`"
    inner = chain[-1]
    msg = str(inner).strip().split("\n")
    msg = [m for m in msg if m.strip()]
    first = msg[-1] if msg and msg[0].startswith("at ") else (msg[0] if msg else "")
    out = f"{type(inner).__name__}: {first[:200]}"
    return out + (f" [{loc}]" if loc else "")


def _resources(ck) -> str:
    """'REG:n STACK:n LOCAL:n SMEM:n' of a compiled kernel: registers / stack / local memory from
    its cubin (Triton's bundled cuobjdump; LOCAL / STACK > 0 means register spills or a local
    array), SMEM = Triton's dynamic shared memory in bytes."""
    import re
    import subprocess
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        r = subprocess.run([exe, "--dump-resource-usage", f.name], capture_output=True,
                           text=True, timeout=60)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", r.stdout)
    smem = getattr(ck.metadata, "shared", None)        # dynamic shared memory (Triton's)
    return (f"REG:{m[1]} STACK:{m[2]} LOCAL:{m[4]} SMEM:{smem}" if m else "?")


def _compile(i):
    from triton.compiler import ASTSource
    _, fn, sig, ce, opts, attrs = UNITS[i]
    t0 = time.time()
    try:
        ck = triton.compile(ASTSource(fn, sig, ce, attrs), target=TARGET, options=opts)
        if _PDL[0] and "griddepcontrol.wait" not in ck.asm["ptx"]:
            return i, False, "PDL=True but no griddepcontrol.wait in the PTX", time.time() - t0
        info = ""
        if os.environ.get("COMPILE_CHECK_REGS"):
            try:
                info = _resources(ck)
            except Exception as e:     # noqa: BLE001 - resource usage is informative only
                info = f"? ({type(e).__name__})"
        return i, True, info, time.time() - t0
    except Exception as e:       # noqa: BLE001 - every compile failure is reported
        if os.environ.get("COMPILE_CHECK_TRACE"):
            traceback.print_exc()
        return i, False, _first_error(e), time.time() - t0


UNITS: list = []


def _jit_kernels():
    """(module, name) of every @triton.jit function in tightfit.kernels that looks like a
    launched kernel (name contains 'kernel')."""
    import importlib
    import pkgutil
    import tightfit.kernels as K
    out = set()
    for m in pkgutil.iter_modules(K.__path__):
        if m.name.startswith("cpu_"):
            continue
        try:
            mod = importlib.import_module(f"tightfit.kernels.{m.name}")
        except Exception:         # noqa: BLE001 - a module that does not import is reported
            out.add((m.name, "<import failed>"))
            continue
        for name, obj in vars(mod).items():
            if isinstance(obj, JITFunction) and obj.module == mod.__name__ and "kernel" in name:
                out.add((m.name, name))
    return out


def _progress(k, n, u, ok, dt, t0):
    if os.environ.get("COMPILE_CHECK_QUIET"):
        return
    print(f"[{k + 1}/{n} {time.time() - t0:.0f}s] {u[1].__name__} {_label(u[1], u[3], u[4])}: "
          f"{'ok' if ok else 'ERROR'} {dt:.1f}s", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", action="append", default=[])
    ap.add_argument("-j", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--regs", action="store_true")
    ap.add_argument("--pdl", action="store_true")
    ap.add_argument("--pdl-all", action="store_true")
    a = ap.parse_args(argv)
    _PDL[0] = a.pdl or a.pdl_all
    if a.regs:
        os.environ["COMPILE_CHECK_REGS"] = "1"
    if a.fresh:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tt_cc_")
    t0 = time.time()
    driver.set_active(_FakeDriver())
    real = JITFunction._do_compile
    JITFunction._do_compile = _record
    try:
        for s in SCENARIOS:
            _SCENARIO[0] = s.__name__
            try:
                s()
            except Exception as e:     # noqa: BLE001
                RECORDS.append((s.__name__, None, None, None, None,
                                f"{type(e).__name__}: {e}"))
    finally:
        JITFunction._do_compile = real
    seen, broken = {}, []
    for r in RECORDS:
        if r[1] is None:
            broken.append(r)
            continue
        scen, fn, sig, ce, opts, attrs = r
        key = (fn.module, fn.__name__, repr(sorted(sig.items())), repr(sorted(ce.items())),
               opts.get("num_warps"), opts.get("num_stages"), repr(sorted(attrs.items())))
        if key not in seen:
            seen[key] = r
    units = sorted(seen.values(), key=lambda r: (r[1].module, r[1].__name__,
                                                 _label(r[1], r[3], r[4])))
    if _PDL[0] and not a.pdl_all:      # the PDL prologue does not depend on the other constexprs:
        per: dict = {}                 # first, middle and last variant of each kernel
        for u in units:
            per.setdefault((u[1].module, u[1].__name__), []).append(u)
        units = [v[i] for v in per.values() for i in sorted({0, len(v) // 2, len(v) - 1})]
    if a.k:
        units = [u for u in units if any(s in f"{u[1].__name__} {_label(u[1], u[3], u[4])} "
                                         f"{u[0]}" for s in a.k)]
    UNITS[:] = units
    t_rec = time.time() - t0
    print(f"# triton {triton.__version__}, torch {torch.__version__}, target cuda sm_90; "
          f"{len(units)} variants from {len(RECORDS)} launches ({t_rec:.1f}s)", flush=True)
    if a.list:
        for u in units:
            print(f"{u[1].module.split('.')[-1]}.{u[1].__name__} | {_label(u[1], u[3], u[4])}")
        return 0
    results = [None] * len(units)
    # the slowest kernels (big unrolled bodies) first, so the pool's tail is short
    slow = ("gemv_q_kernel", "gemv2_kernel", "gemv2s_kernel", "_gemm_fused_kernel")
    order = sorted(range(len(units)), key=lambda i: units[i][1].__name__ not in slow)
    if a.j > 1 and len(units) > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(a.j) as pool:
            for k, (i, ok, err, dt) in enumerate(pool.imap_unordered(_compile, order)):
                results[i] = (ok, err, dt)
                _progress(k, len(units), units[i], ok, dt, t0)
    else:
        for k, i in enumerate(order):
            _, ok, err, dt = _compile(i)
            results[i] = (ok, err, dt)
            _progress(k, len(units), units[i], ok, dt, t0)
    nfail = 0
    print("| kernel | variant | result | s |")
    print("|---|---|---|---|")
    for u, (ok, err, dt) in zip(units, results):
        nfail += not ok
        print(f"| {u[1].module.split('.')[-1]}.{u[1].__name__} | {_label(u[1], u[3], u[4])} | "
              f"{('ok ' + err).strip() if ok else 'ERROR ' + err} | {dt:.1f} |")
    for scen, _, _, _, _, msg in broken:
        nfail += 1
        print(f"| (launcher) | {scen} | ERROR launcher failed on CPU: {msg[:200]} | |")
    if _PDL[0] and not a.k:
        have = {(r[1].module.split(".")[-1], r[1].__name__) for r in RECORDS if r[1]}
        for mod, name in sorted(PDL_KERNELS - have):
            print(f"| {mod}.{name} | PDL=True | ERROR no launch passes PDL (no PDL constexpr?) | |")
            nfail += 1
    covered = {(u[1].module.split(".")[-1], u[1].__name__) for u in units} if not a.k else None
    if covered is not None and not _PDL[0]:
        # kernels launched through a scenario but filtered/deduped still count as covered
        covered |= {(r[1].module.split(".")[-1], r[1].__name__) for r in RECORDS if r[1]}
        missing = sorted(_jit_kernels() - covered)
        for mod, name in missing:
            print(f"| {mod}.{name} | - | {'ERROR ' if a.strict else ''}not covered by any "
                  f"scenario | |")
            nfail += bool(a.strict)
    print(f"# {len(units) - sum(1 for r in results if not r[0])}/{len(units)} ok, "
          f"{nfail} failure(s); {time.time() - t0:.0f}s total, -j {a.j}", flush=True)
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
