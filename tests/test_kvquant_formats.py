"""KV quant formats (tightfit/kvquant): exact byte accounting, planner pricing and the CLI plan at
131,072 tokens, the q8_0 bytes against gguf-py's Q8_0 quantizer (outside oracle), packing,
rotation, the Lloyd-Max codebooks against an independent scipy integration, and D_mse against
the paper's bounds (spec quant-formats §6.1)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import tightfit.kvquant  # noqa: F401  (registers the formats with the planner)
from tightfit.kvquant.formats import (CODEBOOKS, FORMATS, get_format, hadamard,
                                      kv_bytes_per_token, rotation_matrix, rotation_signs)
from tightfit.kvquant.quality import distortion, paper_bounds
from tightfit.kvquant.reference import _pack, _unpack, dequantize, quantize, write_rows

# (bytes per 32, per 128, per 256 values); None: not addressable (block is 128)
BYTES = {"q8_0": (34, 136, 272), "tq4": (18, 72, 144), "tq3": (14, 56, 112), "tq2": (10, 40, 80),
         "tq4_128": (None, 66, 132), "tq3_128": (None, 50, 100)}


@pytest.mark.parametrize("name", sorted(BYTES))
def test_exact_bytes(name):
    f = get_format(name)
    for n, want in zip((32, 128, 256), BYTES[name]):
        if want is None:
            with pytest.raises(ValueError):
                f.row_bytes(n)
        else:
            assert f.row_bytes(n) == f.bytes_for(n) == want
    x = torch.randn(3, 2, 256)
    assert quantize(x, f).shape == (3, 2, BYTES[name][2])


def test_per_token_bytes_27b_and_planner():
    from tightfit.model.config import QWEN35_27B as C
    from tightfit.plan.budget import KV_FORMATS, kv_bytes_per_token as plan_bpt
    L = len(C.attention_ids)
    assert L == 16 and C.n_head_kv * C.head_dim == 1024
    # seed 004: 14 B per 32 values -> 16 layers x 2 x 1024 x 14/32 = 14,336 B per token
    assert kv_bytes_per_token("tq3", C.n_head_kv, C.head_dim, L) == 14336
    for name in (*FORMATS, "q8_0+tq3", "tq4+tq3", "q8_0+tq4", "tq4+tq2"):
        assert name in KV_FORMATS
        assert plan_bpt(C, KV_FORMATS[name]) == kv_bytes_per_token(name, C.n_head_kv, C.head_dim, L)
    assert plan_bpt(C, KV_FORMATS["q8_0+tq3"]) == 16 * 4 * (272 + 112)


def test_plan_cli_seedmix_128k_tq3(capsys):
    from tightfit.cli import main
    rc = main(["plan", "--preset", "qwen3.8-27b-seedmix", "--ctx", "131072", "--kv-type", "tq3",
               "--vram", "16GiB", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["fits"]
    assert d["kv_cache_bytes"] == 131072 * 14336 == 1_879_048_192


def test_q8_0_matches_gguf_py():
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize as gq
    x = (torch.randn(40, 256) * torch.linspace(0.01, 30, 256)).numpy().astype(np.float32)
    x[3] = 0.0
    ref = gq(x, gguf.GGMLQuantizationType.Q8_0).reshape(40, 8, 34)      # [fp16 d | 32 x int8]
    ours = quantize(torch.from_numpy(x), "q8_0").numpy()                    # [256 q | 8 x fp16]
    assert np.array_equal(ours[:, :256].reshape(40, 8, 32), ref[:, :, 2:])
    assert np.array_equal(ours[:, 256:].reshape(40, 8, 2), ref[:, :, :2])


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_pack_layout(bits):
    idx = torch.randint(0, 1 << bits, (5, 64))
    p = _pack(idx, bits)
    assert p.shape == (5, 64 * bits // 8) and torch.equal(_unpack(p, bits, 64), idx)
    e = 13                                          # the documented bit positions of element e
    b = p[0].tolist()
    if bits == 4:
        got = (b[e // 2] >> (4 * (e % 2))) & 15
    else:
        got = (b[e // 4] >> (2 * (e % 4))) & 3
        if bits == 3:
            got |= ((b[16 + e // 8] >> (e % 8)) & 1) << 2
    assert got == int(idx[0, e])


def test_rotation():
    H = hadamard(8)
    for i in range(8):
        for j in range(8):
            assert H[i, j] == (-1) ** bin(i & j).count("1")
    R = rotation_matrix(256)
    assert torch.allclose(R @ R.T, torch.eye(256, dtype=torch.float64), atol=1e-12)
    d1, d2 = rotation_signs(256)
    assert set(d1.tolist()) == {-1.0, 1.0} and not torch.equal(d1, d2)
    assert torch.equal(rotation_signs(256, 5)[0], rotation_signs(256, 5)[0])
    assert not torch.equal(rotation_signs(256, 5)[0], rotation_signs(256, 6)[0])
    # an outlier channel is spread over all coordinates
    x = torch.zeros(256, dtype=torch.float64)
    x[7] = 1.0
    assert torch.allclose((R @ x).abs(), torch.full((256,), 1 / 16, dtype=torch.float64))


@pytest.mark.parametrize("G,bits", sorted(CODEBOOKS))
def test_codebook_is_lloyd_max(G, bits):
    """Centroid condition checked with scipy.integrate.quad on f_G (independent of the grid sums
    of scripts/kv_codebooks.py): each level is the conditional mean of its cell."""
    integrate = pytest.importorskip("scipy.integrate")
    c = np.array(CODEBOOKS[(G, bits)])
    lim = math.sqrt(G)
    f = lambda t: (1 - t * t / G) ** ((G - 3) / 2)  # noqa: E731
    edges = [-lim, *(0.5 * (c[1:] + c[:-1])), lim]
    for i in range(len(c)):
        m0 = integrate.quad(f, edges[i], edges[i + 1])[0]
        m1 = integrate.quad(lambda t: t * f(t), edges[i], edges[i + 1])[0]
        assert abs(m1 / m0 - c[i]) < 2e-5
    if G == 128 and bits == 3:
        # spec §6.3: 8-level Lloyd-Max for N(0,1): 0.245, 0.756, 1.344, 2.152 (f_128 is ~Gaussian)
        assert np.allclose(c[4:], [0.245, 0.756, 1.344, 2.152], rtol=0.02)


@pytest.mark.parametrize("name", ["tq2", "tq3", "tq4", "tq3_128", "tq4_128"])
def test_distortion_within_paper_bounds(name):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2048, 256, generator=g)
    x[:, :4] = x[:, :4] * 12 + 5                      # outlier channels
    D = distortion(x, name)
    lo, hi = paper_bounds(get_format(name).bits)
    print(f"\n{name}: D_mse {D:.5f}, paper bounds {lo:.4f}..{hi:.4f}")
    assert D < hi
    assert D > 0.5 * lo                               # sanity: a fixed-rate scalar code cannot beat ~4^-b


def test_dequantize_and_write_rows():
    x = torch.randn(10, 2, 64)
    for name in FORMATS:
        f = get_format(name)
        if f.group > 64:
            continue
        y = dequantize(quantize(x, f), f, 64)
        assert y.shape == x.shape
        assert (y - x).norm() / x.norm() < (0.02 if name == "q8_0" else 0.4)
    kc = torch.zeros(12, 2, get_format("tq4").row_bytes(64), dtype=torch.uint8)
    vc = torch.zeros(12, 2, get_format("tq3").row_bytes(64), dtype=torch.uint8)
    write_rows(kc, vc, 0, x[:7], x[:7], "tq4+tq3")     # prefill chunk
    write_rows(kc, vc, 7, x[7:], x[7:], "tq4+tq3")     # decode rows
    assert torch.equal(kc[:10], quantize(x, "tq4")) and torch.equal(vc[:10], quantize(x, "tq3"))
    assert not kc[10:].any()
