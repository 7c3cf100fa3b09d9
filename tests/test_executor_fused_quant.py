"""Fused activation quantization in the decode step (on by default, TIGHTFIT_FUSE_QUANT=0 turns it off): the
add+RMSNorm, SwiGLU and gated-RMSNorm kernels write the int8 GEMV input themselves and the
executor skips the separate quantize launch. The quantized bytes are the same as quantize-after
(tests/test_kernels_fused_quant.py), so the step's logits must be IDENTICAL with the switch on and
off. Run interpreted (TRITON_INTERPRET=1) with TIGHTFIT_GEMV=v1, where the K-quants / Q8_0 use
the v1 natural layout 0 and IQ4_XS layout 1 (on the device the CUDA GEMV's layout 200 shares
layout 0's buffers). The interpreted v1 GEMV takes ~1.4 s per 64 rows, so the GEMV is replaced
by a torch one that reads every byte of the prepared activation (q in its layout order, d, s16):
logits are identical iff the fused and unfused int8 copies are."""
from __future__ import annotations

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.api import open_model  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402

# interpreter-only tests follow how the kernels were built (possibly by an earlier test
# module), not the environment now
INTERP = _interp.interpreted("tightfit.kernels.gemv", "tightfit.kernels.norm",
                             "tightfit.kernels.attn_decode", "tightfit.kernels.gdn",
                             "tightfit.kernels.embed", "tightfit.kernels.quantize_act")

pytestmark = pytest.mark.skipif(not INTERP, reason="needs TRITON_INTERPRET=1")


def _count_quants(monkeypatch):
    import tightfit.kernels.gemv_route as route
    calls = []
    real = route.quantize_into
    monkeypatch.setattr(route, "quantize_into",
                        lambda x, lay, act: calls.append(lay) or real(x, lay, act))
    return calls


def _fast_gemv(monkeypatch):
    """gemv_route.gemv_act -> torch: x from (q, d) in natural order; s16 checked against q."""
    import tightfit.kernels.gemv_route as route
    from tightfit.kernels.quantize_act import LAYOUTS, QuantAct
    from tightfit.quant.dequant import dequantize
    cache = {}

    def gemv_act(act, w, qtype, n_out, out, workspace=None):
        assert isinstance(act, QuantAct)
        k = act.k
        key = (w.data_ptr(), int(qtype), int(n_out))
        if key not in cache:
            cache[key] = torch.from_numpy(np.ascontiguousarray(dequantize(
                w.cpu().numpy(), int(qtype), (int(n_out), k)), np.float32)).double()
        pos = torch.from_numpy(np.argsort(LAYOUTS[act.layout])).long()   # element -> position
        q = act.q.reshape(-1, 32).double()[:, pos]
        # s16 must be the q sums per natural 16 (what the offset / min formats read)
        assert torch.equal(act.s16.reshape(-1).double(), q.reshape(-1, 16).sum(1))
        x = (q * act.d.reshape(-1, 1).double()).reshape(1, k)
        out.copy_((x @ cache[key].T).float())
        return out
    monkeypatch.setattr(route, "gemv_act", gemv_act)


def _run(mf, monkeypatch, fuse: str, toks, **kw):
    from tightfit.model.executor import GPUModel
    if fuse is None:
        monkeypatch.delenv("TIGHTFIT_FUSE_QUANT", raising=False)    # the default
    else:
        monkeypatch.setenv("TIGHTFIT_FUSE_QUANT", fuse)
    _fast_gemv(monkeypatch)
    exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=48, use_triton=True, **kw)
    assert exe.fuse_quant == (fuse != "0")
    calls = _count_quants(monkeypatch)
    st = exe.new_state(48)
    out = torch.cat([exe.forward([t], st, logits="all").detach().cpu().clone() for t in toks])
    return exe, out, list(calls)   # a copy: later runs wrap this counter again


