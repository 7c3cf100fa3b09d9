"""gemv_route's CUDA layout (200) on the CPU: routing switch, buffers, make_act; CI has no CUDA,
so the default routing must be unchanged there."""
from __future__ import annotations

import os  # noqa: E402
import torch  # noqa: E402

# Triton decides interpreter mode when a @triton.jit module is imported, and modules are imported
# once per test session: without a GPU they must come in interpreted, as every kernel test expects
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tightfit.kernels import gemv_route as gr  # noqa: E402
from tightfit.kernels.quantize_act import QuantAct  # noqa: E402


def test_no_cuda_no_change(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for t in (8, 2, 6, 20, 23, 12, 13, 14):
        assert gr.act_layout(t) != gr.CUDA_LAYOUT
        assert not gr.cuda_routed(t)


@pytest.mark.parametrize("mode", ["triton", "v1"])
def test_env_forces_triton(monkeypatch, mode):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TIGHTFIT_GEMV", mode)
    assert not gr.cuda_routed(12)
    assert gr.act_layout(12) != gr.CUDA_LAYOUT


def test_cuda_layout_buffers(monkeypatch):
    monkeypatch.setattr(gr, "cuda_routed", lambda t: int(t) in (12, 14, 2))
    lay = gr.act_layout(12)
    assert lay == gr.CUDA_LAYOUT and not gr.is_small(lay) and gr.is_cuda(lay)
    assert gr.act_layout(10) != gr.CUDA_LAYOUT
    assert gr.split_floats(12, 5120, 17408) == 0
    specs = gr.act_buffers(lay, 5120)
    assert specs == gr.act_buffers(0, 5120)
    dt = {"i8": torch.int8, "f32": torch.float32, "i32": torch.int32}
    m = 4
    bufs = {s: torch.zeros((m,) + tuple(sh[1:]), dtype=dt[d]) for s, sh, d in specs}
    a = gr.make_act(lay, bufs, m, 5120)
    assert isinstance(a, QuantAct) and a.layout == 0 and (a.n, a.k) == (m, 5120)
    assert a.q.shape == (m, 5120) and a.d.shape == (m, 160) and a.s16.shape == (m, 320)
    a1 = gr.new_act(lay, 1, 512, "cpu")
    assert isinstance(a1, QuantAct) and a1.layout == 0


def test_compile_failure_routes_to_triton_with_a_warning(monkeypatch):
    """A CUDA GEMV module that does not compile (old driver, broken NVRTC) must not fail the
    first decode step: the type falls back to the Triton layout, with a RuntimeWarning."""
    from tightfit.kernels import gemv_cuda as gc
    calls = []

    def boom(qtype, *a, **k):
        calls.append(qtype)
        raise RuntimeError("nvrtc: error: invalid value for --gpu-architecture")
    monkeypatch.setattr(gc, "available", lambda: True)
    monkeypatch.setattr(gc, "prepare", boom)
    monkeypatch.setattr(gr, "_COMPILED", {})
    with pytest.warns(RuntimeWarning, match="using the Triton kernels"):
        assert not gr.cuda_routed(12)
    assert gr.act_layout(12) != gr.CUDA_LAYOUT       # the Triton routing
    assert calls == [12]                             # compiled once, the verdict cached
    monkeypatch.setattr(gc, "prepare", lambda qtype, *a, **k: None)
    monkeypatch.setattr(gr, "_COMPILED", {})
    assert gr.cuda_routed(12) and gr.act_layout(12) == gr.CUDA_LAYOUT
