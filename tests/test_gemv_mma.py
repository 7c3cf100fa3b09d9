"""Tensor-core skinny GEMM (tightfit/kernels/cuda/gemv_mma.cuh), CPU side.

(a) The format code of gemv_mma.cuh (load / afrag / xfrag / scale) is compiled with g++ and run
    per (lane, group); the results are assembled into the mma tiles exactly as the PTX ISA lays
    out mma.m16n8k32 / m16n8k16 .s8 fragments (A row g / g+8, slot 4t.. and 16+4t..; B column g)
    and multiplied in int64 / float64. Oracle: tightfit.quant's reference dequantization of the
    same random blocks (and the float64 dot with the integer x). The slot -> position map each
    lane's xfrag realises must be a permutation of the group's positions.
(b) nvcc -arch=sm_90 compiles every tf_mma<M, NT> instantiation without spills (skipped when
    nvcc is missing).
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tightfit.quant.dequant import dequantize
from tightfit.quant.traits import traits

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="no host C++ compiler")

from tightfit.kernels import gemv_mma as gm  # noqa: E402

NAMES = {8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 23: "IQ4_XS", 17: "IQ2_XS",
         18: "IQ3_XXS", 21: "IQ3_S", 22: "IQ2_S"}
TYPES = list(NAMES)
F16_FIELDS = {8: [0], 12: [0, 2], 13: [0, 2], 14: [208], 23: [0], 17: [0], 18: [0], 21: [0],
              22: [0]}
# k slots of a SPLIT format's first 16-element half: lanes 0-1's (4t.. and 16 + 4t..)
HALF0 = np.array([s for tt in (0, 1) for s in (*range(4 * tt, 4 * tt + 4),
                                               *range(16 + 4 * tt, 20 + 4 * tt))])
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def rand_blocks(rng, t, nblk):
    tr = traits(t)
    raw = rng.integers(0, 256, size=(nblk, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        sc = rng.uniform(0.001, 0.01, nblk) * rng.choice([-1.0, 1.0], nblk)
        raw[:, off:off + 2] = sc.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def lane_tiles(t, blks, xs, j):
    """A [16, KS] int8 tile (rows = blks[0..15]), B [KS, 8] tile (columns = xs[0..7], each the
    int8 x of one block) and ws / wm [16] of group j, gathered the way the mma fragments are:
    lane (g, tt) supplies A rows g and g+8 (its afrag on those rows' blocks), B column g (its xfrag
    on column g's x)."""
    info = gm.host_info(t)
    ks = info["KS"]
    kw = ks // 16
    A = np.zeros((16, ks), np.int64)
    B = np.zeros((ks, 8), np.int64)
    ws = np.zeros(16)
    wm = np.zeros(16)
    for lane in range(32):
        g, tt = lane >> 2, lane & 3
        for r in (g, g + 8):
            a, b, s0, s1 = gm.host_frag(t, blks[r], xs[g], tt, j)
            for h in range(kw):                 # word h = slots 16h + 4tt .. 16h + 4tt + 3
                A[r, 16 * h + 4 * tt:16 * h + 4 * tt + 4] = a[4 * h:4 * h + 4]
                B[16 * h + 4 * tt:16 * h + 4 * tt + 4, g] = b[4 * h:4 * h + 4]
            if tt == 0:
                ws[r], wm[r] = s0, s1
            else:   # every lane of a row must see the same scales
                assert (ws[r], wm[r]) == (s0, s1)
    return A, B, ws, wm


def group_value(t, A, B, ws, wm, xsum):
    """[16, 8] value of one group from its assembled tiles, as the kernel's epilogue forms it:
    ws * (A.B) - wm * x-sum, or for a SPLIT format ws * (half 0's dot) + wm * (half 1's): each
    half's dot is the mma with the other half's B slots zeroed."""
    if not gm.host_info(t)["SPLIT"]:
        return ws[:, None] * (A @ B) - wm[:, None] * xsum[None, :]
    lo = np.zeros(A.shape[1], bool)
    lo[HALF0] = True
    return ws[:, None] * (A[:, lo] @ B[lo]) + wm[:, None] * (A[:, ~lo] @ B[~lo])


def test_split_halves_are_the_scale_halves():
    """The lanes that form half 0 hold elements 0..15 of the group (the first scale nibble)."""
    for t in (17, 22):
        xb = (np.arange(256) % 32).astype(np.int8)
        blks = rand_blocks(np.random.default_rng(2), t, 16)
        _, B, _, _ = lane_tiles(t, blks, [xb] * 8, 0)
        assert sorted(B[HALF0, 0].tolist()) == list(range(16))


@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_slots_are_a_permutation(t):
    """x byte = its position inside the group: what the B tile holds per slot is then the
    physical position; every lane / group must cover each position exactly once."""
    info = gm.host_info(t)
    qk, ks = info["QK"], info["KS"]
    xb = (np.arange(qk) % ks).astype(np.int8)
    blks = rand_blocks(np.random.default_rng(1), t, 16)
    for j in range(info["NG"]):
        _, B, _, _ = lane_tiles(t, blks, [xb] * 8, j)
        for c in range(8):
            assert sorted(B[:, c].tolist()) == list(range(ks)), f"{NAMES[t]} group {j}"


@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_tiles_match_reference(t):
    """Per group: ws_r * (A.B)[r, c] - wm_r * sum(x_c over the group) == the reference
    dequantized row's dot with the integer x, for 16 random rows x 8 random columns."""
    info = gm.host_info(t)
    qk, ks = info["QK"], info["KS"]
    rng = np.random.default_rng(t)
    for rep in range(2):
        blks = rand_blocks(rng, t, 16)
        W = dequantize(blks, t).astype(np.float64).reshape(16, qk)
        X = rng.integers(-127, 128, size=(8, qk)).astype(np.int8)
        for j in range(info["NG"]):
            A, B, ws, wm = lane_tiles(t, blks, list(X), j)
            xsum = X[:, ks * j:ks * j + ks].astype(np.int64).sum(axis=1)
            got = group_value(t, A, B, ws, wm, xsum)             # A, B int64: the mma's exact dots
            ref = W[:, ks * j:ks * j + ks] @ X[:, ks * j:ks * j + ks].astype(np.float64).T
            scale = np.abs(W[:, ks * j:ks * j + ks]).sum(axis=1, keepdims=True) * 127 + 1e-30
            err = np.abs(got - ref) / scale
            assert err.max() < 1e-5, f"{NAMES[t]} rep {rep} group {j}: {err.max():.2e}"


@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_emulated_gemv(t):
    """A whole 16 x K by N GEMV through the assembled tiles and the kernel's epilogue formula
    (acc += xd[c, e/32] * (ws * D - wm * (s16 sums of the group))), K = 2 blocks, vs float64
    reference dequant of W times the de-quantized x."""
    from tightfit.kernels.quantize_act import quantize_act_ref
    info = gm.host_info(t)
    qk, ks = info["QK"], info["KS"]
    rng = np.random.default_rng(100 + t)
    nblk = 2 if qk == 256 else 8
    K = nblk * qk
    blks = rand_blocks(rng, t, 16 * nblk).reshape(16, nblk, -1)
    W = dequantize(blks.reshape(-1), t).astype(np.float64).reshape(16, K)
    x = rng.standard_normal((8, K))
    q, d, s16 = quantize_act_ref(x)
    q = q.reshape(8, K).astype(np.int8)
    y = np.zeros((16, 8))
    for b in range(nblk):
        for j in range(info["NG"]):
            A, B, ws, wm = lane_tiles(t, blks[:, b], list(q[:, b * qk:(b + 1) * qk]), j)
            e = b * qk + ks * j
            xs = s16[:, e // 16] + (s16[:, e // 16 + 1] if ks == 32 else 0)
            y += d[:, e // 32][None, :] * group_value(t, A, B, ws, wm, xs)
    ref = W @ (q.astype(np.float64) * np.repeat(d, 32, axis=1)).T
    e = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert e < 1e-5, f"{NAMES[t]}: {e:.2e}"


def test_corrupted_byte_is_seen():
    """The tile check can fail: flipping one code byte of one row changes the assembled dot."""
    t = 12
    rng = np.random.default_rng(7)
    blks = rand_blocks(rng, t, 16)
    X = rng.integers(-127, 128, size=(8, 256)).astype(np.int8)
    A, B, _, _ = lane_tiles(t, blks, list(X), 0)
    blks2 = blks.copy()
    blks2[3, 16 + 5] ^= 0x0F                       # sub-block 0, row 3, position 5
    A2, B2, _, _ = lane_tiles(t, blks2, list(X), 0)
    assert (A2 @ B2 != A @ B)[3].any() and (A2 @ B2 == A @ B)[np.arange(16) != 3].all()


@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_python_mirrors_header(t):
    """gemv_mma.py's launch geometry uses its own copies of the header's constants."""
    info = gm.host_info(t)
    tr = traits(t)
    assert (info["QK"], info["BB"]) == (tr.block_size, tr.type_size)
    assert info["KS"] * info["NG"] == info["QK"]
    assert gm.step_blocks(t, 1) == info["U1"] and gm.step_blocks(t, 2) == info["U2"]
    assert gm.step_blocks(t, 1, 2) == info["U1R2"] and gm.step_blocks(t, 2, 2) == info["U2R2"]
    assert min(info[k] for k in ("U1", "U2", "U1R2", "U2R2")) >= 1


@pytest.mark.parametrize("t", gm.PIPE_TYPES, ids=NAMES.get)
def test_pipe_smem_mirrors_header(t):
    """The launch's dynamic shared memory is the header's ring size (a smaller one would let the
    last warps' rings run past the allocation), and the default pipe config fits an SM."""
    for rt in gm.RTS:
        for nst in gm.PIPE_NSTS:
            assert gm.pipe_smem(t, rt, nst) == gm.host_pipe_smem(t, rt, nst), (rt, nst)
    rt, nst = gm.PIPE_RT.get(t, gm.DEFAULT_RT), gm.DEFAULT_NST
    assert gm.pipe_smem(t, rt, nst) + 1024 <= 227 << 10   # one CTA per SM at least (Q6_K: one)
    # a slot holds a row's item bytes at any misalignment, and its stride is 16 mod 32
    u, bb = gm.step_blocks(t, 1, rt), traits(t).type_size
    slot = gm.pipe_smem(t, rt, nst) // (8 * nst * 16 * rt)
    assert slot >= u * bb + 15 and slot % 32 == 16


def test_pipe_choice(monkeypatch):
    """Routing to the pipelined kernel: config beats env beats the per-type default (Q6_K on,
    the others off); Q8_0 never; bad values refused."""
    monkeypatch.delenv("TIGHTFIT_MMA_RT", raising=False)
    monkeypatch.delenv("TIGHTFIT_MMA_NST", raising=False)
    monkeypatch.delenv("TIGHTFIT_MMA_PIPE", raising=False)
    assert gm._pipe_choice(14, None) == (gm.DEFAULT_RT, gm.DEFAULT_NST)
    assert gm._pipe_choice(23, None) is None and gm._pipe_choice(12, None) is None
    monkeypatch.setenv("TIGHTFIT_MMA_PIPE", "1")
    assert gm._pipe_choice(23, None) == (gm.DEFAULT_RT, gm.DEFAULT_NST)
    assert gm._pipe_choice(8, None) is None
    assert gm._pipe_choice(23, {"pipe": 0}) is None
    assert gm._pipe_choice(23, {"rt": 1, "nst": 3}) == (1, 3)
    monkeypatch.setenv("TIGHTFIT_MMA_PIPE", "0")
    assert gm._pipe_choice(23, None) is None
    assert gm._pipe_choice(23, {"pipe": 1}) == (gm.DEFAULT_RT, gm.DEFAULT_NST)
    with pytest.raises(ValueError):
        gm._pipe_choice(23, {"pipe": 1, "nst": 5})


def test_geometry_one_wave_balanced():
    """Stream-K grid: at most one wave (sms * ctas_per_sm CTAs), every warp within one item of
    the others, split reported iff some warp's range cuts a tile."""
    for t in TYPES:
        for n_in, n_out in [(5120, 17408), (17408, 5120), (5120, 1024), (5120, 40), (2304, 300)]:
            for (nt, rt), fill in zip(list(gm.KERNELS) * 2, [True] * 3 + [False] * 3):
                ctas, split = gm.geometry(t, n_in, n_out, 132, 2, nt, rt, fill)
                u, qk = gm.step_blocks(t, nt, rt), traits(t).block_size
                spt = -(-(n_in // qk) // u)
                items = -(-n_out // (16 * rt)) * spt
                assert 1 <= ctas <= 264
                nw = ctas * 8
                b = items * np.arange(nw + 1) // nw
                per = np.diff(b)
                assert per.max() - per.min() <= 1 and per.max() == -(-items // min(items, 2112))
                assert split == bool((b[1:-1] % spt != 0).any())
                if fill:        # every slot of the wave busy (2 CTAs on every SM)
                    assert ctas == min(264, -(-items // 8))


def test_supported_list():
    assert [t for t in TYPES if gm.supported(t)] == TYPES
    assert not gm.supported(2) and not gm.supported(10)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_nvcc_sm90_no_spills():
    rows = gm.compile_report("sm_90", nvcc=NVCC)
    n_pipe = len(gm.PIPE_TYPES) * len(gm.RTS) * len(gm.PIPE_NSTS)
    assert len(rows) == len(TYPES) * len(gm.KERNELS) + n_pipe, rows
    assert sum(r["kernel"] == "pipe" for r in rows) == n_pipe
    # known exceptions at the 128-register cap of 2 CTAs/SM: the pipelined kernel at two row
    # tiles spills <= 100 bytes (since the fixup), Q6_K's more (measured faster all the same: the
    # Q6_K default).
    # Since the deterministic fixup (tf_mma_finish), NT * RT = 2 of the K-quants spills a few
    # words per tile group around the flush (cuobjdump: Q4_K / Q5_K none inside the step loop),
    # Q6_K (16 groups per block) up to ~130 bytes (it was 36 with the atomics); the rest is clean
    # Since the scales come out as fp32 bits by PRMT (session 13: no I2F), Q4_K / Q5_K spill a
    # few words in every variant (the rt kernel, their default: 5 spill instructions per 16 mma
    # inside the step loop, for 7 ALU instructions fewer per mma) and up to ~130 bytes at RT = 2
    def known(r):
        sp = r["spill_stores"] + r["spill_loads"]
        kq = r["format"] in ("M_Q4_K", "M_Q5_K")
        if r["type"] in (17, 18, 21, 22) and r["kernel"] != "pipe":
            # the grid formats' register kernels (opt-in: the ring is their default) hold up to
            # 21 raw words per row and block (<= 264 bytes at two row tiles)
            return sp <= 280
        if r["kernel"] == "pipe":      # (Q4_K / Q5_K: opt-in, the rt kernel is their default)
            return (r["rt"] == 2 and (r["format"] == "M_Q6_K" or sp <= 100)) or (kq and sp <= 40)
        if r["nt"] * r["rt"] >= 2:
            return sp <= (140 if r["format"] in ("M_Q6_K", "M_Q5_K") else 40)
        return kq and sp <= 40
    bad = [r for r in rows if (r["spill_stores"] or r["spill_loads"]) and not known(r)]
    assert not bad, bad
    assert all(r["regs"] <= 128 for r in rows), rows     # 2 CTAs of 256 threads per SM


# ---------------------------------------------------------------- deterministic stream-K fixup
def _walk(items, spt, nw):
    """Brute force of what every warp does (gemv_mma.cuh's while loop over its range): items it
    covers, and per tile group it leaves partial, the slot it stores to (0: its first group)."""
    cover = np.zeros(items, np.int64)
    pieces = {}                                   # tg -> [(warp, slot)] in warp order
    slots_of = {}                                 # warp -> [(slot, tg)]
    for w in range(nw):
        it, iend = items * w // nw, items * (w + 1) // nw
        cover[it:iend] += 1
        first = True
        while it < iend:
            tg, s0 = divmod(it, spt)
            s1 = min(spt, s0 + (iend - it))
            if not (s0 == 0 and s1 == spt):
                slot = 0 if first else 1
                pieces.setdefault(tg, []).append((w, slot))
                slots_of.setdefault(w, []).append((slot, tg))
            first = False
            it += s1 - s0
    return cover, pieces, slots_of


def _check_fixup(items, spt, nw, host=False):
    cover, pieces, slots_of = _walk(items, spt, nw)
    assert (cover == 1).all()                     # every item exactly once
    plan = gm.fixup_plan(items, spt, nw)
    assert plan == pieces                         # the reducer reads exactly the written slots
    for tg, p in plan.items():
        assert len(p) >= 2
        assert [w for w, _ in p] == sorted({w for w, _ in p})       # ascending, distinct
        assert all(s == 0 for _, s in p[1:])      # only the first piece can be a slot-1 one
    for w, used in slots_of.items():
        assert len(used) <= 2 and all(s in (0, 1) for s, _ in used)
        assert len({s for s, _ in used}) == len(used)              # never one slot for two groups
    for tg in range(items // spt):                # a group outside the plan has a single owner
        if tg not in plan:
            assert len(gm.fixup_pieces(items, spt, nw, tg)) == 1
    if host:                                      # the header's own integer code agrees
        for tg in list(plan)[:8] + list(range(min(4, items // spt))):
            assert gm.host_fixup_pieces(items, spt, nw, tg) == gm.fixup_pieces(items, spt, nw, tg)


def test_fixup_slot_floats_mirror_header():
    assert gm.SLOT_FLOATS == gm.host_slot_floats()
    # the largest accumulator of any instantiation: NT * RT * 4 floats per lane
    largest = max(4 * nt * rt for nt, rt in gm.KERNELS)
    assert gm.SLOT_FLOATS >= max(largest, 4 * max(gm.RTS))


def test_fixup_workspace_bytes():
    """Counters: one int32 per 16-row tile (the output head: 248320 rows -> 15520) padded to the
    slot alignment; slots: 2 per warp of 132 SMs x 8 CTAs x 8 warps, 32 lanes x SLOT_FLOATS."""
    assert gm.fixup_workspace_bytes(248320, 132) == 62208 + 132 * 8 * 8 * 2 * 32 * 8 * 4
    assert gm.fixup_workspace_bytes(16, 1, 1) == 256 + 8 * 2 * 32 * 8 * 4
    assert gm.fixup_workspace_bytes(17, 132, 2) < gm.fixup_workspace_bytes(17, 132)


@pytest.mark.parametrize("t", TYPES, ids=NAMES.get)
def test_fixup_real_grids(t):
    """The split of the model's shapes on the H200's grid (geometry), every kernel variant."""
    for n_in, n_out in [(5120, 17408), (17408, 5120), (5120, 1024), (5120, 48), (6144, 10240),
                        (5120, 40000)]:
        for nt, rt in list(gm.KERNELS) + [(1, 2)]:
            for cps in (1, 2, 8):
                ctas, split = gm.geometry(t, n_in, n_out, 132, cps, nt, rt)
                u, qk = gm.step_blocks(t, nt, rt), traits(t).block_size
                spt = -(-(n_in // qk) // u)
                items = -(-n_out // (16 * rt)) * spt
                plan = gm.fixup_plan(items, spt, ctas * 8)
                assert split == bool(plan)
                if items <= 300_000:
                    _check_fixup(items, spt, ctas * 8, host=(cps == 2))


def test_geometry_refuses_32bit_overflow():
    """The kernels' split arithmetic is 32-bit: a launch whose items x warps reach 2^32 is refused
    with a clear error instead of wrapping around."""
    with pytest.raises(ValueError, match="2\\^32"):
        gm.geometry(8, 1 << 22, 1 << 20, 132, 8)
    ctas, _ = gm.geometry(14, 5120, 248320, 132, 8)      # the output head on the widest grid fits
    assert ctas > 0


try:
    from hypothesis import given, settings, strategies as st
except ImportError:     # pragma: no cover
    given = None

if given is not None:
    @settings(deadline=None, max_examples=150)
    @given(groups=st.integers(1, 400), spt=st.integers(1, 160), nw=st.integers(1, 3000))
    def test_fixup_plan_properties(groups, spt, nw):
        """Any (items, nw): every item covered once, each split group's pieces in ascending warp
        order with P >= 2, each warp using slot 0 / 1 at most once each; the g++-compiled header
        computes the same pieces."""
        _check_fixup(groups * spt, spt, nw, host=True)


def test_legacy_switch_parse(monkeypatch):
    """TIGHTFIT_MMA_LEGACY (session 11's arithmetic, for A/B timing) and TIGHTFIT_MMA_MINB
    (launch bounds): off / 2 by default, the define when set, a clear error for anything else."""
    monkeypatch.delenv("TIGHTFIT_MMA_LEGACY", raising=False)
    assert "-DTF_MMA_LEGACY=1" not in gm._options()
    monkeypatch.setenv("TIGHTFIT_MMA_LEGACY", "1")
    assert "-DTF_MMA_LEGACY=1" in gm._options()
    monkeypatch.setenv("TIGHTFIT_MMA_LEGACY", "yes")
    with pytest.raises(ValueError, match="TIGHTFIT_MMA_LEGACY"):
        gm._options()
    monkeypatch.delenv("TIGHTFIT_MMA_LEGACY")
    monkeypatch.setenv("TIGHTFIT_MMA_MINB", "3")          # occupancy A/B: launch bounds for 3
    assert "-DTF_MMA_MINB=3" in gm._options() and gm._min_blocks() == 3
    monkeypatch.setenv("TIGHTFIT_MMA_MINB", "9")
    with pytest.raises(ValueError, match="TIGHTFIT_MMA_MINB"):
        gm._options()


# ---------------------------------------------------------------- lean K4 epilogue (session 20)
def _k4_scales_ref(blk):
    """sc[8], m[8] of a Q4_K / Q5_K block from its 12 scale bytes (llama.cpp's get_scale_min_k4,
    written out here as the oracle), d and dmin from its fp16 header."""
    q = [int(v) for v in blk[4:16]]
    sc, m = [], []
    for j in range(8):
        if j < 4:
            sc.append(q[j] & 63)
            m.append(q[j + 4] & 63)
        else:
            sc.append((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4))
            m.append((q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    d, dmin = np.frombuffer(bytes(blk[:4]), np.float16).astype(np.float64)
    return np.array(sc), np.array(m), float(d), float(dmin)


@pytest.mark.parametrize("t", [12, 13], ids=NAMES.get)
def test_k4_lean_values_exact(t):
    """tf_mma_k4_ws's ws is d * sc and nws is -1.5 * 2^23 * ws, both exactly (the single-FFMA
    product relies on it), over random blocks and the fp16 extremes of d; tf_mma_k4_mins_t gives
    lane t the mins of groups t and t + 4."""
    rng = np.random.default_rng(7)
    blks = rand_blocks(rng, t, 64)
    ext = np.array([65504.0, -65504.0, 6e-8, -6.1e-5, 0.0, 1.0], np.float16)
    blks[:len(ext), 0:2] = ext.view(np.uint8).reshape(-1, 2)
    blks[:len(ext), 2:4] = ext[::-1].copy().view(np.uint8).reshape(-1, 2)
    for blk in blks:
        sc, m, d, dmin = _k4_scales_ref(blk)
        ws, nws, mt, dm = gm.host_k4_lean(blk)
        assert np.array_equal(ws.astype(np.float64), d * sc)            # exact in fp32
        assert np.array_equal(nws.astype(np.float64), -12582912.0 * d * sc)
        assert dm == dmin
        for tt in range(4):
            assert (mt[tt, 0], mt[tt, 1]) == (m[tt], m[tt + 4])


def _tf32_rna(x):
    """cvt.rna.tf32.f32: round to 10 explicit mantissa bits, ties away from zero."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return u.view(np.float32)


def _tf32_trunc(x):
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.parametrize("t", [12, 13], ids=NAMES.get)
def test_emulated_gemv_lean_k4(t):
    """A 16 x K by 8 GEMV through the lean K4 epilogue as tf_mma_block runs it: per group
    acc += xd * (ws * D) in fp32 (nws folded in), and per block the min term as the tf32 product
    the lanes assemble (A row g / g + 8 at k = t, t + 4 from tf_mma_k4_mins_t; B = X of groups t,
    t + 4 split into tf32 hi + truncated lo), times dmin. Oracle: float64 reference dequant of W
    times the de-quantized x."""
    from tightfit.kernels.quantize_act import quantize_act_ref
    rng = np.random.default_rng(200 + t)
    nblk = 3
    K = 256 * nblk
    blks = rand_blocks(rng, t, 16 * nblk).reshape(16, nblk, -1)
    W = dequantize(blks.reshape(-1), t).astype(np.float64).reshape(16, K)
    x = rng.standard_normal((8, K)) * rng.uniform(0.1, 30.0, (8, 1))
    q, d, s16 = quantize_act_ref(x)
    q = q.reshape(8, K).astype(np.int8)
    y = np.zeros((16, 8), np.float32)
    for b in range(nblk):
        for j in range(8):
            A, B, _, _ = lane_tiles(t, blks[:, b], list(q[:, b * 256:(b + 1) * 256]), j)
            D = (A @ B).astype(np.float32)
            ws = np.array([gm.host_k4_lean(blks[r, b])[0][j] for r in range(16)], np.float32)
            xd = d[:, b * 8 + j].astype(np.float32)
            y += xd[None, :] * (ws[:, None] * D)
        Am = np.zeros((16, 8), np.float32)                   # rows x the block's groups
        Bh = np.zeros((8, 8), np.float32)                    # groups x columns
        Bl = np.zeros((8, 8), np.float32)
        dmin = np.zeros(16, np.float32)
        for lane in range(32):
            g, tt = lane >> 2, lane & 3
            for r in (g, g + 8):
                _, _, mt, dmin[r] = gm.host_k4_lean(blks[r, b])
                Am[r, tt], Am[r, tt + 4] = mt[tt]
            for k in (tt, tt + 4):
                o = b * 8 + k
                X = np.float32(d[g, o]) * np.float32(s16[g, 2 * o] + s16[g, 2 * o + 1])
                Bh[k, g] = _tf32_rna(X)
                Bl[k, g] = _tf32_trunc(np.float32(X - Bh[k, g]))
        Dm = Am.astype(np.float64) @ (Bh.astype(np.float64) + Bl)
        y -= (dmin[:, None] * Dm).astype(np.float32)
    ref = W @ (q.astype(np.float64) * np.repeat(d, 32, axis=1)).T
    e = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert e < 1e-5, f"{NAMES[t]}: {e:.2e}"
    # the mins must matter here: without them the result is far off
    assert np.linalg.norm(y + (dmin[:, None] * Dm) - ref) / np.linalg.norm(ref) > 1e-3


def test_mins_tc_switch_parse(monkeypatch):
    """TIGHTFIT_MMA_MINS_TC=0 builds session 19's per-group min term for A/B timing."""
    monkeypatch.delenv("TIGHTFIT_MMA_MINS_TC", raising=False)
    assert not any("MINS_TC" in o for o in gm._options())
    monkeypatch.setenv("TIGHTFIT_MMA_MINS_TC", "0")
    assert "-DTF_MMA_MINS_TC=0" in gm._options()
    monkeypatch.setenv("TIGHTFIT_MMA_MINS_TC", "off")
    with pytest.raises(ValueError, match="TIGHTFIT_MMA_MINS_TC"):
        gm._options()


def test_rt_choice(monkeypatch):
    """Row tiles per warp: config over env over the per-type default (Q5_K 1, session 20) over 2."""
    monkeypatch.delenv("TIGHTFIT_MMA_RT", raising=False)
    assert gm.rt_choice(13) == 1 and gm.rt_choice(12) == gm.DEFAULT_RT == 2
    monkeypatch.setenv("TIGHTFIT_MMA_RT", "2")
    assert gm.rt_choice(13) == 2
    assert gm.rt_choice(13, {"rt": 1}) == 1 and gm.rt_choice(12, {"rt": 1}) == 1