@pytest.mark.parametrize("qtype,layout", [("Q4_K", 0), ("IQ4_XS", 1)])
def test_logits_identical_fused_and_unfused(tmp_path, monkeypatch, qtype, layout):
    monkeypatch.setenv("TIGHTFIT_GEMV", "v1")
    p = tmp_path / f"small-{qtype}.gguf"
    make_model(p, preset="small", qtype=qtype, layers=4, seed=5)
    toks = [5, 300, 17]
    with open_model(p) as mf:
        c = mf.config
        exe0, a, calls0 = _run(mf, monkeypatch, "0", toks)
        exe1, b, calls1 = _run(mf, monkeypatch, "1", toks)
        assert exe1.lin["blk.0.ffn_down.weight"].layout == layout
        assert torch.equal(a, b), (a - b).abs().max()
        # per token unfused: attn_norm + post norm + swiglu per layer, gated norm per GDN layer,
        # attention output per attention layer, the final norm (head); fused: only the
        # attention outputs remain
        n_attn = sum(not c.is_recurrent(i) for i in range(c.n_layer))
        n_gdn = c.n_layer - n_attn
        assert len(calls0) == len(toks) * (3 * c.n_layer + n_gdn + n_attn + 1)
        assert len(calls1) == len(toks) * n_attn
        assert set(calls0) == set(calls1) == {layout}
        # and the logits are still right (the CPU reference is the outside oracle)
        ref = ReferenceModel.from_model_file(mf)
        r = np.asarray(ref.forward(toks, ref.new_state(48), logits="all"), np.float64)
        rel = np.abs(b.numpy() - r).max() / np.abs(r).max()
        assert np.isfinite(b.numpy()).all() and rel < 0.05, rel


def test_mixed_types_and_float_consumers(tmp_path, monkeypatch):
    """Matrices of other kinds next to the fused ones: F32 ffn_down (reads the float h, so no
    quantized copy of h is made at all), F16 attn_gate next to Q8_0 attn_qkv, and IQ4_XS
    (layout 1) ffn_gate next to Q4_K (layout 0) ffn_up: one layout fused, the other quantized
    after."""
    monkeypatch.setenv("TIGHTFIT_GEMV", "v1")
    p = tmp_path / "small-mix.gguf"
    make_model(p, preset="small", qtype="Q6_K", layers=4, seed=9,
               mix={r"blk\.\d+\.ffn_down\.weight": "F32", r"blk\.\d+\.attn_qkv\.weight": "Q8_0",
                    r"blk\.\d+\.attn_gate\.weight": "F16",
                    r"blk\.\d+\.ffn_gate\.weight": "IQ4_XS",
                    r"blk\.\d+\.ffn_up\.weight": "Q4_K"})
    toks = [9, 41]
    with open_model(p) as mf:
        exe0, a, calls0 = _run(mf, monkeypatch, "0", toks)
        exe1, b, calls1 = _run(mf, monkeypatch, None, toks)
        assert exe1.lin["blk.0.ffn_down.weight"].kind == "float"
        assert exe1.lin["blk.0.attn_gate.weight"].kind == "float"
        assert exe1.lin["blk.0.ffn_gate.weight"].layout == 1
        assert exe1.lin["blk.0.ffn_up.weight"].layout == 0
        assert torch.equal(a, b), (a - b).abs().max()
        c = exe1.config
        n_attn = sum(not c.is_recurrent(i) for i in range(c.n_layer))
        # unfused per token: 2 layouts of the FFN input, no h, the others once; fused: the
        # FFN input's second layout and the attention outputs
        assert len(calls0) == len(toks) * (2 * c.n_layer + c.n_layer + (c.n_layer - n_attn)
                                           + n_attn + 1)
        assert len(calls1) == len(toks) * (c.n_layer + n_attn)


def test_placed_split_rows_identical(tmp_path, monkeypatch):
    """With a plan: the planned int8 buffers are written by the producers; FFN rows split between
    the GPU prefix (quantized GEMV on the fused copy) and the host suffix (float x)."""
    from tightfit.model.placed import replace_host_rows
    from tightfit.plan.budget import PlanOptions, plan_model
    from tightfit.plan.placement import inventory_from_gguf
    monkeypatch.setenv("TIGHTFIT_GEMV", "v1")
    p = tmp_path / "small-q8.gguf"
    make_model(p, preset="small", qtype="Q8_0", layers=4, seed=3)
    inv = inventory_from_gguf(p)
    full = plan_model(inv, PlanOptions(ctx=48, available=1 << 34, reserve=0, prefill_chunk=16,
                                       host_embd="no"))
    plan = replace_host_rows(full, {"blk.1.ffn_gate.weight": 256, "blk.1.ffn_up.weight": 256,
                                    "blk.2.ffn_down.weight": 128}, host_embd=True)
    toks = [7, 8]
    with open_model(p) as mf:
        kw = dict(plan=plan, progress=False, batched=False)
        exe0, a, calls0 = _run(mf, monkeypatch, "0", toks, **kw)
        exe1, b, calls1 = _run(mf, monkeypatch, "1", toks, **kw)
        assert exe1.hostw and exe1.lin["blk.1.ffn_up.weight"].kind == "quant"
        assert torch.equal(a, b), (a - b).abs().max()
        assert len(calls1) < len(calls0)
