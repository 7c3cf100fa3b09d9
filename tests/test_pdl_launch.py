"""PDL launcher (tightfit.kernels.cuda_runtime.launch) without a GPU.

- the ctypes CUlaunchConfig / CUlaunchAttribute / CUlaunchAttributeValue against the installed
  cuda.h: a C probe compiled with the host compiler prints sizeof / offsetof / the attribute id;
- the whole pdl=True path against a stand-in cuLaunchKernelEx compiled from cuda.h's own
  declaration, which records what it received by reading the C structs and dereferencing
  kernelParams with the kernel's parameter types (the oracle is the C compiler's layout);
- argument packing (types, widths, rejection of untyped Python numbers);
- the CUDA sources: a TF_PDL build's PTX has griddepcontrol.wait ahead of every global access
  of each kernel, a build without TF_PDL has none of it (nvcc, offline; skipped without).
"""
from __future__ import annotations

import os  # noqa: E402
import torch  # noqa: E402

# Triton decides interpreter mode when a @triton.jit module is imported, and modules are imported
# once per test session: without a GPU they must come in interpreted, as every kernel test expects
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from tightfit.kernels import cuda_runtime as rt

CUDA_INC = next((d for d in (os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "include"),
                             "/usr/local/cuda/include", "/usr/include")
                 if os.path.exists(os.path.join(d, "cuda.h"))), None)
CC = shutil.which("gcc") or shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None or CUDA_INC is None, reason="needs a C compiler + cuda.h")

PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include <cuda.h>
#define P(name, v) printf("%s %lu\n", name, (unsigned long)(v))
int main(void) {
  P("cfg.size", sizeof(CUlaunchConfig));
  P("cfg.gridDimX", offsetof(CUlaunchConfig, gridDimX));
  P("cfg.gridDimY", offsetof(CUlaunchConfig, gridDimY));
  P("cfg.gridDimZ", offsetof(CUlaunchConfig, gridDimZ));
  P("cfg.blockDimX", offsetof(CUlaunchConfig, blockDimX));
  P("cfg.blockDimY", offsetof(CUlaunchConfig, blockDimY));
  P("cfg.blockDimZ", offsetof(CUlaunchConfig, blockDimZ));
  P("cfg.sharedMemBytes", offsetof(CUlaunchConfig, sharedMemBytes));
  P("cfg.hStream", offsetof(CUlaunchConfig, hStream));
  P("cfg.attrs", offsetof(CUlaunchConfig, attrs));
  P("cfg.numAttrs", offsetof(CUlaunchConfig, numAttrs));
  P("attr.size", sizeof(CUlaunchAttribute));
  P("attr.id", offsetof(CUlaunchAttribute, id));
  P("attr.value", offsetof(CUlaunchAttribute, value));
  P("attr.idsize", sizeof(CUlaunchAttributeID));
  P("val.size", sizeof(CUlaunchAttributeValue));
  P("val.align", _Alignof(CUlaunchAttributeValue));
  P("val.pss", offsetof(CUlaunchAttributeValue, programmaticStreamSerializationAllowed));
  P("val.psssize", sizeof(((CUlaunchAttributeValue*)0)->programmaticStreamSerializationAllowed));
  P("id.pss", CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  return 0;
}
"""

# A stand-in for the driver's cuLaunchKernelEx with the header's declaration: it records the
# config and the parameters of a kernel (u64 a, i32 b, f32 c, u64 d) read through the C types.
SHIM = r"""
#include <string.h>
#include <cuda.h>
static unsigned long long rec[24];
static int ret_code = 0;
void shim_set_return(int r) { ret_code = r; }
void shim_get(unsigned long long* out) { memcpy(out, rec, sizeof(rec)); }
CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** p, void** extra) {
  memset(rec, 0, sizeof(rec));
  rec[0] = c->gridDimX; rec[1] = c->gridDimY; rec[2] = c->gridDimZ;
  rec[3] = c->blockDimX; rec[4] = c->blockDimY; rec[5] = c->blockDimZ;
  rec[6] = c->sharedMemBytes; rec[7] = (unsigned long long)c->hStream;
  rec[8] = c->numAttrs;
  if (c->numAttrs) {
    rec[9] = (unsigned long long)c->attrs[0].id;
    rec[10] = (unsigned long long)c->attrs[0].value.programmaticStreamSerializationAllowed;
  }
  rec[11] = (unsigned long long)f;
  rec[12] = *(unsigned long long*)p[0];
  rec[13] = (unsigned long long)(long long)*(int*)p[1];
  float fv = *(float*)p[2]; unsigned int fb; memcpy(&fb, &fv, 4); rec[14] = fb;
  rec[15] = *(unsigned long long*)p[3];
  rec[16] = (unsigned long long)extra;
  return (CUresult)ret_code;
}
CUresult cuGetErrorName(CUresult e, const char** s) {
  *s = e == 999 ? "CUDA_ERROR_UNKNOWN_STANDIN" : "OTHER";
  return CUDA_SUCCESS;
}
"""


def _compile(tmp_path, src, name, shared=False):
    c = tmp_path / f"{name}.c"
    c.write_text(src)
    out = tmp_path / (f"lib{name}.so" if shared else name)
    cmd = [CC, "-std=c11", "-O1", "-I", CUDA_INC, str(c), "-o", str(out)]
    if shared:
        cmd[1:1] = ["-shared", "-fPIC"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return str(out)


@needs_cc
def test_struct_layout_matches_cuda_h(tmp_path):
    exe = _compile(tmp_path, PROBE, "probe")
    got = dict(line.split() for line in subprocess.run([exe], check=True, capture_output=True,
                                                        text=True).stdout.splitlines())
    c = {k: int(v) for k, v in got.items()}
    assert ctypes.sizeof(rt.CUlaunchConfig) == c["cfg.size"]
    for f in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
              "sharedMemBytes", "hStream", "attrs", "numAttrs"):
        assert getattr(rt.CUlaunchConfig, f).offset == c[f"cfg.{f}"], f
    assert ctypes.sizeof(rt.CUlaunchAttribute) == c["attr.size"]
    assert rt.CUlaunchAttribute.id.offset == c["attr.id"]
    assert rt.CUlaunchAttribute.value.offset == c["attr.value"]
    assert ctypes.sizeof(ctypes.c_int) == c["attr.idsize"]
    assert ctypes.sizeof(rt.CUlaunchAttributeValue) == c["val.size"]
    assert ctypes.alignment(rt.CUlaunchAttributeValue) == c["val.align"]
    assert rt.CUlaunchAttributeValue.programmaticStreamSerializationAllowed.offset == c["val.pss"]
    assert ctypes.sizeof(ctypes.c_int) == c["val.psssize"]
    assert rt.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == c["id.pss"]


class _Fn:                       # what launch() needs of a cupy Function: the CUfunction handle
    ptr = 0x1234567


class _RawKernel:                # cupy RawKernel: the Function of the current device is .kernel
    kernel = _Fn()


@needs_cc
def test_launch_pdl_through_header_declaration(tmp_path, monkeypatch):
    lib = ctypes.CDLL(_compile(tmp_path, SHIM, "shim", shared=True))
    monkeypatch.setattr(rt, "_driver", lambda: rt.bind(lib))
    rec = (ctypes.c_ulonglong * 24)()
    big = np.uint64(0xDEADBEEF_0000F00D)
    rt.launch(_Fn(), (129, 3), (256, 1, 1), (big, np.int32(-7), np.float32(1.5), np.uint64(42)),
              shared_mem=4096, stream_ptr=0xABC0, device=0, pdl=True)
    lib.shim_get(rec)
    assert list(rec[:6]) == [129, 3, 1, 256, 1, 1]
    assert rec[6] == 4096 and rec[7] == 0xABC0
    assert rec[8] == 1 and rec[9] == 6 and rec[10] == 1        # one attribute: PSS = 1
    assert rec[11] == _Fn.ptr
    assert rec[12] == int(big)
    assert rec[13] == (-7) & 0xFFFFFFFFFFFFFFFF
    assert rec[14] == np.float32(1.5).view(np.uint32)
    assert rec[15] == 42
    assert rec[16] == 0                                            # extra = NULL
    rt.launch(_RawKernel(), 2, 64, (big, np.int32(1), np.float32(2), big), pdl=True)
    lib.shim_get(rec)
    assert rec[11] == _Fn.ptr and list(rec[:6]) == [2, 1, 1, 64, 1, 1] and rec[7] == 0
    lib.shim_set_return(999)
    with pytest.raises(RuntimeError, match=r"CUresult 999 \(CUDA_ERROR_UNKNOWN_STANDIN\)"):
        rt.launch(_Fn(), (1, 1, 1), (32, 1, 1), (big, np.int32(0), np.float32(0), big),
                  pdl=True)


def test_make_config_bytes():
    cfg, attrs = rt.make_config((5, 6, 7), 128, 100, 0x7000, True)
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (5, 6, 7)
    assert (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (128, 1, 1)
    assert cfg.sharedMemBytes == 100 and cfg.hStream == 0x7000 and cfg.numAttrs == 1
    raw = ctypes.string_at(ctypes.addressof(attrs), 72)
    assert int.from_bytes(raw[0:4], "little") == 6               # id
    assert int.from_bytes(raw[8:12], "little") == 1              # value.pss
    assert ctypes.addressof(cfg.attrs.contents) == ctypes.addressof(attrs)
    cfg0, _ = rt.make_config(1, 32, 0, 0, False)
    assert cfg0.numAttrs == 0 and cfg0.hStream is None


def test_pack_args_types():
    vals, ptrs = rt.pack_args((np.uint64(2**63 + 5), np.int32(-3), np.float32(0.25),
                               np.int64(-9), np.uint32(7)))
    want = [(ctypes.c_uint64, 2**63 + 5), (ctypes.c_int32, -3), (ctypes.c_float, 0.25),
            (ctypes.c_int64, -9), (ctypes.c_uint32, 7)]
    assert len(vals) == 5
    for i, (ct, v) in enumerate(want):
        assert type(vals[i]) is ct and ctypes.sizeof(vals[i]) == ctypes.sizeof(ct)
        assert ptrs[i] == ctypes.addressof(vals[i])
        assert ctypes.cast(ptrs[i], ctypes.POINTER(ct)).contents.value == v
    for bad in (5, 1.0, np.float64(1.0), np.int16(1), np.zeros(2, np.int32)):
        with pytest.raises(TypeError):
            rt.pack_args((np.int32(1), bad))


def test_prefix_defines():
    from tightfit.kernels import gemv_cuda as gc
    assert "TF_PDL" not in gc._prefix("v4") and "TF_PDL" not in gc._prefix("v3", None)
    p = gc._prefix("v3", (2, 1))
    assert "#define TF_PDL 1" in p and "#define TF_PDL_PF 2" in p and "TF_CSE_FRIENDLY" in p
    assert "#define TF_PDL_PF_V3 1" in p


def test_pdl_state_follows_env(monkeypatch):
    from tightfit.kernels import gemv_cuda as gc
    from tightfit.kernels import pdl
    monkeypatch.setenv("TIGHTFIT_PDL", "0")
    assert gc.pdl_state(0) is None
    monkeypatch.setenv("TIGHTFIT_PDL", "1")
    monkeypatch.setenv("TIGHTFIT_PDL_PF", "3")
    monkeypatch.delenv("TIGHTFIT_PDL_PF_V3", raising=False)
    assert gc.pdl_state(0) == ((3, 0) if pdl.enabled(0) else None)
    assert gc._report_pf(None) == (3, 0) and gc._report_pf(False) is None
    monkeypatch.setenv("TIGHTFIT_PDL_PF_V3", "2")
    assert gc._report_pf(True) == (3, 2)


# ---------------------------------------------------------------- CUDA sources (nvcc, offline)
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
# loads / stores / atomics / async copies of global memory; the bulk L2 prefetch is not one
GLOBAL_ACCESS = re.compile(r"\b(?:ld|st|atom|red)\.[\w.]*global|\bcp\.async\.(?!bulk\.prefetch)[\w.]*global")


def _ptx_entries(ptx: str) -> dict[str, str]:
    parts = re.split(r"\.(?:visible|weak) \.entry ", ptx)[1:]
    return {p.split("(", 1)[0]: p for p in parts}


def _gemv_ptx(tmp_path, pf, arch="sm_90"):
    from tightfit.kernels import gemv_cuda as gc
    src, _ = gc.report_source(lowbit=False, kern="v4", pdl=False)
    src = gc._prefix("v4", pf) + src[len(gc._prefix("v4")):]
    inst = "".join(f"template __global__ void {k}<{f}, {nc}>(const uint8_t*, const int8_t*, "
                   "const float*, const int*, float*, int, int, int);\n"
                   for k, f, nc in (("tf_gemv", "F_Q8_0", 1), ("tf_gemv", "F_Q4_K", 16),
                                    ("tf_gemv2", "F_Q5_K", 3), ("tf_gemv2h", "F_IQ4_XS", 1),
                                    ("tf_gemv4", "F_IQ4_XS", 1), ("tf_gemv5", "F_Q6_K", 1),
                                    ("tf_gemv5s", "F_Q5_K", 1),
                                    ("tf_gemv3", "F_Q4_K", 4), ("tf_gemv3", "F_IQ4_XS", 16)))
    src = src.split("\ntemplate __global__", 1)[0] + "\n" + inst
    cu = tmp_path / "k.cu"
    cu.write_text(src)
    out = tmp_path / f"k_{pf}_{arch}.ptx"
    subprocess.run([NVCC, "-std=c++17", f"-arch={arch}", "-ptx", str(cu), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    # nvcc -ptx copies inline asm unchecked: assemble it too
    subprocess.run([os.path.join(os.path.dirname(NVCC), "ptxas"), f"-arch={arch}", str(out),
                    "-o", str(out.with_suffix(".cubin"))], check=True, capture_output=True, text=True)
    return out.read_text()


def _prefetches(name: str, pf) -> bool:
    """Where gemv_kernel.cuh prefetches: the N = 1 kernels (TF_PDL_PF) but tf_gemv5s, and
    tf_gemv3 (TF_PDL_PF_V3)."""
    nc = int(re.search(r"Li(\d+)E", name).group(1))
    if "tf_gemv3" in name:
        return pf[1] > 0
    return pf[0] > 0 and nc == 1 and "tf_gemv5s" not in name


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_gemv_ptx_waits_before_any_global_access(tmp_path):
    for pf in ((1, 1), (1, 0), (0, 0), (2, 1)):
        ent = _ptx_entries(_gemv_ptx(tmp_path, pf))
        assert len(ent) == 9
        for name, body in ent.items():
            w = body.find("griddepcontrol.wait")
            assert w >= 0, name
            m = GLOBAL_ACCESS.search(body)
            assert m is not None and m.start() > w, f"{name}: global access before the wait"
            assert "griddepcontrol.launch_dependents" in body[w:], name
            # tf_gemv5 has one body per wpr_log2 (a switch): one wait each, every other kernel one
            assert body.count("griddepcontrol.wait") == (4 if "tf_gemv5" in name else 1), name
            assert ("prefetch" in body[:w]) == _prefetches(name, pf), (name, pf)
            if "tf_gemv5" not in name:
                assert "prefetch" not in body[w:], name


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_gemv_ptx_without_pdl_or_below_sm90(tmp_path):
    for body in _ptx_entries(_gemv_ptx(tmp_path, None)).values():
        assert "griddepcontrol" not in body and "prefetch" not in body
    for body in _ptx_entries(_gemv_ptx(tmp_path, (1, 1), arch="sm_80")).values():
        assert "griddepcontrol" not in body and "prefetch" not in body


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_attn_ptx_waits_first(tmp_path):
    from tightfit.kernels import attn_decode_q_cuda as C
    d = C.defines(3, 32, 3, 32, 256)
    defs = [f"-D{k}={v}" for k, v in d.items()]
    src = os.path.join(C.CUDA_DIR, "attn_q.cuh")
    for pdl in (True, False):
        out = tmp_path / f"a{int(pdl)}.ptx"
        subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", "-ptx", "-x", "cu", *defs,
                        *(["-DTF_PDL=1"] if pdl else []), src, "-o", str(out)],
                       check=True, capture_output=True, text=True)
        subprocess.run([os.path.join(os.path.dirname(NVCC), "ptxas"), "-arch=sm_90", str(out),
                        "-o", str(out.with_suffix(".cubin"))], check=True, capture_output=True)
        body = _ptx_entries(out.read_text())["attn_q_kernel"]
        if not pdl:
            assert "griddepcontrol" not in body
            continue
        w = body.find("griddepcontrol.wait")
        m = GLOBAL_ACCESS.search(body)
        assert w >= 0 and m is not None and m.start() > w
        assert "griddepcontrol.launch_dependents" in body[w:]


def test_launch_without_pdl_is_cupys_call(monkeypatch):
    calls = []

    def fn(grid, block, args, **kw):
        calls.append((grid, block, args, kw))
    monkeypatch.setattr(rt, "stream", lambda ptr, dev: ("stream", ptr, dev))
    monkeypatch.setattr(rt, "_driver", lambda: pytest.fail("no driver call without PDL"))
    args = (np.uint64(1), np.int32(2))
    rt.launch(fn, [3, 1, 1], (128, 1, 1), args, shared_mem=64, stream_ptr=0x55, device=1)
    assert calls == [((3, 1, 1), (128, 1, 1), args, {"shared_mem": 64, "stream": ("stream", 0x55, 1)})]


def test_pdl_off_names_one_launch(monkeypatch):
    """TIGHTFIT_PDL_OFF turns PDL off for the named launches only, and never on where the main
    switch is off."""
    from tightfit.kernels import pdl
    monkeypatch.setattr(pdl, "_capable", lambda idx: True)
    monkeypatch.setenv("TIGHTFIT_PDL", "1")
    monkeypatch.setenv("TIGHTFIT_PDL_OFF", "attnq_cuda, other")
    assert pdl.enabled(0) and pdl.enabled(0, "gemv")
    assert not pdl.enabled(0, "attnq_cuda") and not pdl.enabled(0, "other")
    monkeypatch.setenv("TIGHTFIT_PDL_OFF", "")
    assert pdl.enabled(0, "attnq_cuda")
    monkeypatch.setenv("TIGHTFIT_PDL", "0")
    assert not pdl.enabled(0, "gemv")
