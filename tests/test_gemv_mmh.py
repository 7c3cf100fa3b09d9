"""The bf16 byte-table GEMV (tightfit.kernels.gemv_mmh) on the CPU: the header's own decode
functions (compiled with g++) against gguf-py's IQ4_XS dequantization, its bf16 rounding against
torch's, its argument checks, and the route that sends IQ4_XS products to it
(gemv_route.mmh_routed). The kernel itself runs in tests/test_gemv_mmh_device.py."""
from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
import torch

from tightfit.kernels import gemv_mma
from tightfit.kernels import gemv_mmh as H
from tightfit.kernels import gemv_route as R
from _fake_cuda import FakeCuda

IQ4_XS = 23


def _blocks(n: int, seed: int, scale: tuple[float, float]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (n, H.BB), dtype=np.uint8)
    d = rng.uniform(*scale, n).astype(np.float16)
    b[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    return b


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="needs a C++ compiler")
@pytest.mark.parametrize("scale", [(1e-3, 1e-2), (3e-6, 5e-5)], ids=["normal", "subnormal"])
def test_lane_decode_is_gguf_dequantization(scale):
    """Every lane's table rows, entries and group factors rebuild gguf-py's dequantized block
    exactly (d * (ls - 32) * kvalue), each of the 256 elements from exactly one (lane t, group,
    byte, half); every address names the lane's own word of the row (no bank conflicts); fp16
    subnormal block scales included (the seed-mix 27B's)."""
    blocks = _blocks(6, 3, scale)
    ref = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.IQ4_XS).reshape(6, 256)
    for bi, blk in enumerate(blocks):
        d = float(blk[0:2].view(np.float16)[0])
        got = np.full(256, np.nan)
        seen = np.zeros(256, int)
        for g in (0, 5):
            for t in range(4):
                r = H.host_lane(blk, g, t)
                assert (r["word"] == 4 * g + t).all()
                assert (r["row"] < 256).all()
                if g:
                    continue
                for j in range(8):
                    for m in range(4):
                        e = int(r["entry"][j, m])
                        lo, hi = H.bf16_bits_to_f32(e & 0xFFFF), H.bf16_bits_to_f32(e >> 16)
                        for el, v in ((4 * t + m, lo), (4 * t + m + 16, hi)):
                            got[32 * j + el] = float(v) * float(r["f"][j]) * d
                            seen[32 * j + el] += 1
        assert (seen == 1).all()
        np.testing.assert_array_equal(got.astype(np.float32), ref[bi])


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="needs a C++ compiler")
@pytest.mark.parametrize("scale", [(1e-3, 1e-2), (3e-6, 5e-5)], ids=["normal", "subnormal"])
def test_fold_lane_weights_are_gguf_dequantization_in_bf16(scale):
    """The foldp kernel's lanes (header functions, g++) cover each of a block's 256 elements exactly
    once, with fold_weights' values bitwise; those are gguf-py's dequantized weights within the two
    bf16 roundings (scale, then product; each <= 2^-8 relative), and fold_weights unrounded IS gguf-py."""
    blocks = _blocks(6, 4, scale)
    ref = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.IQ4_XS).reshape(6, 256)
    want = H.fold_weights(blocks.reshape(-1), 6, 256)
    np.testing.assert_array_equal(H.fold_weights(blocks.reshape(-1), 6, 256, rounded=False)
                                  .astype(np.float32), ref)
    assert (np.abs(want - ref) <= (2.0 ** -7 + 2.0 ** -16) * np.abs(ref)).all()   # (1 + 2^-8)^2 - 1
    assert (want != ref).any()                  # the rounding is real: the reference must model it
    for bi, blk in enumerate(blocks):
        got = np.full(256, np.nan)
        seen = np.zeros(256, int)
        for t in range(4):
            pairs = H.host_lane_fold(blk, 3, t)
            for s in range(4):
                for m in range(8):
                    e = 32 * (2 * s + t // 2) + 8 * (t % 2) + m
                    v = int(pairs[s, m])
                    for el, bits in ((e, v & 0xFFFF), (e + 16, v >> 16)):
                        got[el] = float(H.bf16_bits_to_f32(bits))
                        seen[el] += 1
        assert (seen == 1).all()
        np.testing.assert_array_equal(got, want[bi])


def test_xpack_is_bf16_pairs_i_and_i_plus_16():
    """xpack's word 16b + i of a column = (x[32b + i], x[32b + 16 + i]) as bf16 (torch's rounding),
    low half first: the B operand order of the foldp kernel."""
    x = torch.randn(3, 96) * 10
    w = H.xpack(x).numpy().view(np.uint32).reshape(3, 3, 16)
    xb = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(3, 3, 2, 16)
    np.testing.assert_array_equal(w & 0xFFFF, xb[:, :, 0])
    np.testing.assert_array_equal(w >> 16, xb[:, :, 1])


def test_bf16_round_is_torch_bfloat16():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 10 ** rng.uniform(-8, 8, 4096),
                        np.float32([0.0, -0.0, 1.0, 1.00390625, 1.0078125, 3.0e38, -2.5e-39])])
    x = x.astype(np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy()
    np.testing.assert_array_equal(H.bf16_round(x), want)


def test_reference_is_dequantized_weights_times_bf16_x():
    blocks = _blocks(2 * 3, 5, (1e-3, 1e-2))          # 3 rows of 512 weights
    w = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.IQ4_XS).reshape(3, 512)
    x = np.random.default_rng(1).standard_normal((4, 512)).astype(np.float32)
    xb = torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy()
    np.testing.assert_allclose(H.gemv_mmh_ref(x, blocks.reshape(-1), 3), xb @ w.T.astype(np.float64),
                               rtol=1e-12, atol=1e-12)


