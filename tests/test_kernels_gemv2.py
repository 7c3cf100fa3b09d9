"""GEMV v2 (int8 tensor-core dot on decoded tiles) vs the slow reference (tightfit.quant's NumPy
dequantization + float64 matmul), on CPU under TRITON_INTERPRET=1 (prmt emulated), fresh
random blocks, outputs poisoned with NaN.

Bounds per call:
- against the reference fed the int8-quantized activations the kernel uses: 1e-4 relative
  (the integer dot is exact; only fp32 scale products and summation order differ, ~1e-7 seen;
  a decoding or layout bug gives O(1));
- against the reference fed the float activations: 2e-2 (int8 per-32 rounding of x costs
  0.3-0.7 % on random data).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from tightfit.kernels import gemv as disp  # noqa: E402
from tightfit.kernels.gemv import gemv_ref, type_name  # noqa: E402
from tightfit.kernels import gemv2 as g2  # noqa: E402
from tightfit.kernels.gemv2 import gemv2, prep_for, PERM, PERM_SMALL  # noqa: E402
from tightfit.kernels.gemv2_act import prep_act2, prep_act2_ref, perm_table  # noqa: E402
from tightfit.kernels.gemv2_layout import (FORMATS, GROUP, relayout, unrelayout,  # noqa: E402
                                           relayout_torch, field_args)
from tightfit.kernels.quantize_act import quantize_act_ref  # noqa: E402
from tightfit.quant.traits import traits  # noqa: E402

# CPU tensors: only where the kernels were built for the interpreter
pytestmark = pytest.mark.skipif(not _interp.interpreted(disp, g2),
                                reason="CPU tests run the Triton interpreter")

TYPES = [23, 13, 14, 12, 11, 8]          # IQ4_XS, Q5_K, Q6_K, Q4_K, Q3_K, Q8_0
F16_FIELDS = {23: [0], 12: [0, 2], 13: [0, 2], 14: [208], 11: [108], 8: [0]}


def rand_blocks(rng, t, n_out, n_in):
    tr = traits(t)
    raw = rng.integers(0, 256, size=(n_out * n_in // tr.block_size, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        sc = rng.uniform(0.001, 0.01, raw.shape[0]).astype(np.float16)
        raw[:, off:off + 2] = sc.view(np.uint8).reshape(-1, 2)
    return raw.reshape(n_out, -1)


def check(t, n, n_out, n_in, seed, planar, config=None, via_dispatch=False):
    rng = np.random.default_rng(seed)
    w = rand_blocks(rng, t, n_out, n_in)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    buf = relayout(w, t) if planar else w.reshape(-1)
    out = torch.full((n, n_out), float("nan"))
    args = (torch.from_numpy(x), torch.from_numpy(buf.copy()), t, n_out, n_in)
    if via_dispatch:
        y = disp.gemv(*args, out=out, planar=planar, config=config).numpy()
    else:
        y = gemv2(*args, out=out, planar=planar, config=config).numpy()
    assert not np.isnan(y).any(), "unwritten outputs"
    ref = gemv_ref(x, w, t, n_out, n_in)
    q, d, _ = quantize_act_ref(x)
    refq = gemv_ref((q * d[..., None]).reshape(n, n_in), w, t, n_out, n_in)
    eq = np.linalg.norm(y - refq) / np.linalg.norm(refq)
    ef = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    what = f"{type_name(t)} N={n} {n_out}x{n_in} planar={planar} cfg={config}"
    assert eq < 1e-4, f"{what}: {eq:.2e} vs quantized-x reference"
    assert ef < 2e-2, f"{what}: {ef:.2e} vs float reference"


@pytest.mark.parametrize("planar", [False, True], ids=["raw", "planar"])
@pytest.mark.parametrize("n", [1, 3, 8, 16])
@pytest.mark.parametrize("t", TYPES, ids=type_name)
def test_gemv2(t, n, planar):
    check(t, n, 16, 512, seed=100 * t + n, planar=planar, config={"R": 16})


@pytest.mark.parametrize("t", TYPES, ids=type_name)
def test_gemv2_edges(t):
    """Rows not a multiple of R, blocks not a multiple of KB, split-K with its reduce pass."""
    check(t, 2, 40, 768, seed=7 * t, planar=t % 2 == 0, config={"R": 32, "KB": 2, "SPLIT": 2})


def test_gemv2_dispatch(monkeypatch):
    monkeypatch.setenv("TIGHTFIT_GEMV", "v2")
    check(14, 4, 16, 256, seed=3, planar=False, via_dispatch=True)
    monkeypatch.setenv("TIGHTFIT_GEMV", "auto")
    # the measured rule (bench/RESULTS.md): auto = v2 for IQ4_XS/Q4_K/Q5_K at N >= 3 on raw blocks
    assert disp.uses_v2("Q4_K", 4) and not disp.uses_v2("Q4_K", 1) and not disp.uses_v2("Q6_K", 8)
    assert not disp.uses_v2("Q6_K", 17) and not disp.uses_v2(10)
    monkeypatch.setenv("TIGHTFIT_GEMV", "v2")
    assert disp.uses_v2("Q6_K", 4) and disp.uses_v2("Q6_K", 1)
    monkeypatch.setenv("TIGHTFIT_GEMV", "v1")
    assert not disp.uses_v2("Q6_K")
    with pytest.raises(ValueError):    # Q2_K has no v2 kernel, so no planar layout
        disp.gemv(torch.zeros(1, 256), torch.zeros(16 * 84, dtype=torch.uint8), 10, 16, 256,
                  planar=True)


@pytest.mark.parametrize("t", TYPES, ids=type_name)
def test_v1_still_correct(t, monkeypatch):
    """TIGHTFIT_GEMV=v1 keeps the v1 kernel for these types (also v2's compile fallback)."""
    monkeypatch.setenv("TIGHTFIT_GEMV", "v1")
    rng = np.random.default_rng(t)
    w = rand_blocks(rng, t, 16, 256)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    y = disp.gemv(torch.from_numpy(x), torch.from_numpy(w.reshape(-1).copy()), t, 16, 256).numpy()
    ref = gemv_ref(x, w, t, 16, 256)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 2e-2


@pytest.mark.parametrize("t", TYPES, ids=type_name)
def test_relayout_roundtrip(t):
    rng = np.random.default_rng(t)
    bb = FORMATS[t][1]
    for nblk in (1, 3, 24):
        raw = rng.integers(0, 256, size=nblk * bb, dtype=np.uint8)
        pl = relayout(raw, t)
        assert pl.size == raw.size and pl.dtype == np.uint8
        assert np.array_equal(unrelayout(pl, t), raw)
        assert np.array_equal(relayout_torch(torch.from_numpy(raw), t).numpy(), pl)
        # field planes: the first field (quants) of block b sits at b * its size
        name, off, size = FORMATS[t][3][0]
        assert np.array_equal(pl[:nblk * size].reshape(nblk, size),
                              raw.reshape(nblk, bb)[:, off:off + size])
        starts = [4 * p for p in field_args(t, raw.size, True)[:len(FORMATS[t][3])]]
        assert all(s % 4 == 0 for s in starts)
    with pytest.raises(ValueError):
        relayout(np.zeros(bb + 1, np.uint8), t)


@pytest.mark.parametrize("S,perm", [(32, 0), (32, 1), (32, 2), (16, 0)])
@pytest.mark.parametrize("n", [1, 3, 8, 16])
def test_prep_act2(S, perm, n):
    x = np.random.default_rng(n + S).standard_normal((n, 512)).astype(np.float32)
    x[0, 32:64] = 0.0                                    # an all-zero block gives d = 0
    a = prep_act2(torch.from_numpy(x), S, perm)
    b, xs, xsum = prep_act2_ref(x, S, perm)
    assert np.array_equal(a.b.numpy(), b)
    np.testing.assert_allclose(a.xs.numpy(), xs, rtol=1e-6, atol=0)
    np.testing.assert_allclose(a.xsum.numpy(), xsum, rtol=1e-5, atol=1e-6)
    # q: the int8 activations of the v1 quantizer reference, each 32 in decode order `perm`
    q, _, _ = quantize_act_ref(x)
    q = q.reshape(n, -1, 32)[:, :, perm_table(perm)].reshape(n, -1)
    assert np.array_equal(a.q.numpy(), q)
    small = prep_act2(torch.from_numpy(x), S, perm, with_b=False)
    assert not small.has_b and np.array_equal(small.q.numpy(), q)
    assert np.array_equal(small.xs.numpy(), a.xs.numpy())


@pytest.mark.parametrize("planar", [False, True], ids=["raw", "planar"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", TYPES, ids=type_name)
def test_gemv2_small(t, n, planar):
    """The dp4a small-N path (gemv2_small), default config (R=64 > n_out: clamped rows)."""
    check(t, n, 16, 512, seed=300 * t + n, planar=planar, config={"PATH": "dp4a"})


@pytest.mark.parametrize("t", TYPES, ids=type_name)
def test_gemv2_small_edges(t):
    """Small path: rows not a multiple of R, NB=3 blocks with KB=2 (a clamped, zero-scaled
    block), split-K with the reduce pass."""
    check(t, 2, 40, 768, seed=11 * t, planar=t % 2 == 1,
          config={"PATH": "dp4a", "R": 16, "KB": 2, "SPLIT": 2, "num_warps": 2})
    check(t, 1, 24, 768, seed=13 * t, planar=False,
          config={"PATH": "dp4a", "R": 32, "KB": 1, "SPLIT": 1, "num_warps": 1})
    # U=2 chunks per iteration: NB=5 blocks, KB=1 -> groups of 2 with a clamped tail, and
    # split-K interleaving the groups between two programs
    check(t, 1, 24, 1280, seed=17 * t, planar=True,
          config={"PATH": "dp4a", "R": 32, "KB": 1, "SPLIT": 2, "num_warps": 1, "U": 2})


def test_gemv2_small_routing(monkeypatch):
    assert g2.SMALL_N == 0 and not g2.use_small(1)          # off until measured on the device
    assert g2.use_small(2, {"PATH": "dp4a"}) and not g2.use_small(3, {"PATH": "dp4a"})
    assert not g2.use_small(1, {"PATH": "tc"})
    with pytest.raises(ValueError):
        g2.use_small(1, {"PATH": "mma"})
    monkeypatch.setattr(g2, "SMALL_N", 2)
    assert g2.use_small(2) and not g2.use_small(3) and not g2.use_small(1, {"PATH": "tc"})
    # activations prepared for one path are refused by the other
    x = torch.randn(1, 256)
    w = torch.zeros(16 * 136, dtype=torch.uint8)
    with pytest.raises(ValueError):
        g2.gemv2_prepared(prep_for(x, 23, small=True), w, 23, 16, config={"PATH": "tc"})
    with pytest.raises(ValueError):
        g2.gemv2_prepared(prep_for(x, 23), w, 23, 16, config={"PATH": "dp4a"})
    assert PERM_SMALL[23] != PERM[23]


def test_prep_shared_by_family():
    x = torch.randn(2, 256)
    act = prep_for(x, 12)
    assert act.fits(GROUP[13], PERM.get(13, 0)) and act.fits(GROUP[8], PERM.get(8, 0))
    assert not act.fits(GROUP[14], 0) and not act.fits(GROUP[23], PERM[23])


def test_small_split_bound_covers_every_shape():
    """gemv_route.split_bound (the planned split-K buffer) holds the partials of any matrix the
    small path's default config splits, for every small type and row count."""
    from tightfit.kernels.gemv2_small import pick_config_small
    from tightfit.kernels.gemv_route import SMALL_TYPES, split_bound
    for t in SMALL_TYPES:
        for n_out in list(range(1, 40000, 97)) + [248320, 17408, 34816]:
            for nb in (1, 2, 3, 20, 24, 68):
                cfg = pick_config_small(t, 1, n_out, nb)
                assert cfg["SPLIT"] * n_out <= split_bound(1) or cfg["SPLIT"] == 1


def test_small_path_other_tile_order():
    """The small path's tiles have two physical dim orders (gemv2_small._rows_first: default
    [fields, R, KB, words], TIGHTFIT_GEMV_RF=1 [R, KB, fields, words]); this process imported one
    of them, so the edge cases run again in a child with the other order forced."""
    import subprocess
    import sys
    from tightfit.kernels import gemv2_small
    env = dict(os.environ, TRITON_INTERPRET="1",
               TIGHTFIT_GEMV_RF="0" if gemv2_small._rows_first() else "1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        __file__, "-k", "test_gemv2_small_edges"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "passed" in r.stdout
