"""Opt-in bulk-copy-staged CUDA GEMV (tightfit/kernels/gemv_tma.py, cuda/gemv_tma.cuh).
Offline: every instantiation compiles for sm_90 with nvcc and the main formats do not spill.
Device (skips without CUDA): results vs the float64 product of the dequantized weights and the
dequantized int8 activations, output poisoned with NaN, rows that end unaligned (Q6_K: 210-byte
blocks) and a last row whose tail is copied by plain loads."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from tightfit.kernels.cuda_source import CUDA_DIR, format_list, formats_source

MAIN = ("F_Q8_0", "F_Q4_K", "F_Q5_K", "F_Q6_K", "F_IQ4_XS")


@pytest.mark.skipif(shutil.which("nvcc") is None and not __import__("os").path.exists(
    "/usr/local/cuda/bin/nvcc"), reason="nvcc not installed")
def test_tma_kernels_compile_sm90_without_spills(tmp_path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = "#define TF_TMA_PDL 1\n" + formats_source(False) + (CUDA_DIR / "gemv_tma.cuh").read_text()
    names = [n for n, _ in format_list() if n in MAIN]
    assert set(names) == set(MAIN)
    inst = [f"template __global__ void tf_gemv_tma<{n}, {nc}>(const uint8_t*, const int8_t*, "
            f"const float*, const int*, float*, int, int, int);" for n in names for nc in (1, 2, 4, 8)]
    (tmp_path / "t.cu").write_text(src + "\n" + "\n".join(inst) + "\n")
    r = subprocess.run([nvcc, "-arch=sm_90", "-std=c++17", "-cubin", "-Xptxas", "-v", "t.cu",
                        "-o", "t.cubin"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", r.stderr)]
    assert len(spills) == len(inst)
    assert not any(spills)


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_gpu
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"])
@pytest.mark.parametrize("n_in,n_out", [(5120, 1000), (17408, 264), (256 * 7, 9)])
@pytest.mark.parametrize("n", [1, 8])
def test_tma_matches_float64(fmt, n_in, n_out, n):
    from tightfit.kernels.gemv import MACRO_BYTES, gemv_ref, type_id
    from tightfit.kernels.gemv_tma import gemv_tma
    from tightfit.kernels.quantize_act import quantize_act, quantize_act_ref
    import sys, os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    from gemv import rand_weights
    t = type_id(fmt)
    gen = torch.Generator(device="cuda").manual_seed(n_in + n_out + n)
    w = rand_weights(t, n_out, n_in, gen)
    x = torch.randn(n, n_in, device="cuda")
    act = quantize_act(x, 0)
    out = torch.full((n, n_out), float("nan"), device="cuda")
    for stages, chunk in ((3, 1536), (2, 512)):
        y = gemv_tma(act, w, t, n_out, out, stages=stages, chunk_bytes=chunk).cpu().numpy()
        q, d, _ = quantize_act_ref(x.cpu().numpy())
        rb = n_in // 256 * MACRO_BYTES[t]
        ref = gemv_ref((q * d[..., None]).reshape(n, n_in), w.view(n_out, rb).cpu().numpy(), t,
                       n_out, n_in)
        assert np.isfinite(y).all()
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-4