def test_bad_operands_are_refused_before_any_launch():
    w = torch.zeros(4 * 2 * H.BB, dtype=torch.uint8)            # 4 rows of 512
    x = torch.zeros(2, 512)
    out = torch.zeros(2, 4)
    cases = [
        (dict(qtype=13), "not supported"),
        (dict(x=torch.zeros(2, 512, dtype=torch.float16)), "fp32"),
        (dict(x=torch.zeros(9, 512), out=torch.zeros(9, 4)), "columns"),
        (dict(x=torch.zeros(0, 512), out=torch.zeros(0, 4)), "columns"),
        (dict(w=torch.zeros(3 * 2 * H.BB, dtype=torch.uint8)), "do not hold"),
        (dict(x=torch.zeros(2, 500)), "do not hold"),
        (dict(out=torch.zeros(2, 5)), "out must be"),
        (dict(rt=3), "rt 3"),
        (dict(kind="lut"), "kind 'lut'"),
        (dict(kind="foldp"), "packed x"),                         # fp32 x where pairs belong
    ]
    for kw, msg in cases:
        args = dict(x=x, w=w, qtype=IQ4_XS, n_out=4, out=out)
        args.update(kw)
        extra = {k: args.pop(k) for k in ("rt", "kind") if k in args}
        with pytest.raises(ValueError, match=msg):
            H.gemv_mmh(args["x"], args["w"], args["qtype"], args["n_out"], args["out"], **extra)


def test_route_only_iq4_xs_wide_matrices_4_to_8_columns(monkeypatch):
    monkeypatch.setattr(H, "available", lambda: True)
    monkeypatch.setattr(gemv_mma, "capable", lambda dev: True)
    monkeypatch.delenv("TIGHTFIT_GEMV_MMH", raising=False)
    ffn = 5120 * 17408
    assert R.mmh_routed(IQ4_XS, 5, FakeCuda, ffn)              # the verify block's FFN at M = 5
    assert R.mmh_routed(IQ4_XS, 4, FakeCuda, 5120 * 10240)
    assert not R.mmh_routed(IQ4_XS, 3, FakeCuda, ffn)          # N = 3 only ties gemv_cuda
    assert not R.mmh_routed(IQ4_XS, 1, FakeCuda, ffn)          # the decode step: gemv_cuda
    assert not R.mmh_routed(IQ4_XS, 9, FakeCuda, ffn)          # past the kernel's 8 columns
    assert not R.mmh_routed(IQ4_XS, 5, FakeCuda, 5120 * 6144)  # measured slower there
    assert R.mmh_routed(IQ4_XS, 5, FakeCuda, 5120 * 6144, packed=True)   # foldp: faster there
    assert not R.mmh_routed(IQ4_XS, 5, FakeCuda, 5120 * 1024, packed=True)
    assert not R.mmh_routed(IQ4_XS, 5, FakeCuda, None)
    assert not R.mmh_routed(13, 5, FakeCuda, ffn)              # Q5_K: no table decoder
    assert not R.mmh_routed(IQ4_XS, 5, torch.zeros(16, dtype=torch.uint8), ffn)   # CPU
    for off in ("0", "off", ""):
        monkeypatch.setenv("TIGHTFIT_GEMV_MMH", off)
        assert not R.mmh_routed(IQ4_XS, 5, FakeCuda, ffn)
    monkeypatch.setenv("TIGHTFIT_GEMV_MMH", "1")
    monkeypatch.setattr(gemv_mma, "capable", lambda dev: False)  # no bf16 mma.sync below sm_80
    assert not R.mmh_routed(IQ4_XS, 5, FakeCuda, ffn)


def test_mmh_input_wants_contiguous_aligned_fp32():
    x = torch.zeros(5, 512)
    assert R.mmh_input(x)
    assert not R.mmh_input(None)
    assert not R.mmh_input(x.half())
    assert not R.mmh_input(x.t())
    assert not R.mmh_input(x.view(-1)[1:257].view(1, 256))      # 4-byte offset
    assert not R.mmh_input(x[None])
