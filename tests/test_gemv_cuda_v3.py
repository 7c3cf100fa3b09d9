"""CUDA GEMV kernel variant v3 (tf_gemv3 in tightfit/kernels/cuda/gemv_kernel.cuh): x staged in
shared memory per CTA. No GPU needed: the staging / chunk / item index math of the kernel is
re-played in Python (a transcription of tf_v3_stage and the chunk loop) and checked for exact
coverage, the Python geometry (gemv_cuda.v3_geom / v3_smem) against the .cuh, and the
TF_CSE_FRIENDLY fp16 -> fp32 conversion against NumPy on all 65536 bit patterns.
The format math itself is covered by the host harness (test_gemv_cuda_host.py: dot = load +
compute for every format with a Raw); the device run is bench/gemv.py (kern v3)."""
from __future__ import annotations

import os  # noqa: E402
import torch  # noqa: E402

# Triton decides interpreter mode when a @triton.jit module is imported, and modules are imported
# once per test session: without a GPU they must come in interpreted, as every kernel test expects
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import re
from pathlib import Path

import numpy as np
import pytest

from tightfit.kernels.cuda_source import CUDA_DIR

gc = pytest.importorskip("tightfit.kernels.gemv_cuda")

THREADS = 256
WARPS = 8
KERNEL = (CUDA_DIR / "gemv_kernel.cuh").read_text()
# (QK, PARTS) of every format family: QK / PARTS = 32 weights per item for all of them
FAMILIES = [(32, 1), (64, 2), (128, 4), (256, 8)]
KS = [256, 1024, 2048, 2304, 3328, 5120, 6144, 17408]


