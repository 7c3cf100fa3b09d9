"""The CUDA C++ decode attention over the quantized cache (tightfit/kernels/cuda/attn_q.cuh),
compiled with g++ against its SIMT emulator (tightfit/kernels/cuda/attn_q_host_emu.h: mma.sync
fragments, shuffles and fp16 conversions emulated bit for bit, cp.async synchronous), checked
against float64 attention over the SAME quantized bytes (attention_quant_f64), single pass and
split-K (partials merged like attn_decode_q._reduce_q_kernel with BT = 16). No GPU needed; on a
GPU with cupy the same cases also run through attn_decode_q (the NVRTC path).

Tolerance: as tests/test_kvquant_kernel.py (TOL = 2e-3 of max |out|, ~4 fp16 unit roundoffs):
K codes are exact in fp16 (int8, or C[idx] rounded once) with the block scale applied in fp32,
V values are C[idx] * s rounded once to fp16 (C[idx] itself rounded first for the tq formats),
q and p split into fp16 hi + lo."""
from __future__ import annotations

import _interp

_interp.interpret_without_gpu()

import math
import os
import shutil
import subprocess

import pytest
import torch

from tightfit.kernels import attn_decode_q as AQ
from tightfit.kernels import attn_decode_q_cuda as C
from tightfit.kvquant.formats import get_format, rotation_matrix, split_kv_type
from _kv_cases import check_close, quant_kv_case as _case  # noqa: E402

HERE = os.path.dirname(__file__)
CXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs g++")


def _build(tmp_root, kf, vf, D, nw=C.NW):
    d = C.defines(kf.bits, kf.group, vf.bits, vf.group, D, nw=nw)
    name = "aq_" + "_".join(f"{k}{v}" for k, v in d.items())
    exe = os.path.join(tmp_root, name)
    if not os.path.exists(exe):
        cmd = [CXX, "-std=c++20", "-O1", "-pthread", "-I", C.CUDA_DIR,
               *(f"-D{k}={v}" for k, v in d.items()),
               os.path.join(HERE, "cuda_host", "attn_q_host.cpp"), "-o", exe]
        subprocess.run(cmd, check=True, capture_output=True)
    return exe


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("attn_q_host"))


