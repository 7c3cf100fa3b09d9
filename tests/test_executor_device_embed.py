"""Issue 7: the step reads its token id from the device buffer `tok_id` and embeds it on the device
(tightfit.kernels.embed inside the step), so a greedy loop feeds the sampled id back without the
host; the host-row path stays as the fallback. Run on the CPU: the two embedding paths must give
identical logits, and greedy ids equal the CPU ReferenceModel's (the outside oracle)."""
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
                             "tightfit.kernels.embed")

CTX = 48


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("emb") / "tiny-f32.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=7)
    mf = open_model(p)
    yield mf
    mf.close()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("emb") / "small-q8.gguf"
    make_model(p, preset="small", layers=4, qtype="Q8_0", seed=3)
    mf = open_model(p)
    yield mf
    mf.close()


def _exe(mf, **kw):
    from tightfit.model.executor import GPUModel
    kw.setdefault("use_triton", False)
    return GPUModel.from_model_file(mf, device="cpu", n_ctx=CTX, batched=False, **kw)


def _placed(mf, **kw):
    from tightfit.plan.budget import PlanOptions, plan_model
    from tightfit.plan.placement import inventory_from_gguf
    plan = plan_model(inventory_from_gguf(mf.path),
                      PlanOptions(ctx=CTX, available=1 << 34, reserve=0, prefill_chunk=16,
                                  host_embd="no"))
    return _exe(mf, plan=plan, progress=False, **kw)


def _same_logits(a, b, toks):
    sa, sb = a.new_state(CTX), b.new_state(CTX)
    la, lb = a.forward(toks, sa, logits="all"), b.forward(toks, sb, logits="all")
    assert torch.equal(la, lb)


@pytest.mark.parametrize("which", ["legacy-f32", "placed-q8_0"])
def test_device_and_host_embedding_give_identical_logits(tiny, small, which):
    mf, make = (tiny, _exe) if which == "legacy-f32" else (small, _placed)
    dev, host = make(mf, device_embed=True), make(mf, device_embed=False)
    assert dev.device_embedding and not host.device_embedding
    toks = np.random.default_rng(0).integers(0, mf.config.n_vocab, 6).tolist()
    _same_logits(dev, host, toks)
    # the device path embeds whatever tok_id holds, inside the step
    st = dev.new_state(CTX)
    dev.tok_id.fill_(toks[0])
    dev.step_token(None, st)
    st.sync()
    ref = host.forward(toks[:1], host.new_state(CTX), logits="last")
    assert torch.equal(dev.logits, ref)


def test_greedy_fed_on_device_matches_reference(tiny, monkeypatch):
    """Greedy decode with the argmax fed back through tok_id (ring of 4 ids: read back in three
    rounds) = host argmax = the CPU ReferenceModel."""
    import tightfit.plan.buffers as B
    monkeypatch.setattr(B, "IDS_RING", 4)
    dev = _exe(tiny, device_embed=True)
    assert dev.ids_ring.numel() == 4
    host = _exe(tiny, device_embed=False)
    got = dev.greedy(3, dev.new_state(CTX), 10)
    assert got == host.greedy(3, host.new_state(CTX), 10)
    ref = ReferenceModel.from_model_file(tiny)
    rs, want, t = ref.new_state(CTX), [], 3
    for _ in range(10):
        t = int(ref.forward([t], rs, logits="last").argmax())
        want.append(t)
    assert got == want


def test_triton_interpreter_embed_and_argmax(tiny):
    """The Triton embedding + two-stage argmax kernels (interpreted) in the step."""
    if not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    dev = _exe(tiny, device_embed=True, use_triton=True)
    host = _exe(tiny, device_embed=False, use_triton=True)
    assert dev.device_embedding
    _same_logits(dev, host, [5, 6, 7])
    got = dev.greedy(5, dev.new_state(CTX), 3)
    assert got == host.greedy(5, host.new_state(CTX), 3)
    assert dev.argmax_val.numel() == -(-tiny.config.n_vocab // 4096)


def test_host_rows_fallback_for_types_without_device_kernel(tmp_path):
    """A Q8_0 table with n_embd = 64 (not whole 256-chunks) has no capturable embedding kernel
    in tightfit.kernels.embed: host rows, same greedy ids."""
    p = tmp_path / "tiny-q8.gguf"
    make_model(p, preset="tiny", qtype="Q8_0", seed=3)
    with open_model(p) as mf:
        assert int(mf.gguf.tensors["token_embd.weight"].qtype) == 8 and mf.config.n_embd % 256
        exe = _exe(mf, device_embed=True)
        assert not exe.device_embedding
        ref = ReferenceModel.from_model_file(mf)
        rs, want, t = ref.new_state(CTX), [], 1
        for _ in range(3):
            t = int(ref.forward([t], rs, logits="last").argmax())
            want.append(t)
        assert exe.greedy(1, exe.new_state(CTX), 3) == want
        from tightfit.errors import UserError
        with pytest.raises(UserError):
            exe.step_token(None, exe.new_state(CTX))