def stage(nc, kc_full, K, k0, kc):
    """Transcription of tf_v3_stage: {buffer offset: global offset} per array (q bytes in 16-byte
    pieces, d and s16 elements)."""
    q, d, s = {}, {}, {}
    nq = kc >> 4
    for t in range(THREADS):
        for i in range(t, nc * nq, THREADS):
            c, j = divmod(i, nq)
            for e in range(16):
                key = c * kc_full + 16 * j + e
                assert key not in q
                q[key] = c * K + k0 + 16 * j + e
        nd = kc >> 5
        for i in range(t, nc * nd, THREADS):
            c, j = divmod(i, nd)
            key = c * (kc_full // 32) + j
            assert key not in d
            d[key] = c * (K // 32) + (k0 >> 5) + j
        ns = kc >> 4
        for i in range(t, nc * ns, THREADS):
            c, j = divmod(i, ns)
            key = c * (kc_full // 16) + j
            assert key not in s
            s[key] = c * (K // 16) + (k0 >> 4) + j
    return q, d, s


@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("nc", [2, 8, 16])
def test_v3_staging_covers_chunk(K, nc):
    kc_full, _ = gc.v3_geom(nc)
    nchunks = -(-K // kc_full)
    seen_q = set()
    for j in range(nchunks):
        k0 = j * kc_full
        kc = min(kc_full, K - k0)
        assert kc % 32 == 0 and kc > 0
        q, d, s = stage(nc, kc_full, K, k0, kc)
        # staged copy == the chunk's elements of every column, at column stride KC (CONTRACT.md:
        # column c at xq + c*K with K := KC), inside the buffer
        for c in range(nc):
            for e in range(kc):
                assert q[c * kc_full + e] == c * K + k0 + e
            for g in range(kc // 32):
                assert d[c * (kc_full // 32) + g] == c * (K // 32) + k0 // 32 + g
            for g in range(kc // 16):
                assert s[c * (kc_full // 16) + g] == c * (K // 16) + k0 // 16 + g
        assert len(q) == nc * kc and max(q) < nc * kc_full
        assert len(d) == nc * kc // 32 and len(s) == nc * kc // 16
        seen_q |= set(q.values())
    assert seen_q == set(range(nc * K))


def items(K, nc, qk, parts, wpr):
    """Transcription of the tf_gemv3 chunk loop for one row: [(global block, part, staged x
    element offset of the block)] in issue order, plus the clamped load blocks."""
    kc_full, _ = gc.v3_geom(nc)
    umax = kc_full // 1024
    out, loads = [], []
    for j in range(-(-K // kc_full)):
        k0 = j * kc_full
        nit = min(K - k0, kc_full) >> 5
        bc0 = k0 // qk
        assert k0 % qk == 0
        for sub in range(wpr):
            for lane in range(32):
                p = lane % parts
                for u in range(umax):
                    it = sub * 32 + lane + u * 32 * wpr
                    bu = min(it, nit - 1) // parts                 # two-phase path's clamp
                    loads.append(bc0 + bu)
                    if it < nit:
                        b = it // parts
                        assert it % parts == p                      # part fixed per lane
                        assert b * qk + qk <= min(K - k0, kc_full)  # block inside the staged chunk
                        out.append((bc0 + b, p, b * qk))
    return out, loads


@pytest.mark.parametrize("qk,parts,K", [(qk, parts, K) for qk, parts in FAMILIES for K in KS
                                         if K % qk == 0])   # rows are whole blocks
@pytest.mark.parametrize("nc", [2, 8, 16])
def test_v3_items_cover_row_once(qk, parts, K, nc):
    kc_full, _ = gc.v3_geom(nc)
    nb = K // qk
    for wpr in [w for w in (1, 2, 4, 8) if w <= kc_full // 1024]:
        got, loads = items(K, nc, qk, parts, wpr)
        assert sorted((b, p) for b, p, _ in got) == [(b, p) for b in range(nb) for p in range(parts)]
        assert min(loads) >= 0 and max(loads) < nb


def test_v3_geometry_matches_cuh():
    m = re.search(r"struct tf_v3_geom \{\s*static constexpr int KC = NC <= (\d+) \? (\d+) : (\d+);"
                  r".*?static constexpr int RPW = NC <= (\d+) \? (\d+) : (\d+);", KERNEL, re.S)
    assert m, "tf_v3_geom not found in gemv_kernel.cuh"
    lim, kc_a, kc_b, lim2, r_a, r_b = map(int, m.groups())
    for nc in gc.NCS:
        kc = kc_a if nc <= lim else kc_b
        rpw = r_a if nc <= lim2 else r_b
        assert gc.v3_geom(nc) == (kc, rpw)
        assert kc % 1024 == 0 and kc % 256 == 0
        assert gc.v3_smem(nc) <= 48 * 1024, f"NC={nc}: static shared memory over 48 KiB"


def test_v3_kernel_names_and_wpr():
    assert "v3" in gc.KERNS
    names = gc.kernel_names(12, "v3")
    assert names[0] == "tf_gemv<F_Q4_K, 1>"
    assert all(n.startswith("tf_gemv3<F_Q4_K, ") for n in names[1:])
    assert gc.kernel_names(12, "v2h")[1] == "tf_gemv<F_Q4_K, 2>"
    assert "v1" not in gc.KERNS      # measured no faster than v2h anywhere (session 4): removed
    for nc in gc.NCS:
        kc, _ = gc.v3_geom(nc)
        for n_in, n_out in [(5120, 1024), (5120, 17408), (17408, 5120), (5120, 48), (1024, 64)]:
            w = gc.pick_wpr_v3(n_in, n_out, nc)
            assert w in (1, 2) and w <= kc // 1024


def test_auto_takes_the_measured_winners():
    """The default variant picks, per launch, what session 4's H200 runs measured fastest: at
    NC = 1 tf_gemv4 for IQ4_XS, tf_gemv2h for Q5_K (v4 measured slower there), v3 from NC = 4 on
    wide matrices (session 15: the v2 bodies won at NC = 2, 3 on every wide shape), v2 bodies on
    narrow ones; and it compiles exactly the two modules it may launch."""
    assert gc.DEFAULT_KERN == "auto" and gc._kern() in gc.KERNS
    assert gc.concrete("auto", 1, 17408) == "v4"
    assert gc.concrete("auto", 8, 17408) == "v3" and gc.concrete("auto", 4, 5120) == "v3"
    assert gc.concrete("auto", 2, 17408) == "v4" and gc.concrete("auto", 3, 5120) == "v4"
    # the 2-3-bit formats keep the v2 bodies through NC = 5 (session 15 call 5)
    for t in (11, 17, 18, 21, 22):                  # Q3_K IQ2_XS IQ3_XXS IQ3_S IQ2_S
        assert gc.concrete("auto", 5, 17408, t) == "v4" and gc.concrete("auto", 6, 17408, t) == "v3"
    for t in (12, 13, 14, 23, 8):                   # Q4_K Q5_K Q6_K IQ4_XS Q8_0
        assert gc.concrete("auto", 4, 17408, t) == "v3" and gc.concrete("auto", 3, 17408, t) == "v4"
    assert gc.concrete("auto", 8, 1024) == "v4"
    assert gc.concrete("v2h", 8, 17408) == "v2h"
    assert gc.module_kerns("auto") == ("v4", "v3") and gc.module_kerns("v3") == ("v3",)
    assert gc.kernel_names(23, "v4")[0] == "tf_gemv4<F_IQ4_XS, 1>"
    assert gc.kernel_names(13, "v4")[0] == "tf_gemv2h<F_Q5_K, 1>"
    assert gc.kernel_names(23, "v2h")[0] == "tf_gemv2h<F_IQ4_XS, 1>"
    assert gc.kernel_names(23, "v2h")[7] == "tf_gemv2<F_IQ4_XS, 8>"
    assert gc.kernel_names(14, "v2h")[0] == "tf_gemv<F_Q6_K, 1>"
    with pytest.raises(ValueError):
        gc.kernel_names(23, "auto")


def _ftz(a: np.ndarray) -> np.ndarray:
    """fp32 flush-to-zero: denormals become (signed) zero, as under -ftz / --use_fast_math."""
    a = a.astype(np.float32)
    return np.where(np.abs(a) < np.finfo(np.float32).tiny, np.float32(0) * np.sign(a), a).astype(np.float32)


def test_cse_friendly_h2f_matches_numpy():
    """TF_CSE_FRIENDLY tf_h2f (gemv_common.cuh), mirrored: mantissa (1024 + m, or m for a
    subnormal) times 2^(max(e, 1) - 25). Exact for every finite fp16 also when the device flushes
    fp32 denormals (every operand and result of the multiply is an integer below 2^11 or a normal
    fp32), unlike the former form (fp16 bits in an fp32, times 2^112), which under flush-to-zero
    read the seed-mix 27B's subnormal block scales as 0 (session 10). The device side is
    test_gemv_cuda_device.py::test_device_subnormal_scales."""
    src = (CUDA_DIR / "gemv_common.cuh").read_text()
    assert "+ 102u) << 23" in src and "5.192296858534828e33f" not in src
    h = np.arange(65536, dtype=np.uint32)
    e, m = (h >> 10) & 0x1F, h & 0x3FF
    mant = np.where(e != 0, m | 0x400, m).astype(np.float32)
    p2 = ((np.where(e != 0, e, 1) + 102) << 23).astype(np.uint32).view(np.float32)
    assert (p2 >= np.finfo(np.float32).tiny).all()                # a normal power of two
    v = _ftz(_ftz(mant) * _ftz(p2))
    v = np.where(h & 0x8000, -v, v)
    ref = h.astype(np.uint16).view(np.float16).astype(np.float32)
    finite = np.isfinite(ref)
    assert np.array_equal(v[finite], ref[finite])
    assert np.array_equal(np.signbit(v[finite]), np.signbit(ref[finite]))
    # the former form loses every subnormal under flush-to-zero: what this test guards against
    b = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13)
    old = _ftz(_ftz(b.astype(np.uint32).view(np.float32)) * np.float32(2.0 ** 112))
    sub = finite & (e == 0) & (m != 0)
    assert (old[sub] == 0).all() and not (ref[sub] == 0).any()


# ---------------------------------------------------------------- v4 (tf_gemv4, N = 1)
def v4_blocks(nb, parts, U, wpr):
    """Transcription of tf_gemv4's block assignment for one row: [(block, part)] over all warps
    and lanes (main loop of full strides at constant offsets, then the interleaved remainder)."""
    G = 32 // parts
    span = U * G
    sstep = span * wpr
    nfull = nb // sstep
    out = []
    for sub in range(wpr):
        for lane in range(32):
            p, lb = lane % parts, lane // parts
            b = sub * span + lb
            for s in range(nfull):
                for u in range(U):
                    out.append((b + s * sstep + u * G, p))
            b0, bs = nfull * sstep + sub * G + lb, G * wpr
            for u in range(U):
                if b0 + u * bs < nb:
                    out.append((b0 + u * bs, p))
            assert b0 + U * bs >= nb      # the remainder never needs more than U items per lane
    return out


@pytest.mark.parametrize("qk,parts", [(256, 8), (32, 1), (128, 4)])
def test_v4_blocks_cover_row_once(qk, parts):
    for K in KS + [256 * 3, 256 * 33, 256 * 68 + 256]:
        if K % qk:
            continue
        nb = K // qk
        for U in (2, 4):
            for wpr in (1, 2, 4, 8):
                got = v4_blocks(nb, parts, U, wpr)
                assert sorted(got) == [(b, p) for b in range(nb) for p in range(parts)], (K, U, wpr)


def test_v4_kernel_names():
    assert "v4" in gc.KERNS
    assert gc.concrete("v4", 1, 17408) == "v4" and gc.concrete("v4", 8, 1024) == "v4"
    assert gc.module_kerns("v4") == ("v4",)
    assert gc.kernel_names(23, "v4")[0] == "tf_gemv4<F_IQ4_XS, 1>"
    assert gc.kernel_names(13, "v4")[0] == "tf_gemv2h<F_Q5_K, 1>"
    assert gc.kernel_names(8, "v4")[0] == "tf_gemv<F_Q8_0, 1>"
    assert gc.kernel_names(23, "v4")[1] == "tf_gemv2<F_IQ4_XS, 2>"
    assert "tf_gemv4(" in KERNEL


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not installed")
def test_v4_nvcc_sm90_no_spills():
    rows = gc.compile_report("sm_90", lowbit=False, kern="v4")
    assert {r["nc"] for r in rows} == set(gc.NCS)
    assert not [r for r in rows if r["spill_stores"] or r["spill_loads"]]
    # tf_gemv5 (Q6_K at NC = 1 since session 5) is built for <= 80 registers, the rest for <= 64
    assert not [r for r in rows if r["nc"] == 1
                and r["regs"] > (80 if r["format"] in gc.V4_V5_FORMATS else 64)]


# ---------------------------------------------------------------- v5 / v5s (tf_gemv5, N = 1, opt-in)
def test_v5_kernel_names_and_auto_unchanged():
    """v5 / v5s: auto's choices except NC = 1 of Q5_K / Q6_K (tf_gemv5 / tf_gemv5s); auto (v4) runs
    tf_gemv5 for Q6_K only (measured winner, session 5) and keeps tf_gemv2h for Q5_K at NC = 1."""
    assert gc.DEFAULT_KERN == "auto"
    assert "v5" in gc.KERNS and "v5s" in gc.KERNS
    assert gc.V5_FORMATS == ("F_Q5_K", "F_Q6_K")
    assert gc.kernel_names(13, "v4")[0] == "tf_gemv2h<F_Q5_K, 1>"
    assert gc.kernel_names(14, "v4")[0] == "tf_gemv5<F_Q6_K, 1>"
    assert gc.kernel_names(14, "v4")[1] == "tf_gemv<F_Q6_K, 2>"
    assert gc.concrete("auto", 1, 17408) == "v4" and gc.module_kerns("auto") == ("v4", "v3")
    for kern, kn in (("v5", "tf_gemv5"), ("v5s", "tf_gemv5s")):
        assert gc.module_kerns(kern) == (kern, "v3")
        assert gc.concrete(kern, 1, 17408) == kern and gc.concrete(kern, 1, 1024) == kern
        assert gc.concrete(kern, 8, 17408) == "v3" and gc.concrete(kern, 8, 1024) == kern
        assert gc.kernel_names(13, kern)[0] == f"{kn}<F_Q5_K, 1>"
        assert gc.kernel_names(14, kern)[0] == f"{kn}<F_Q6_K, 1>"
        # every other launch is v4's kernel
        for t in (8, 2, 6, 20, 23, 12, 13, 14):
            a, b = gc.kernel_names(t, kern), gc.kernel_names(t, "v4")
            assert a[1:] == b[1:], (kern, t)
            if t not in (13, 14):
                assert a[0] == b[0], (kern, t)
        assert f"{kn}(" in KERNEL


def test_v5_selectable_by_config_and_env(monkeypatch):
    monkeypatch.delenv("TIGHTFIT_CU_GEMV", raising=False)
    assert gc._kern() == "auto"
    assert gc._kern({"kern": "v5"}) == "v5" and gc._kern({"kern": "V5S"}) == "v5s"
    monkeypatch.setenv("TIGHTFIT_CU_GEMV", "v5")
    assert gc._kern() == "v5" and gc._kern({"kern": "auto"}) == "auto"
    with pytest.raises(ValueError):
        gc._kern({"kern": "v6"})


def v5_blocks(nb, parts, U, wpr):
    """Transcription of tf_gemv5_body's block assignment (== tf_gemv2h's): [(block, part)]."""
    bstep = 32 * wpr // parts
    out = []
    for sub in range(wpr):
        for lane in range(32):
            p = lane % parts
            b = (sub * 32 + lane) // parts
            while b + (U - 1) * bstep < nb:
                out += [(b + u * bstep, p) for u in range(U)]
                b += U * bstep
            while b < nb:
                out.append((b, p))
                b += bstep
    return out


@pytest.mark.parametrize("U", [2, 4])
def test_v5_blocks_cover_row_once(U):
    for K in KS + [256 * 3, 256 * 33, 256 * 69]:
        nb = K // 256
        for wpr in (1, 2, 4, 8):
            got = v5_blocks(nb, 8, U, wpr)
            assert sorted(got) == [(b, p) for b in range(nb) for p in range(8)], (K, U, wpr)


def test_v5_body_matches_transcription():
    """The .cuh loop bounds the transcription above assumes (guards against silent edits)."""
    body = KERNEL[KERNEL.index("TF_DEV void tf_gemv5_body("):KERNEL.index("tf_gemv5_switch(")]
    assert "BSTEP = (32u << WL) / F::PARTS" in body
    assert "unsigned b = ((unsigned)sub * 32u + (unsigned)lane) / F::PARTS;" in body
    assert "for (; b + (U - 1) * BSTEP < nb; b += U * BSTEP)" in body
    assert "for (; b < nb; b += BSTEP)" in body
    assert re.search(r"tf_gemv5_switch<F, NC, 4>", KERNEL) and re.search(r"tf_gemv5_switch<F, NC, 2>", KERNEL)