def _run_host(exe, tmp, kv_type, q, kc, vc, qg, T, n_chunks, chunk):
    H, D = q.shape
    Hkv = kc.shape[1]
    kf, vf = (get_format(n) for n in split_kv_type(kv_type))
    R = rotation_matrix(D, dtype=torch.float32)
    q_rot = (q @ R.T if kf.rotate else q).float().contiguous()
    ws = AQ.make_workspace(kv_type, H, D, 1)
    os.makedirs(tmp, exist_ok=True)
    for name, t in (("q_rot", q_rot), ("kc", kc), ("vc", vc), ("kcb", ws.kcb), ("vcb", ws.vcb),
                    ("status", torch.tensor([0, 0, T - 1, 0], dtype=torch.int32))):
        t.contiguous().numpy().tofile(os.path.join(tmp, name + ".bin"))
    split = n_chunks > 1
    nch = n_chunks if split else 1
    scale = AQ.LOG2E / math.sqrt(D)
    subprocess.run([exe, tmp, str(Hkv), str(H // Hkv), str(nch), str(n_chunks), str(chunk),
                    str(AQ.MIN_CHUNK_ROWS), repr(scale), str(int(split)), "0"], check=True)
    rd = lambda n, *s: torch.from_numpy(  # noqa: E731
        __import__("numpy").fromfile(os.path.join(tmp, n + ".bin"), dtype="float32")).view(*s)
    if not split:
        o = rd("o", H, D).double()
    else:                                          # the merge of _reduce_q_kernel, BT = 16
        ch = -(-T // n_chunks)
        ch = -(-ch // C.TILE) * C.TILE
        ch = max(ch, min(chunk, AQ.MIN_CHUNK_ROWS))
        nv = -(-T // ch)
        m, l, a = rd("m", H, nch)[:, :nv].double(), rd("l", H, nch)[:, :nv].double(), \
            rd("acc", H, nch, D)[:, :nv].double()
        M = m.max(1, keepdim=True).values
        f = torch.exp2(m - M)
        o = (a * f[..., None]).sum(1) / (l * f).sum(1, keepdim=True)
    if vf.rotate:
        o = o @ R.double()
    return o * torch.sigmoid(qg[:, D:].double())



CASES = [  # kv_type, H, Hkv, D, T, (n_chunks, chunk)
    ("q8_0", 12, 2, 256, 77, (3, 16)),
    ("tq3", 12, 2, 256, 77, (3, 16)),
    ("tq4", 6, 1, 256, 53, (2, 16)),
    ("tq2", 8, 1, 128, 40, (2, 16)),
    ("q8_0+tq3", 6, 1, 256, 45, (3, 16)),
    ("tq3_128+tq4_128", 4, 1, 256, 37, (2, 16)),
    ("tq4+q8_0", 3, 1, 128, 70, (4, 16)),
    # layout-aware unpack at head dim 128 (tq3 / tq4 V: half a norm block per lane group)
    ("tq3", 8, 2, 128, 61, (3, 16)),
    ("q8_0+tq4", 4, 1, 128, 50, (2, 16)),
    ("tq4_128+tq3", 6, 1, 256, 40, (2, 16)),
    # more chunks launched than rows need (16 rows each: chunks 3..7 empty, as at depth 0 in the
    # captured step): the empty CTAs leave at once, the merge reads chunks 0..2 only
    ("tq3", 12, 2, 256, 40, (8, 16)),
    ("q8_0+tq3", 6, 1, 128, 17, (6, 16)),
]


@pytest.mark.parametrize("kv_type,H,Hkv,D,T,split", CASES)
def test_host_emulated_kernel(build_dir, tmp_path, kv_type, H, Hkv, D, T, split):
    kf, vf = (get_format(n) for n in split_kv_type(kv_type))
    assert C.shape_ok(kf, vf, H, Hkv, D)
    exe = _build(build_dir, kf, vf, D)
    q, kc, vc, qg, ref = _case(kv_type, H, Hkv, D, T, seed=T)
    check_close(_run_host(exe, str(tmp_path / "a"), kv_type, q, kc, vc, qg, T, 1, 1 << 30), ref)
    check_close(_run_host(exe, str(tmp_path / "b"), kv_type, q, kc, vc, qg, T, *split), ref)


@pytest.mark.parametrize("kv_type,H,Hkv,D,T,split", [
    ("tq3", 6, 1, 256, 150, (2, 16)),          # 8 warps: tiles 0..9 over warps, a partial tile
    ("tq4", 12, 2, 128, 100, (3, 16)),
])
def test_host_emulated_kernel_8_warps(build_dir, tmp_path, kv_type, H, Hkv, D, T, split):
    kf, vf = (get_format(n) for n in split_kv_type(kv_type))
    exe = _build(build_dir, kf, vf, D, nw=8)
    q, kc, vc, qg, ref = _case(kv_type, H, Hkv, D, T, seed=T + 1)
    check_close(_run_host(exe, str(tmp_path / "a"), kv_type, q, kc, vc, qg, T, 1, 1 << 30), ref)
    check_close(_run_host(exe, str(tmp_path / "b"), kv_type, q, kc, vc, qg, T, *split), ref)


def test_launch_config():
    """The builds the launcher picks on an H200 (132 SMs, 228 KiB per SM) at 32K context."""
    f = get_format
    for t in ("tq3", "tq4"):
        # 256 CTAs: 4 warps each (session 8: 36.8 vs 46.8 us per layer with 8), 4 fit per SM
        c64 = C.config(f(t), f(t), 256, 4, 64)
        assert c64["NW"] == 4 and c64["ctas_per_sm"] == 4 and c64["MINB"] == 4
        c132 = C.config(f(t), f(t), 256, 4, 132)         # 528 CTAs: the same build
        assert c132["NW"] == 4 and c132["ctas_per_sm"] == 4 and c132["MINB"] == 4
        c8 = C.config(f(t), f(t), 256, 4, 8)             # 32 CTAs < 132 SMs: 8 warps each
        assert c8["NW"] == 8 and c8["ctas_per_sm"] == 2
    q8 = C.config(f("q8_0"), f("q8_0"), 256, 4, 64)      # unchanged: 4 warps, 2 stages
    assert q8["NW"] == 4 and q8["NST"] == 2 and "MINB" not in q8
    for t in ("q8_0", "tq3", "tq4", "q8_0+tq3"):         # every pick fits one SM
        kf, vf = (f(n) for n in split_kv_type(t))
        for nl in (1, 16, 64, 132):
            for arch in ("sm_90", "sm_80", "sm_86"):
                c = C.config(kf, vf, 256, 4, nl, arch=arch)
                assert c["smem"] + 1024 <= C.smem_sm_for(arch)


def test_launch_count_capped(monkeypatch):
    """Split-K CTAs per KV head: the chunk count up to MAX_LAUNCH, whatever context the state was
    made for (rows per CTA come from T on the device); TIGHTFIT_ATTNQ_NL overrides it."""
    monkeypatch.delenv(C.ENV_NL, raising=False)
    assert C.n_launch_for(1, 257) == 1                   # single pass
    assert C.n_launch_for(40, 40) == 40
    assert C.n_launch_for(66, 66) == C.MAX_LAUNCH == 64  # a 33K-position state
    assert C.n_launch_for(257, 257) == 64                # a 128K-position state
    monkeypatch.setenv(C.ENV_NL, "132")
    assert C.n_launch_for(257, 257) == 132 and C.n_launch_for(66, 66) == 66


def test_shape_gate():
    f = get_format
    assert C.shape_ok(f("tq3"), f("tq3"), 24, 4, 256)
    assert not C.shape_ok(f("tq3"), f("tq3"), 24, 4, 64)          # head dim: Triton
    assert not C.shape_ok(f("tq3"), f("tq3"), 36, 4, 256)         # 9 heads per KV head
    assert not C.shape_ok(f("tq3_128"), f("tq3"), 8, 1, 128)      # 50-byte rows
    assert C.smem_bytes(8, 32, 8, 32, 256, C.stages(8, 32, 8, 32, 256)) <= 113 << 10


@pytest.mark.skipif(not (torch.cuda.is_available() and C.available()),
                    reason="needs a GPU and cupy")
@pytest.mark.parametrize("kv_type", ["q8_0", "tq3", "tq4", "q8_0+tq3", "tq3_128"])
def test_device_cuda_path(kv_type):
    H, Hkv, D, T = 24, 4, 256, 1500
    q, kc, vc, qg, ref = _case(kv_type, H, Hkv, D, T, seed=5)
    ws = AQ.make_workspace(kv_type, H, D, 4096, 256, device="cuda")
    st = torch.tensor([0, 0, T - 1], dtype=torch.int32, device="cuda")
    a = [t.cuda() for t in (q, kc, vc, qg)]
    for n in (1, 16):
        out = torch.zeros(H, D, device="cuda")
        AQ.attn_decode_q(a[0], a[1], a[2], a[3], out, st, ws, n_chunks=n, chunk=256,
                         backend="cuda")
        check_close(out.double().cpu(), ref)


def _banks_of_merge_store(D, vb, row_stride):
    """Banks hit by the 32 lanes of one accumulator store in the kernel's closing merge (the
    warp's lane (g, c) writes row 2c, dim vdim(i, 0, g) placed at d + d // 32), per i."""
    out = []
    for i in range(D // 16):
        banks = []
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            vpt = D // 8
            if vb in (2, 3):
                blk, r0 = (vpt * g) >> 5, ((vpt * g) & 31) >> 2
                d = 32 * blk + 16 * (i & 1) + r0 + (i >> 1)
            else:
                d = vpt * g + 2 * i
            banks.append((2 * c * row_stride + d + d // 32) % 32)
        out.append(banks)
    return out


@pytest.mark.parametrize("D", [128, 256])
@pytest.mark.parametrize("vb", [2, 3, 4, 8])
def test_merge_layout_matches_kernel_and_has_no_bank_conflict(build_dir, D, vb):
    """The host's smem size and accumulator stride are the kernel's own macros (a mismatch
    would make the GPU kernel run past its shared memory), and with that stride one fragment
    store of a warp touches 32 distinct banks (ncu, session 9: the plain layout was a 32-way
    conflict, 89 % of the kernel's shared-memory wavefronts)."""
    kf = get_format("tq3")
    vf = get_format({2: "tq2", 3: "tq3", 4: "tq4", 8: "q8_0"}[vb])
    exe = _build(build_dir, kf, vf, D)
    smem, rs = map(int, subprocess.run([exe, "--smem"], check=True, capture_output=True,
                                       text=True).stdout.split())
    d = C.defines(kf.bits, kf.group, vf.bits, vf.group, D)
    assert rs == C.acc_row_stride(D, vf.bits)
    assert smem == C.smem_bytes(kf.bits, kf.group, vf.bits, vf.group, D, d["NST"], d["NW"])
    for banks in _banks_of_merge_store(D, vf.bits, rs):
        assert len(set(banks)) == 32, banks
    # rows of plain D floats (no padding) conflict: the check can fail
    assert any(len(set(b)) < 32 for b in _banks_of_merge_store(D, vf.bits, D))


@pytest.mark.parametrize("n_ctas,fit,want", [(256, 4, 2), (32, 2, 1), (132, 4, 1), (528, 4, None),
                                             (600, 4, None), (1, 4, 1)])
def test_spread_smem_caps_ctas_per_sm(monkeypatch, n_ctas, fit, want):
    """The launch's shared memory lets exactly ceil(grid / SMs) CTAs share an SM (never more than
    the SM's opt-in maximum), or is the build's own when the grid fills every SM anyway;
    TIGHTFIT_ATTNQ_SPREAD=0 turns it off."""
    monkeypatch.delenv(C.ENV_SPREAD, raising=False)
    sm, ssm = 51200, C.SMEM_SM
    got = C.spread_smem(sm, n_ctas, 132, fit, ssm)
    if want is None:
        assert got == sm
    else:
        assert ssm // (got + 1024) == want and got <= ssm - 1024 and got >= sm
    monkeypatch.setenv(C.ENV_SPREAD, "0")
    assert C.spread_smem(sm, n_ctas, 132, fit, ssm) == sm
