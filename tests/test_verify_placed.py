"""Speculative verify blocks on a placed model (issue 10): with a plan made for blocks of up to
`batch` tokens (PlanOptions.batch, `serve --vram ... --spec` asks for draft_max + 1) the captured
verify block carves its buffers from the plan's `verify` region of the arena, one formula with
the runtime (verify_graph.verify_buffers); without it a placed model keeps the eager block.
On the device the eager placed block measured 180-330 ms per round against 14 ms for the graph
(session 16 call 8), which is why the region is planned. Here (CPU) the graph's pass runs eagerly
on the same buffers (TIGHTFIT_VERIFY_GRAPH=1 behaviour) and is compared with the eager block."""
from __future__ import annotations

import numpy as np
import pytest

from tightfit.api import open_model
from tightfit.model.generate import make_model
from tightfit.plan.budget import PlanOptions, plan_model
from tightfit.plan.placement import inventory_from_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("vp") / "tiny-f32.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=7)
    return p


def _plan(path, batch, ctx=128):
    inv = inventory_from_gguf(path)
    return plan_model(inv, PlanOptions(ctx=ctx, available=1 << 32, reserve=0, prefill_chunk=16,
                                       host_embd="no", batch=batch))


def test_the_verify_line_is_the_runtime_buffer_list(tiny):
    from tightfit.model.verify_graph import verify_buffers
    from tightfit.plan.buffers import pack
    plan = _plan(tiny, 5)
    line = plan.line("verify")
    cfg = plan.inventory.config
    n_rec = len(cfg.recurrent_ids)
    # the recurrent replay inputs, by hand: n_gdn x (batch - 1) x Hv x (k, delta, decay) x fp32
    assert line.details["ssm_replay"] == n_rec * 4 * cfg.ssm_v_heads * (2 * cfg.ssm_state + 1) * 4
    assert line.details["logits"] == 5 * cfg.n_vocab * 4
    bufs = verify_buffers(cfg, 5, 128, plan.options.attn_chunk, {})   # F32 model: no int8 inputs
    assert line.bytes == sum(b.nbytes for b in bufs) and line.region_bytes == pack(bufs)[1]
    regions = {name: n for name, _, n in plan.layout()}
    assert regions["verify"] == line.region_bytes
    assert "verify" not in {l.key for l in _plan(tiny, 1).lines}     # no speculation: no line
    assert _plan(tiny, 9).line("verify").bytes > line.bytes


def _exe(path, plan):
    from tightfit.model.executor import GPUModel
    mf = open_model(str(path))
    return mf, GPUModel.from_model_file(mf, device="cpu", use_triton=False, plan=plan)


def test_a_placed_model_verifies_in_its_planned_region(tiny):
    from tightfit.model import verify_graph as VG
    plan = _plan(tiny, 4)
    mf, exe = _exe(tiny, plan)
    try:
        assert VG.planned_tokens(exe) == 4
        st = exe.new_state()
        ids = np.random.default_rng(1).integers(0, mf.config.n_vocab, 12).tolist()
        exe.forward(ids, st, logits="none")
        bf = exe.batcher()
        snap = st.snapshot()
        bf.use_verify_graph = False
        e = exe.forward_block([3, 5, 7], st)
        want = e.logits.detach().clone()
        st.restore(snap)
        bf.use_verify_graph = True
        g = exe.forward_block([3, 5, 7], st)
        vg = bf._vg
        assert vg is not None and vg.m_max == 4                   # the planned size, once
        arena = exe.placed.arena
        off, n = arena.regions["verify"]
        base = arena.buffer.data_ptr() + off
        assert base <= vg.region.data_ptr() < base + n            # a view of the arena
        got = g.logits.detach()
        err = float((got - want).abs().max())
        assert err <= 1e-4 * float(want.abs().max()), err
        g.commit(2)
        assert st.pos == 14
        # more tokens than the plan priced: the eager block, not a bigger graph
        st2 = exe.new_state()
        exe.forward(ids, st2, logits="none")
        assert bf.verify_graph(5, st2) is None and bf._vg is vg
    finally:
        mf.close()


def test_the_block_verifier_drafts_within_the_plan(tiny):
    from tightfit.runtime.spec.verify import BlockVerifier
    mf, exe = _exe(tiny, _plan(tiny, 4))
    try:
        assert BlockVerifier(exe).max_draft == 3
    finally:
        mf.close()
    mf, exe = _exe(tiny, _plan(tiny, 1))
    try:
        assert BlockVerifier(exe).max_draft == 15         # no region: the eager block, as before
    finally:
        mf.close()


def test_speculation_on_a_plan_without_a_verify_region_warns(tiny):
    """Without the region a placed model's blocks run eagerly: slower than plain decoding and
    beside the plan's memory (session 18: the placed 27B 0.6x, +36 MiB over total - reserve).
    The user is told how to plan it; with the region there is nothing to say."""
    import warnings
    from types import SimpleNamespace
    from tightfit.model.verify_graph import unplanned_verify
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    for batch, warns in ((1, True), (4, False)):
        mf, exe = _exe(tiny, _plan(tiny, batch))
        try:
            assert unplanned_verify(exe) is warns
            eng = SimpleNamespace(model=exe, config=mf.config, file=mf)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                SpeculativeEngine(eng, SpecConfig(drafters=("ngram",)))
            msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
            assert any("no verify region" in m and "batch" in m for m in msgs) is warns, msgs
        finally:
            mf.close()
    mf, exe = _exe(tiny, None)                 # not placed: its blocks are torch's, no plan
    try:
        assert not unplanned_verify(exe)
    finally:
        mf.close()


def test_speculation_never_moves_weights_to_the_host(tiny):
    """A budget that holds the model whole but not the captured block beside it: the plan keeps
    every weight on the GPU and prices a smaller block (9 -> 5 -> 3 tokens), or none."""
    inv = inventory_from_gguf(tiny)

    def plan(batch, available):
        return plan_model(inv, PlanOptions(ctx=128, available=available, reserve=0,
                                           prefill_chunk=16, host_embd="no", batch=batch))
    base = plan(1, 1 << 32)
    at3 = plan(3, 1 << 32)
    got = plan(9, at3.total_bytes)                  # room for a 3-token block, not a 5-token one
    assert got.fits and got.placement.host_bytes == 0
    assert got.options.batch == 3 and got.line("verify").details["tokens"] == 3
    assert any("priced for 3 tokens, not 9" in n for n in got.notes)
    none = plan(9, base.total_bytes)                # room for the model alone
    assert none.fits and none.placement.host_bytes == 0 and none.options.batch == 1
    assert "verify" not in {l.key for l in none.lines}
    assert any("no captured verify block" in n for n in none.notes)
    wide = plan(40, 1 << 32)                        # past 16 tokens blocks are never captured
    assert wide.line("verify").details["tokens"] == 16
    short = plan(9, 1 << 16)                        # nothing fits: the refusal is the model's own
    assert not short.fits and short.options.batch == 1
    assert short.total_bytes == plan(1, 1 << 16).total_bytes
