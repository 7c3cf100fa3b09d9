"""The bf16 byte-table GEMV (tightfit.kernels.gemv_mmh) on the device, against gguf-py's
dequantization + float64 products of the bf16-rounded x (gemv_mmh_ref) on sampled rows plus the
last ones (the partial 16-row tile), at N = 1..8, with normal and fp16-subnormal block scales, for
both kernels ("table": exact codes; "foldp": packed x, the group scale folded into bf16 weights,
whose rounding the reference models) at both row-tile counts; repeatable bitwise, in a
CUDA graph too; and routed by gemv_cuda_direct where gemv_route says. Skipped without CUDA / cupy.

Bound: 1e-5 relative (the products of bf16 operands are exact in fp32; what is left is fp32
summation order)."""
from __future__ import annotations

import _interp

_interp.interpret_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)   # device-only module
pytest.importorskip("cupy")

from tightfit.kernels import gemv_mmh as H  # noqa: E402
from tightfit.kernels import gemv_route as R  # noqa: E402
from _gpu_blocks import capture, rand_weights  # noqa: E402

pytestmark = [pytest.mark.gpu]
IQ4_XS = 23
SHAPES = [(256, 16), (512, 40), (2304, 300), (5120, 1024), (17408, 5120), (5120, 17408)]
KERNELS = [dict(rt=1), dict(rt=2), dict(rt=1, kind="foldp"), dict(rt=2, kind="foldp")]


def _check(n_in, n_out, n, kw, scale, seed=0):
    w = rand_weights(IQ4_XS, n_out, n_in, seed, scale=scale)
    x = torch.randn(n, n_in, device="cuda") * 3
    out = torch.full((n, n_out), float("nan"), device="cuda")
    xk = H.xpack(x) if kw.get("kind") == "foldp" else x
    y = H.gemv_mmh(xk, w, IQ4_XS, n_out, out, **kw)
    assert not torch.isnan(y).any(), "unwritten outputs"
    rng = np.random.default_rng(seed)
    sel = np.unique(np.concatenate([rng.choice(n_out, min(48, n_out), replace=False),
                                    np.arange(max(0, n_out - 17), n_out)]))
    rows = w.view(n_out, -1)[torch.from_numpy(sel).cuda()].cpu().numpy()
    ref = H.gemv_mmh_ref(x.cpu().numpy(), rows, len(sel), kw.get("kind", H.DEFAULT_KIND))
    got = y.cpu().numpy()[:, sel]
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-5, f"{n_in}->{n_out} N={n} {kw} {scale}: {err:.2e}"
    again = H.gemv_mmh(xk, w, IQ4_XS, n_out, torch.full_like(out, float("nan")), **kw)
    assert torch.equal(again, y), "not bitwise repeatable"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kw", KERNELS, ids=lambda k: ",".join(f"{a}{b}" for a, b in k.items()))
def test_against_reference(shape, kw):
    for n in (1, 2, 3, 5, 8):
        _check(*shape, n, kw, (1e-3, 1e-2))
    _check(*shape, 5, kw, (3e-6, 5e-5), seed=1)


def test_fixup_counters_rest_at_zero_and_graph_replay_is_bitwise():
    from tightfit.kernels import gemv_mma
    n_in, n_out, n = 5120, 1024, 5
    w = rand_weights(IQ4_XS, n_out, n_in, 4)
    x = torch.randn(n, n_in, device="cuda")
    out = torch.empty(n, n_out, device="cuda")
    eager = H.gemv_mmh(x, w, IQ4_XS, n_out, out).clone()
    assert int(gemv_mma.fixup_counters().abs().sum()) == 0
    g = capture(lambda: H.gemv_mmh(x, w, IQ4_XS, n_out, out))
    for _ in range(2):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    assert int(gemv_mma.fixup_counters().abs().sum()) == 0


def test_gemv_cuda_direct_routes_wide_iq4_xs_blocks(monkeypatch):
    """A 5-token IQ4_XS product on a 5120 -> 10240 matrix goes to gemv_mmh (bitwise its output),
    and with TIGHTFIT_GEMV_MMH=0 to the int8 path, which agrees to its activation rounding."""
    n_in, n_out = 5120, 10240
    w = rand_weights(IQ4_XS, n_out, n_in, 6)
    x = torch.randn(5, n_in, device="cuda")
    monkeypatch.setenv("TIGHTFIT_GEMV_MMH", "1")
    assert R.mmh_routed(IQ4_XS, 5, w, n_in * n_out)
    y = R.gemv_cuda_direct(x, w, IQ4_XS, n_out)
    assert torch.equal(y, H.gemv_mmh(x, w, IQ4_XS, n_out, torch.empty_like(y)))
    monkeypatch.setenv("TIGHTFIT_GEMV_MMH", "0")
    y0 = R.gemv_cuda_direct(x, w, IQ4_XS, n_out)
    rel = float((y0 - y).norm() / y.norm())
    assert 0 < rel < 2e-2, rel
