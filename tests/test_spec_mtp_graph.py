"""The MTP drafter over a GPU executor that holds the block (GPUModel(mtp=True), what a plan made
with MTP gives): its raw matrices through the executor's GEMV dispatcher (no dequantized copy),
the planned fixed-capacity KV cache shared by every drafter, and the one-token steps that
tightfit.runtime.spec.mtp_graph captures on CUDA (run eagerly here, on the same static buffers).
Checked against the float64 NumPy MTP graph on gguf-py weights, against the eager forward, and
through speculation (greedy output identical to plain decoding)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tightfit.runtime.sampler import GREEDY
from test_spec_mtp import N_CTX, head_error


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    from tightfit.model.generate import make_model
    p = tmp_path_factory.mktemp("mtpg") / "tiny-mtp-q8.gguf"
    make_model(p, preset="tiny", qtype="Q8_0", mtp=True, vocab="small:2048", seed=5)
    return p


def _engine(path, n_ctx=N_CTX, **kw):
    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.runtime.engine import Engine
    from tightfit.tokenizer import from_gguf
    mf = open_model(str(path))
    exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=n_ctx, use_triton=False, **kw)
    return Engine(mf, exe, from_gguf(mf.gguf.metadata), n_ctx=n_ctx), mf


@pytest.fixture(scope="module")
def held(mtp_path):
    """The executor holds the MTP block and embeds on the device (here: the CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng, mf = _engine(mtp_path, mtp=True, device_embed=True)
    yield eng
    torch.set_num_threads(threads)
    mf.close()


def _head(eng):
    from tightfit.runtime.spec.mtp import MTPHead
    head = MTPHead.on_gpu_model(eng.model, eng.file)
    if head.embed_dev is None:
        # the tiny model's Q8_0 table of 64-wide rows has no device embedding kernel (n_embd %
        # 256); on the CPU the host lookup stands in for it, the graph bodies being eager here
        head.embed_dev = head.embed_fn
    return head


def test_the_executor_holds_the_block_and_the_head_copies_nothing(held):
    cfg = held.config
    m = held.model
    shapes = cfg.block_tensor_shapes(cfg.n_layer)
    mats = [n for n in shapes if len(shapes[n]) == 2]
    assert m.has_mtp and all(n in m.lin for n in mats)
    head = _head(held)
    assert head.device_bytes == 0
    assert all(head.w[n] is m.lin[n] for n in mats)            # the executor's own matrices
    assert head.w[f"blk.{cfg.n_layer}.attn_norm.weight"] is m.vec[f"blk.{cfg.n_layer}.attn_norm.weight"]
    c = head.new_cache()
    assert c.fixed and c.capacity == N_CTX and head.new_cache() is c   # one planned cache
    from tightfit.plan.mtp import mtp_kv_bytes
    assert c.nbytes() == mtp_kv_bytes(cfg, N_CTX) == N_CTX * 2 * cfg.n_head_kv * cfg.head_dim * 2
    with pytest.raises(ValueError, match="capacity"):
        c.write(N_CTX - 1, torch.zeros(2, cfg.n_head_kv, cfg.head_dim),
                torch.zeros(2, cfg.n_head_kv, cfg.head_dim))
    # without mtp=True the executor leaves the block out (the plain step never reads it)
    plain, mf = _engine(held.file.path)
    try:
        assert not plain.model.has_mtp and not any(n in plain.model.lin for n in mats)
    finally:
        mf.close()


def test_raw_block_head_matches_independent_numpy(held, mtp_path):
    err = head_error(_head(held), held.config, mtp_path, seed=7)
    assert err < 1e-3, err


def test_static_step_matches_the_eager_forward(held):
    """step_pair (fixed shapes, attention over the whole capacity under a mask, K/V written at a
    device index) against forward over the same pairs: the same K/V rows and the same h'."""
    from tightfit.runtime.spec.mtp import MTPCache
    cfg = held.config
    head = _head(held)
    g = np.random.default_rng(3)
    n, base = 6, 40
    h = torch.tensor(g.normal(size=(n, cfg.n_embd)), dtype=torch.float32)
    toks = g.integers(0, cfg.n_vocab, n).tolist()
    a = MTPCache(head, 64, fixed=True)
    a.base = base
    _, want = head.forward(h, toks, a, 0, logits="none")
    b = MTPCache(head, 64, fixed=True)
    b.base = base
    for i in range(n):
        e = head.embed_dev(torch.tensor([toks[i]]))
        at, pos = torch.tensor([i]), torch.tensor([base + i])
        got = head.step_pair(e, h[i:i + 1], b, at, pos, full=(i == n - 1))
        assert (got is None) == (i < n - 1)
    # the same last pair through the executor's decode attention (T = status[2] + 1 rows)
    assert head.attn is not None
    status = torch.tensor([0, 0, n - 1, 0], dtype=torch.int32)
    got2 = head.step_pair(e, h[n - 1:n], b, at, pos, full=True, status=status)
    torch.testing.assert_close(got2, got, rtol=1e-4, atol=1e-4 * float(got.std()))
    torch.testing.assert_close(b.k[:n], a.k[:n], rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(b.v[:n], a.v[:n], rtol=2e-3, atol=2e-3)
    assert float(b.k[n:].abs().max()) == 0.0                 # nothing past the written rows
    scale = float(want.std())
    torch.testing.assert_close(got, want[-1:], rtol=1e-4, atol=1e-4 * scale)


def _rounds(drafter, h, toks, rounds, k):
    """Feed pairs in rounds of 1..3 tokens, drafting k after each; the drafts and n_true."""
    out, i = [], 0
    for r in range(rounds):
        n = 1 + r % 3
        drafter.observe(h[i:i + n], toks[i:i + n])
        i += n
        d = drafter.propose(k)
        out.append((None if d is None else list(d.tokens), drafter.n_true))
    return out


def test_graph_drafts_equal_eager_drafts(held, monkeypatch):
    """The step graph's greedy drafts (on-device argmax fed back as the next embedding) are the
    eager loop's, round after round, with the same KV bookkeeping."""
    from tightfit.runtime.spec.mtp import MTPDrafter
    cfg = held.config
    head = _head(held)
    g = np.random.default_rng(11)
    h = torch.tensor(g.normal(size=(40, cfg.n_embd)), dtype=torch.float32)
    toks = g.integers(0, cfg.n_vocab, 40).tolist()
    graph = head.step_graph()
    assert graph is not None and not graph.use_graphs            # eager on the CPU
    a = MTPDrafter(head, max_draft=4)
    got = _rounds(a, h, toks, 12, 4)
    assert graph.replays > 0
    rep = graph.replays
    monkeypatch.setattr(type(head), "step_graph", lambda self: None)
    b = MTPDrafter(head, max_draft=4)                             # claims the shared cache
    want = _rounds(b, h, toks, 12, 4)
    assert graph.replays == rep
    assert got == want and all(d is not None and len(d) == 4 for d, _ in got)


def test_many_pairs_take_one_batched_forward(held, monkeypatch):
    """A long prompt's first round: all but the last pair in one eager forward, then the graph."""
    from tightfit.runtime.spec.mtp import MTPDrafter
    cfg = held.config
    head = _head(held)
    g = np.random.default_rng(5)
    n = MTPDrafter.GRAPH_MAX_PAIRS + 9
    h = torch.tensor(g.normal(size=(n, cfg.n_embd)), dtype=torch.float32)
    toks = g.integers(0, cfg.n_vocab, n).tolist()
    a = MTPDrafter(head, max_draft=3)
    a.observe(h, toks)
    rep = head.step_graph().replays
    da = a.propose(3)
    assert head.step_graph().replays - rep == 3          # the last pair + 2 more drafts
    monkeypatch.setattr(type(head), "step_graph", lambda self: None)
    b = MTPDrafter(head, max_draft=3)
    b.observe(h, toks)
    assert b.propose(3).tokens == da.tokens and a.n_true == b.n_true == n


def test_a_drafter_whose_rows_were_overwritten_starts_again(held):
    from tightfit.runtime.spec.mtp import MTPDrafter
    cfg = held.config
    head = _head(held)
    h = torch.randn(12, cfg.n_embd)
    a = MTPDrafter(head, max_draft=2)
    a.observe(h[:5], [1, 2, 3, 4, 5])
    assert a.propose(2) is not None and a.n_true == 5 and a.n_pos == 5
    b = MTPDrafter(head, max_draft=2)
    b.observe(h[5:8], [6, 7, 8])
    b.propose(2)
    a.observe(h[8:10], [9, 10])
    d = a.propose(2)                          # a's five rows are b's now: a keeps its new pairs
    assert d is not None and len(d.tokens) == 2
    assert a.base == 5 and a.n_true == 2 and a.n_pos == 7 and head.new_cache().base == 5


def test_drafts_stop_at_the_planned_capacity(mtp_path):
    from tightfit.runtime.spec.mtp import MTPDrafter
    eng, mf = _engine(mtp_path, n_ctx=16, mtp=True, device_embed=True)
    try:
        head = _head(eng)
        cfg = eng.config
        h = torch.randn(16, cfg.n_embd)
        a = MTPDrafter(head, max_draft=4)
        a.observe(h[:12], list(range(12)))
        assert len(a.propose(4).tokens) == 4                 # rows 0..14: within 16
        a.observe(h[12:14], [1, 2])
        d = a.propose(4)                                     # rows 12.. : 3 drafts fit, not 4
        assert d is not None and len(d.tokens) == 3
        a.observe(h[14:16], [3, 4])
        assert len(a.propose(4).tokens) == 1                 # the last row of the cache
        a.observe(h[:1], [5])
        assert a.propose(4) is None                          # past the planned context
    finally:
        mf.close()


def test_greedy_speculation_with_the_held_block_is_plain_greedy(held):
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    built = SpeculativeEngine(held, SpecConfig(drafters=("mtp",), mtp_draft=3))
    assert built.mtp_head is not None and built.mtp_head.device_bytes == 0
    se = SpeculativeEngine(held, SpecConfig(drafters=("mtp",), mtp_draft=3), mtp_head=_head(held))
    for p in ([3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 7, 8, 8, 8, 9, 9, 9, 7, 7, 7]):
        a = list(held.generate(p, max_tokens=50, sampling=GREEDY))[-1]
        b = list(se.generate(p, max_tokens=50, sampling=GREEDY))[-1]
        assert b.tokens == a.tokens
    assert b.timings.as_dict()["drafters"]["mtp"]["draft_n"] > 0
    assert se.mtp_head.step_graph().replays > 0


def test_a_placed_model_without_mtp_in_its_plan_is_refused(held):
    from tightfit.errors import UserError
    from tightfit.runtime.spec.mtp import MTPHead

    class Placed:                      # all rows on the GPU, but the plan left the block out
        placed = object()
        lin = held.model.lin
        vec = held.model.vec
        hostw: dict = {}
        has_mtp = False
    with pytest.raises(UserError, match="not in this plan"):
        MTPHead.on_gpu_model(Placed(), held.file)


def test_a_plan_made_with_mtp_holds_the_block_in_its_arena(mtp_path):
    """The placed path: the plan (include_mtp) puts blk.<n_layer> in the arena; the executor takes
    it from there, the head adds nothing and drafts; speculation stays plain greedy."""
    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.plan.budget import PlanOptions, plan_model
    from tightfit.plan.placement import inventory_from_gguf
    from tightfit.runtime.engine import Engine
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    from tightfit.tokenizer import from_gguf
    inv = inventory_from_gguf(mtp_path)
    plan = plan_model(inv, PlanOptions(ctx=256, available=1 << 32, reserve=0, prefill_chunk=16,
                                       host_embd="no", include_mtp=True))
    assert plan.fits and any(l.key == "mtp" for l in plan.lines)
    mf = open_model(str(mtp_path))
    try:
        exe = GPUModel.from_model_file(mf, device="cpu", use_triton=False, plan=plan)
        cfg = mf.config
        L = f"blk.{cfg.n_layer}."
        assert exe.has_mtp and exe.placed is not None and L + "ffn_down.weight" in exe.lin
        assert not exe.lin[L + "ffn_down.weight"].whole          # a view of the arena
        eng = Engine(mf, exe, from_gguf(mf.gguf.metadata), n_ctx=256)
        se = SpeculativeEngine(eng, SpecConfig(drafters=("mtp",), mtp_draft=2))
        assert se.mtp_head is not None and se.mtp_head.device_bytes == 0
        assert se.mtp_head.new_cache().capacity == 256
        p = [5, 4, 3, 2, 1, 5, 4, 3]
        a = list(eng.generate(p, max_tokens=30, sampling=GREEDY))[-1]
        b = list(se.generate(p, max_tokens=30, sampling=GREEDY))[-1]
        assert b.tokens == a.tokens and b.timings.as_dict()["drafters"]["mtp"]["draft_n"] > 0
        with pytest.raises(Exception, match="MTP"):           # a plan without it: refused
            plain = plan_model(inv, PlanOptions(ctx=256, available=1 << 32, reserve=0,
                                                prefill_chunk=16, host_embd="no"))
            GPUModel.from_model_file(mf, device="cpu", use_triton=False, plan=plain, mtp=True)
    finally:
        mf.close()


def test_prefill_hidden_is_the_plain_prefill_with_its_hidden_rows(held):
    """GPUModel.prefill_hidden: the same state and last logits as forward(ids, 'last') (the
    prefill without MTP), and every token's normed hidden row handed over chunk by chunk; the
    rows are what the one-token step leaves in xn for the same tokens."""
    m = held.model
    cfg = held.config
    ids = list(np.random.default_rng(2).integers(0, cfg.n_vocab, 23))
    bf = m.batcher()
    old = bf.chunk
    bf.chunk = 8                                    # three chunks: 8, 8, 7
    try:
        a = m.new_state()
        want = m.forward(ids, a, logits="last")
        b = m.new_state()
        got_chunks = []
        got = m.prefill_hidden(ids, b, lambda rows, part: got_chunks.append((rows.clone(), part)))
    finally:
        bf.chunk = old
    assert torch.equal(got, want)
    assert [p for _, p in got_chunks] == [ids[:8], ids[8:16], ids[16:]]
    assert int(b.status[2]) == int(a.status[2]) == len(ids) and b.pos == a.pos
    rows = torch.cat([r for r, _ in got_chunks])
    c = m.new_state()
    steps = []
    for t in ids:
        m.forward([t], c, logits="last")
        steps.append(m.xn.detach().reshape(1, -1).clone())
    torch.testing.assert_close(rows, torch.cat(steps), rtol=2e-3, atol=2e-3 * float(rows.std()))


# ---- on the device: the captured graphs ---------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the captured graphs)")


@pytest.fixture(scope="module")
def small_cuda(tmp_path_factory):
    """Used only by @cuda tests (skipped before the fixture runs without a GPU)."""
    from tightfit.model.generate import make_model
    p = tmp_path_factory.mktemp("mtpg") / "small-mtp-q4k.gguf"
    # n_embd 256: the device embedding kernel and the CUDA GEMVs serve it; 4 layers hold one
    # attention layer
    make_model(p, preset="small", layers=4, qtype="Q4_K", mtp=True, seed=9, vocab="small:2048")
    eng, mf = _engine_cuda(p)
    yield eng
    mf.close()


def _engine_cuda(path, n_ctx=1024):
    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.runtime.engine import Engine
    from tightfit.tokenizer import from_gguf
    mf = open_model(str(path))
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=n_ctx, mtp=True, device_embed=True)
    return Engine(mf, exe, from_gguf(mf.gguf.metadata), n_ctx=n_ctx), mf


@cuda
def test_captured_drafts_equal_the_same_bodies_run_eagerly(small_cuda):
    """The captured kv / draft graphs against their bodies run eagerly on a second cache: the same
    kernels on the same shapes, so the drafts and the K/V rows are bitwise equal; the graphs'
    memory stays within what the plan prices (tightfit.plan.mtp.mtp_scratch_bytes)."""
    from tightfit.plan.mtp import mtp_scratch_bytes
    from tightfit.runtime.spec.mtp import MTPCache
    from tightfit.runtime.spec.mtp_graph import MTPStepGraph
    eng = small_cuda
    cfg = eng.config
    head = _head(eng)
    assert head.embed_dev is not None and head.device_bytes == 0
    head.new_cache()
    g = torch.Generator(device="cpu").manual_seed(4)
    h = torch.randn(30, cfg.n_embd, generator=g).cuda()
    toks = torch.randint(0, cfg.n_vocab, (30,), generator=g).tolist()
    # the bodies eagerly first: every lazy allocation (GEMV workspaces, modules) is made here
    ref = MTPStepGraph(head, MTPCache(head, head.cache_capacity, fixed=True))
    ref.use_graphs = False
    want = [ref.draft(h[i:i + 3], toks[i:i + 3], i, 4) for i in range(0, 24, 3)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    graph = head.step_graph()
    got = [graph.draft(h[i:i + 3], toks[i:i + 3], i, 4) for i in range(0, 24, 3)]
    torch.cuda.synchronize()
    used = torch.cuda.memory_reserved() - before        # the graphs' private pool
    assert graph.use_graphs and len(graph._graphs) == 2
    assert used <= mtp_scratch_bytes(cfg, eng.model.n_ctx, cfg.n_vocab), used
    assert got == want
    assert torch.equal(graph.cache.k[:30], ref.cache.k[:30])


@cuda
def test_captured_sampled_drafts_equal_the_same_bodies_run_eagerly(small_cuda):
    """The captured sample graph (top-QK filter, Gumbel-max on the drafter's uniforms) against its
    body run eagerly: with the same RNG the same drafts and bitwise the same q; with all three
    graphs the private pool still fits the plan's MTP scratch."""
    from tightfit.plan.mtp import mtp_scratch_bytes
    from tightfit.runtime.sampler import SamplingParams
    from tightfit.runtime.spec.mtp import MTPCache
    from tightfit.runtime.spec.mtp_graph import MTPStepGraph
    eng = small_cuda
    cfg = eng.config
    head = _head(eng)
    head.new_cache()
    g = torch.Generator(device="cpu").manual_seed(9)
    h = torch.randn(30, cfg.n_embd, generator=g).cuda()
    toks = torch.randint(0, cfg.n_vocab, (30,), generator=g).tolist()
    sp = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    ref = MTPStepGraph(head, MTPCache(head, head.cache_capacity, fixed=True))
    ref.use_graphs = False
    r1 = np.random.default_rng(3)
    want = [ref.draft_sampled(h[i:i + 3], toks[i:i + 3], i, 4, sp, r1) for i in range(0, 24, 3)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    graph = head.step_graph()
    graph.draft(h[:3], toks[:3], 0, 2)                  # kv + draft captured too
    r2 = np.random.default_rng(3)
    got = [graph.draft_sampled(h[i:i + 3], toks[i:i + 3], i, 4, sp, r2) for i in range(0, 24, 3)]
    torch.cuda.synchronize()
    used = torch.cuda.memory_reserved() - before
    assert graph.use_graphs and len(graph._graphs) == 3
    assert used <= mtp_scratch_bytes(cfg, eng.model.n_ctx, cfg.n_vocab), used
    for (wo, wq), (go, gq) in zip(want, got):
        assert go == wo
        for (wi, wp), (gi, gp) in zip(wq, gq):
            assert np.array_equal(wi, gi) and np.array_equal(wp, gp)


@cuda
def test_greedy_speculation_with_captured_mtp_is_plain_greedy(small_cuda):
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    eng = small_cuda
    se = SpeculativeEngine(eng, SpecConfig(drafters=("mtp",), mtp_draft=3))
    assert se.mtp_head.step_graph() is not None
    rep = se.mtp_head.step_graph().replays
    for p in ([3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 7, 8, 8, 8, 9, 9, 9, 7, 7, 7]):
        a = list(eng.generate(p, max_tokens=40, sampling=GREEDY))[-1]
        b = list(se.generate(p, max_tokens=40, sampling=GREEDY))[-1]
        assert b.tokens == a.tokens
    assert se.mtp_head.step_graph().replays > rep


def test_the_verify_block_ignores_the_held_mtp_block(held, monkeypatch):
    """VerifyGraph sizes its int8 input buffers from the executor's quantized matrices: the MTP
    block's (eh_proj reads no trunk buffer) must not enter (on the device the held block made
    its construction fail)."""
    from tightfit.model import verify_graph as VG
    cfg = held.config
    assert cfg.is_mtp_tensor(f"blk.{cfg.n_layer}.nextn.eh_proj.weight")
    assert not cfg.is_mtp_tensor(f"blk.{cfg.n_layer - 1}.ffn_up.weight")
    assert not cfg.is_mtp_tensor("output.weight") and not cfg.is_mtp_tensor("blk.x.y")
    for L in held.model.lin.values():
        monkeypatch.setattr(L, "kind", "quant")     # as on the GPU (the tiny model is 'ref' here)
    vg = VG.VerifyGraph(held.model, 3)
    assert vg.layout and not any(cfg.is_mtp_tensor(n) for n in vg.layout)


@cuda
def test_prefill_hidden_on_the_device_keeps_the_plain_logits(small_cuda):
    """On the GPU a 1-row FFN takes the GEMV path and a block the GEMM: prefill_hidden runs the
    last row as the plain prefill does, so its logits and state are bitwise the plain ones."""
    m = small_cuda.model
    cfg = small_cuda.config
    ids = [int(x) for x in np.random.default_rng(8).integers(0, cfg.n_vocab, 40)]
    bf = m.batcher()
    old = bf.chunk
    bf.chunk = 16
    try:
        a, b = m.new_state(), m.new_state()
        want = m.forward(ids, a, logits="last")
        n_rows = []
        got = m.prefill_hidden(ids, b, lambda rows, part: n_rows.append(rows.shape[0]))
    finally:
        bf.chunk = old
    assert n_rows == [16, 16, 8]
    assert torch.equal(got, want)
    a.sync()
    b.sync()
    assert torch.equal(a.k[:, :40], b.k[:, :40]) and torch.equal(a.v[:, :40], b.v[:, :40])


def _pairs(cfg, n, seed):
    g = np.random.default_rng(seed)
    return (torch.tensor(g.normal(size=(n, cfg.n_embd)), dtype=torch.float32),
            g.integers(0, cfg.n_vocab, n).tolist())


def test_graph_samples_from_the_q_it_returns(held):
    """temperature > 0: the sample body's q for the first draft is the sampler's filtered
    distribution of the head's logits (top-k within the QK candidates, top-p, min-p, then the
    temperature), and its Gumbel-max draws follow that q (chi-square over 1,500 draws)."""
    from tightfit.runtime.sampler import SamplingParams, filtered_distribution
    from tightfit.runtime.spec.mtp import MTPCache
    from tightfit.runtime.spec.mtp_graph import QK
    cfg = held.config
    head = _head(held)
    graph = head.step_graph()
    h, toks = _pairs(cfg, 4, 21)
    sp = SamplingParams(temperature=1.3, top_k=12, top_p=0.97, min_p=0.01)
    c = MTPCache(head, 64, fixed=True)
    logits, _ = head.forward(h, toks, c, 0, logits="last")
    want_ids, want_p = filtered_distribution(logits[-1].float().numpy(), sp)
    rng = np.random.default_rng(4)
    out, qs = graph.draft_sampled(h, toks, 0, 3, sp, rng)
    assert len(out) == 3 and len(qs) == 3
    for d, (ids, p) in zip(out, qs):
        assert ids.shape == p.shape == (QK,) and abs(p.sum() - 1) < 1e-5
        assert p[list(ids).index(d)] > 0                      # q covers its own draft
    ids, p = qs[0]
    got = {int(i): float(v) for i, v in zip(ids, p) if v > 0}
    assert set(got) == set(int(i) for i in want_ids)
    np.testing.assert_allclose([got[int(i)] for i in want_ids], want_p, rtol=1e-4, atol=1e-6)
    n = 1500
    counts = {}
    for _ in range(n):
        d = graph.draft_sampled(h, toks, 0, 1, sp, rng)[0][0]
        counts[d] = counts.get(d, 0) + 1
    assert set(counts) <= set(got)
    exp = np.array([got[i] * n for i in sorted(got)])
    obs = np.array([counts.get(i, 0) for i in sorted(got)], dtype=float)
    rare = exp < 5
    e2, o2 = np.append(exp[~rare], exp[rare].sum()), np.append(obs[~rare], obs[rare].sum())
    if e2[-1] == 0:
        e2, o2 = e2[:-1], o2[:-1]
    stat, dof = float(((o2 - e2) ** 2 / e2).sum()), len(e2) - 1
    assert stat < dof + 6 * np.sqrt(2 * dof) + 10, (stat, dof)  # ~ p < 1e-5 at these dof


def test_sampled_propose_drafts_through_the_graph(held):
    """MTPDrafter with temperature > 0 drafts through the step graph (one replay per pair but the
    last and per draft), hands the verifier each draft's q, and its seed reproduces the drafts."""
    from tightfit.runtime.sampler import SamplingParams
    from tightfit.runtime.spec.mtp import MTPDrafter
    cfg = held.config
    head = _head(held)
    graph = head.step_graph()
    h, toks = _pairs(cfg, 6, 8)
    sp = SamplingParams(temperature=0.9, top_k=30, top_p=0.95, min_p=0.05)
    got = []
    for _ in range(2):
        a = MTPDrafter(head, max_draft=3, sampling=sp, rng=np.random.default_rng(77))
        a.observe(h[:4], toks[:4])
        rep = graph.replays
        d = a.propose(3)
        assert graph.replays - rep == 3 + 3
        assert d.q is not None and len(d.q) == 3
        assert all(t in set(int(i) for i, v in zip(*q) if v > 0) for t, q in zip(d.tokens, d.q))
        got.append(d.tokens)
    assert got[0] == got[1]
