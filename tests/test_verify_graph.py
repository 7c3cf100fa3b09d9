"""The captured speculative verify block (tightfit.model.verify_graph, kernels in
tightfit.kernels.block_step) on the CPU: the same pass the CUDA graph records, run eagerly on the
torch references (use_triton=False) and on the Triton kernels under TRITON_INTERPRET=1.

Oracles: the eager batched forward_block (tightfit.model.batch, a different code path: chunked
GDN, SDPA attention); for commit(j), the same executor fed the j tokens one by one; for greedy
speculation, the plain decode loop. Plus: no tensor is created during the pass, the block
kernels equal their references, and a CUDA smoke test (skipped here) captures and replays."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

from tightfit.api import open_model  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402

# the CPU runs of the Triton kernels need them built for the interpreter (an earlier test module
# may have imported them compiled on a GPU machine): decided by how they were built, not the
# environment now
INTERP = _interp.interpreted("tightfit.kernels.block_step", "tightfit.kernels.norm",
                             "tightfit.kernels.attn_decode", "tightfit.kernels.gdn",
                             "tightfit.kernels.embed", "tightfit.kernels.gemv",
                             "tightfit.kernels.quantize_act")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("vg") / "tiny-f32.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=7)
    mf = open_model(p)
    yield mf
    mf.close()


def _exe(mf, triton_ops=False, chunk=None, n_ctx=128, device="cpu"):
    from tightfit.model.executor import GPUModel
    exe = GPUModel.from_model_file(mf, device=device, n_ctx=n_ctx, use_triton=triton_ops,
                                   device_embed=True if triton_ops else None, chunk=chunk)
    return exe


def _prompt(mf, n, seed):
    return np.random.default_rng(seed).integers(0, mf.config.n_vocab, n).tolist()


def _blocks(exe, st, block):
    """(eager Block logits/hidden, graph-path Block) from the same state."""
    bf = exe.batcher()
    snap = st.snapshot()
    bf.use_verify_graph = False
    e = exe.forward_block(block, st)
    el, eh = e.logits.detach().clone(), e.hidden.detach().clone()
    st.restore(snap)
    bf.use_verify_graph = True
    g = exe.forward_block(block, st)
    assert bf._vg is not None and bf._vg.serial >= 1
    return el, eh, g, snap


def _close(a, b, tol):
    a = np.asarray(a.detach().cpu(), np.float64)
    b = np.asarray(b.detach().cpu(), np.float64)
    err = np.abs(a - b).max()
    assert err <= tol * (np.abs(b).max() + 1e-9), (err, np.abs(b).max())


@pytest.mark.parametrize("triton_ops", [False, True])
@pytest.mark.parametrize("M", [1, 5, 16])
def test_logits_equal_eager_block(tiny, triton_ops, M):
    if triton_ops and not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    exe = _exe(tiny, triton_ops)
    st = exe.new_state(128)
    exe.forward(_prompt(tiny, 11, M), st, logits="none")
    el, eh, g, _ = _blocks(exe, st, _prompt(tiny, M, 100 + M))
    assert g.logits.shape == el.shape
    _close(g.logits, el, 2e-5)
    _close(g.hidden, eh, 2e-5)
    assert st.pos == 11                              # nothing committed by the pass
    g.commit(M)
    assert st.pos == 11 + M and int(st.status[2]) == 11 + M


@pytest.mark.parametrize("triton_ops", [False, True])
def test_commit_j_equals_tokens_one_by_one(tiny, triton_ops):
    """Accepting j of M keeps exactly the state after block token j-1: the next logits and the
    recurrent banks equal feeding those j tokens one at a time through the step."""
    if triton_ops and not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    exe = _exe(tiny, triton_ops)
    exe.batcher().use_verify_graph = True
    prompt, block = _prompt(tiny, 9, 1), _prompt(tiny, 5, 2)
    js = [1, 3, 5] if triton_ops else [1, 2, 3, 4, 5]
    for j in js:
        a, b = exe.new_state(128), exe.new_state(128)
        exe.forward(prompt, a, logits="none")
        exe.forward(prompt, b, logits="none")
        exe.forward_block(block, a).commit(j)
        for t in block[:j]:
            exe.forward([t], b, logits="last")
        assert a.pos == b.pos == 9 + j
        ab, bb = int(a.status[0]), int(b.status[0])
        _close(a.ssm[ab], b.ssm[bb], 1e-5)
        _close(a.conv[ab], b.conv[bb], 1e-6)
        _close(exe.forward([7, 8], a, logits="all"), exe.forward([7, 8], b, logits="all"), 2e-5)


def test_split_attention_mode(tiny, monkeypatch):
    """Past SINGLE_PASS_MAX the block attends with split-K (chunks of 4 rows here, several of
    them fully masked for the early queries of the block) and still equals the eager block."""
    if not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    from tightfit.kernels import attn_decode as A
    monkeypatch.setattr(A, "SINGLE_PASS_MAX", 8)
    exe = _exe(tiny, True, chunk=4)
    st = exe.new_state(128)
    exe.forward(_prompt(tiny, 13, 3), st, logits="none")
    el, eh, g, _ = _blocks(exe, st, _prompt(tiny, 6, 4))
    _close(g.logits, el, 2e-5)
    g.commit(2)
    assert st.pos == 15


def test_block_reads_argmaxes_and_status_once(tiny):
    """The captured block hands over each row's argmax (taken in the pass, torch.argmax's first
    index) and checks the state's status words with that same read: a state whose sticky
    non-finite flag is set raises NonFiniteError as the sync before the block used to."""
    from tightfit.runtime.state import NonFiniteError
    exe = _exe(tiny)
    exe.batcher().use_verify_graph = True
    st = exe.new_state(128)
    exe.forward(_prompt(tiny, 6, 3), st, logits="none")
    g = exe.forward_block(_prompt(tiny, 4, 4), st)
    assert g.argmaxes() == torch.argmax(g.logits, dim=-1).tolist()
    g.commit(1)
    st.status[1] = 1                                  # a step left non-finite values behind
    with pytest.raises(NonFiniteError):
        exe.forward_block(_prompt(tiny, 3, 5), st)
    assert st.pos == 7 and int(st.status[1]) == 0     # as sync() leaves it


def test_stale_block_cannot_commit(tiny):
    from tightfit.runtime.state import StateError
    exe = _exe(tiny)
    exe.batcher().use_verify_graph = True
    st = exe.new_state(128)
    exe.forward([1, 2, 3], st, logits="none")
    b1 = exe.forward_block([4, 5, 6], st)
    b2 = exe.forward_block([4, 5, 6], st)
    with pytest.raises(StateError):
        b1.commit(1)
    b2.commit(2)
    assert st.pos == 5


def test_not_taken_for_quantized_kv_or_cpu_default(tiny):
    exe = _exe(tiny)
    bf = exe.batcher()
    st = exe.new_state(128)
    assert bf.use_verify_graph is None and bf.verify_graph(4, st) is None   # auto: CUDA only
    bf.use_verify_graph = True
    assert bf.verify_graph(4, st) is not None
    assert bf.verify_graph(17, st) is None                                  # > 16: eager


def test_pass_creates_no_tensor(tiny):
    """The pass (what the graph records) writes only planned buffers: no tensor is created
    (Triton kernels interpreted; the interpreter's own host copies are not torch ops)."""
    if not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    from torch.utils._python_dispatch import TorchDispatchMode
    exe = _exe(tiny, True)
    bf = exe.batcher()
    bf.use_verify_graph = True
    st = exe.new_state(128)
    exe.forward([1, 2, 3, 4], st, logits="none")
    vg = bf.verify_graph(5, st)
    vg.run([5, 6, 7, 8, 9], st)            # first use: lazy tables, views
    made = []
    factory = {"empty", "empty_strided", "zeros", "ones", "full", "new_empty", "new_zeros",
               "new_empty_strided", "cat", "clone", "_to_copy", "arange", "stack", "tensor",
               "scalar_tensor", "lift_fresh"}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in factory:
                import traceback
                stack = traceback.extract_stack()
                if not any("triton" in f.filename and "interpreter" in f.filename
                           for f in stack):          # the interpreter's own host copies
                    made.append((name, [f"{f.filename}:{f.lineno}" for f in stack
                                        if "tightfit" in f.filename][-2:]))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Count():
        vg._pass(st, 5, "single")
    assert made == [], made


def test_greedy_speculation_identical_to_plain(tiny):
    """BlockVerifier over the graph path (refs on the CPU) emits exactly the plain greedy tokens."""
    from tightfit.runtime.engine import Engine
    from tightfit.runtime.sampler import GREEDY
    from tightfit.runtime.spec import SpecConfig, SpeculativeEngine
    from tightfit.tokenizer import from_gguf
    exe = _exe(tiny, n_ctx=256)
    exe.batcher().use_verify_graph = True
    eng = Engine(tiny, exe, from_gguf(tiny.gguf.metadata), n_ctx=256)
    se = SpeculativeEngine(eng, SpecConfig(drafters=("ngram", "suffix")))
    for p in ([100, 200, 300, 100, 200, 300, 100, 200], [42] * 12):
        sa, sb = eng.new_state(), eng.new_state()
        a = list(eng.generate(p, max_tokens=80, sampling=GREEDY, state=sa))[-1]
        b = list(se.generate(p, max_tokens=80, sampling=GREEDY, state=sb))[-1]
        assert b.tokens == a.tokens
        assert sb.pos == sa.pos
    assert exe.batcher()._vg is not None and exe.batcher()._vg.serial > 0


def test_quantized_matrix_block_columns():
    """A quantized matrix at M columns through the block's layout and planned activation buffers
    (gemv_route.quantize_into + gemv_act) equals the GEMV reference."""
    if not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    from tightfit.kernels.gemv import gemv_ref
    from tightfit.kernels.gemv_route import gemv_act, make_act, quantize_into
    from tightfit.model.verify_graph import act_specs, block_layout
    from tightfit.quant.traits import traits
    qt, n_out, n_in, M = 8, 32, 256, 5           # Q8_0: fp16 scale at byte 0 of each block
    rng = np.random.default_rng(0)
    tr = traits(qt)
    blocks = rng.integers(0, 256, size=(n_out * n_in // tr.block_size, tr.type_size),
                          dtype=np.uint8)
    blocks[:, 0:2] = rng.uniform(0.001, 0.01, blocks.shape[0]).astype(np.float16) \
        .view(np.uint8).reshape(-1, 2)
    raw = blocks.reshape(-1).copy()
    x = rng.standard_normal((M, n_in)).astype(np.float32)
    lay = block_layout(qt)
    dt = {"i8": torch.int8, "f32": torch.float32, "i32": torch.int32}
    bufs = {s: torch.zeros(sh, dtype=dt[d]) for s, sh, d in act_specs(lay, n_in, M)}
    act = quantize_into(torch.from_numpy(x), lay, make_act(lay, bufs, M, n_in))
    out = torch.zeros(M, n_out)
    gemv_act(act, torch.from_numpy(raw), qt, n_out, out, torch.zeros(1 << 16))
    want = gemv_ref(x, raw, qt, n_out, n_in)
    assert np.abs(out.numpy() - want).max() <= 0.02 * np.abs(want).max()


@pytest.mark.skipif(not torch.cuda.is_available() or INTERP,
                    reason="needs CUDA (compiled kernels, no TRITON_INTERPRET)")
def test_device_capture_and_replay(tiny):
    """CUDA: the block is captured once per (M, mode), replays allocate nothing, and its logits
    and partial commit equal the eager block."""
    exe = _exe(tiny, True, device="cuda")
    bf = exe.batcher()
    st = exe.new_state(128)
    exe.forward(_prompt(tiny, 11, 5), st, logits="none")
    block = _prompt(tiny, 5, 6)
    el, eh, g, snap = _blocks(exe, st, block)
    _close(g.logits, el, 1e-4)
    st.restore(snap)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(3):
        g = exe.forward_block(block, st)
        _close(g.logits, el, 1e-4)
        st.restore(snap)
    torch.cuda.synchronize()
    assert bf._vg.replays >= 3
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    assert allocs <= 40, allocs            # snapshot/restore host copies only, none per layer
    g = exe.forward_block(block, st)
    g.commit(2)
    st.sync()
    assert st.pos == 13
    # the first block captured every size of its mode (2..m_max): a smaller one later replays
    assert set(bf._vg._graphs[st]) == {(m, "single") for m in range(2, 6)}
    from tightfit.model import onetime
    n0 = onetime.count()
    exe.forward_block(_prompt(tiny, 3, 8), st)
    assert onetime.count() == n0


@pytest.mark.skipif(not torch.cuda.is_available() or INTERP,
                    reason="needs CUDA (compiled kernels, no TRITON_INTERPRET)")
def test_device_capture_family_fits_the_context(tiny):
    """CUDA: the sizes captured with the first block are only those this state could run now
    (the capture's warm-up pass writes KV rows past the committed length)."""
    from tightfit.model.verify_graph import VerifyGraph
    exe = _exe(tiny, True, device="cuda")
    bf = exe.batcher()
    st = exe.new_state(128)
    exe.forward(_prompt(tiny, 124, 5), st, logits="none")
    bf._vg = VerifyGraph(exe, 8)
    exe.forward_block(_prompt(tiny, 2, 6), st)
    assert set(bf._vg._graphs[st]) == {(2, "single"), (3, "single"), (4, "single")}


@pytest.mark.skipif(not torch.cuda.is_available() or INTERP,
                    reason="needs CUDA (compiled kernels, no TRITON_INTERPRET)")
def test_device_commit_graphs_equal_the_launched_commit(tiny):
    """CUDA: commit(j) replays a graph of the three commit kernels captured with the block's
    family (their Python launches cost ~0.2 ms of every round, session 22). Oracle: the same
    kernels launched directly (the fallback when no graph is there). For every j the active
    bank's conv and SSM state, the status words and the position must be equal bit for bit, and
    the capture's warm-up must not have moved the state."""
    exe = _exe(tiny, True, device="cuda")
    bf = exe.batcher()
    st = exe.new_state(128)
    exe.forward(_prompt(tiny, 11, 5), st, logits="none")
    st.sync()
    snap = st.snapshot()
    block = _prompt(tiny, 5, 6)
    exe.forward_block(block, st)            # captures the verify family and its commits
    st.sync()
    assert st.pos == 11                     # nothing committed by the captures' warm-ups
    per = bf._vg._commits[st]
    assert set(per) == {(m, j) for m in range(2, 6) for j in range(1, m + 1)}
    for j in range(1, 6):
        got = []
        for use_graph in (True, False):
            st.restore(snap)
            saved = dict(per)
            if not use_graph:
                per.clear()                 # commit() falls back to launching the kernels
            blk = exe.forward_block(block, st)
            blk.commit(j)
            st.sync()
            a = int(st.status[0])           # the bank the commit made active
            got.append((st.conv[a].clone(), st.ssm[a].clone(), st.status[1:3].clone(), st.pos))
            per.update(saved)
        (c1, s1, u1, p1), (c2, s2, u2, p2) = got
        assert p1 == p2 == 11 + j
        assert torch.equal(u1, u2) and torch.equal(c1, c2) and torch.equal(s1, s2), j


def _small(tmp_path_factory, qtype: str, seed: int):
    p = tmp_path_factory.mktemp("vgq") / f"small-{qtype.lower()}.gguf"
    # K = 256n: quantized GEMVs; 4 layers hold one attention layer; a small vocabulary keeps the
    # interpreted LM head short
    make_model(p, preset="small", layers=4, qtype=qtype, seed=seed, vocab="small:2048")
    return open_model(p)


@pytest.fixture(scope="module")
def small_q4(tmp_path_factory):
    mf = _small(tmp_path_factory, "Q4_0", 8)
    yield mf
    mf.close()


def _torch_gemv_act():
    """gemv_act as a torch product on the int8 activations (codes back to element order, times
    their scales) and gguf-py's dequantized weights: the interpreted quantized GEMV at several
    columns takes minutes on the CPU."""
    import gguf
    from tightfit.kernels.quantize_act import LAYOUTS
    wcache: dict = {}

    def gemv(act, w, qtype, n_out, out, workspace=None):
        n, k = act.q.shape
        inv = torch.from_numpy(np.argsort(LAYOUTS[act.layout]))      # element -> position
        codes = act.q.view(n, k // 32, 32)[:, :, inv].float()
        x = (codes * act.d.view(n, k // 32, 1)).view(n, k)
        key = (w.data_ptr(), int(qtype))
        if key not in wcache:
            wcache[key] = torch.from_numpy(gguf.quants.dequantize(
                w.numpy(), gguf.GGMLQuantizationType(int(qtype))).reshape(n_out, k).copy())
        out.copy_(x @ wcache[key].T)
        return out
    return gemv


def _record_gemv(monkeypatch, dev, record):
    """gemv_route.gemv_act replaced by one that calls record(act, out) first, then computes: the
    real GEMV on a GPU, the torch product on the int8 codes under the interpreter."""
    from tightfit.kernels import gemv_route
    real_g, torch_gemv = gemv_route.gemv_act, _torch_gemv_act()

    def gemv(act, w, qtype, n_out, out, workspace=None):
        record(act, out)
        if dev == "cuda":
            return real_g(act, w, qtype, n_out, out, workspace)
        return torch_gemv(act, w, qtype, n_out, out, workspace)
    monkeypatch.setattr(gemv_route, "gemv_act", gemv)


def _prefilled_block(mf, monkeypatch, dev, prompt, env: str, value: str):
    """With `env` = value: an executor on `dev` (Triton kernels), a state holding `prompt`, and
    its verify block of up to 3 tokens (not run yet)."""
    from tightfit.model import verify_graph as VG
    monkeypatch.setenv(env, value)
    exe = _exe(mf, True, device=dev)
    st = exe.new_state(128)
    exe.forward(prompt, st, logits="none")
    return exe, st, VG.VerifyGraph(exe, 3)


def test_fused_activation_quant_matches_separate_launches(small_q4, monkeypatch):
    """The block's norms / SwiGLU / gated norm write their output's int8 copy themselves (as the
    step does) and the separate quantize launches go: every GEMV reads the same int8 activations
    (codes, scales, sums) as with TIGHTFIT_FUSE_QUANT=0 (quantize_act after each producer), the
    logits are equal, and only the attention outputs (no fused producer) are still quantized on
    their own. Under the interpreter the GEMV itself is a torch product on those int8 codes
    (the interpreted quantized GEMV at 3 columns takes minutes); on a GPU it is the real one."""
    dev = "cpu" if INTERP else "cuda"
    if not INTERP and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 or CUDA")
    from tightfit.kernels import gemv_route
    from tightfit.kernels.gemv_route import is_cuda
    calls, seen = [], []
    real_q = gemv_route.quantize_into
    monkeypatch.setattr(gemv_route, "quantize_into",
                        lambda x, lay, qa: calls.append(lay) or real_q(x, lay, qa))
    _record_gemv(monkeypatch, dev,
                 lambda act, out: seen.append((act.q.clone(), act.d.clone(), act.s16.clone())))
    c = small_q4.config
    prompt = _prompt(small_q4, 2, 3)
    got = {}
    for fuse in ("1", "0"):
        exe, st, vg = _prefilled_block(small_q4, monkeypatch, dev, prompt, "TIGHTFIT_FUSE_QUANT",
                                       fuse)
        assert exe.fuse_quant == (fuse == "1")
        # Q4_0: v1 layouts under the interpreter, the CUDA GEMV's layout 200 on a GPU: fusable
        assert vg.layout and all(0 <= lay < 4 or is_cuda(lay) for lay in vg.layout.values())
        calls.clear()
        seen.clear()
        with torch.no_grad():
            vg._pass(st, 3, "single")
        got[fuse] = (vg.views(3).logits.clone(), len(calls), list(seen))
        assert not vg._fresh                      # every fused copy was consumed
    n_attn = sum(not c.is_recurrent(il) for il in range(c.n_layer))
    assert got["0"][1] == 4 * c.n_layer + 1      # xn, on / ao, xn, h per layer; the head's xn
    assert got["1"][1] == n_attn
    assert len(got["1"][2]) == len(got["0"][2]) > 0
    for a, b in zip(got["1"][2], got["0"][2]):
        for ta, tb in zip(a, b):
            torch.testing.assert_close(ta, tb, rtol=0, atol=0)
    torch.testing.assert_close(got["1"][0], got["0"][0], rtol=0, atol=0)


@pytest.fixture(scope="module")
def small_q4_gates(tmp_path_factory):
    """As small_q4, with the GDN gates in Q8_0 (as the seed mix): they merge as a pair."""
    p = tmp_path_factory.mktemp("vgq") / "small-q4-gates.gguf"
    make_model(p, preset="small", layers=4, qtype="Q4_0", seed=8, vocab="small:2048",
               mix={r"blk\.\d+\.ssm_(alpha|beta)\.weight": "Q8_0"})
    mf = open_model(p)
    yield mf
    mf.close()


def test_merged_gates_one_launch_same_logits(small_q4_gates, monkeypatch):
    """Where the executor merged ssm_beta + ssm_alpha (merge.py), the block runs them as one
    [M, 2 Hv] product too (one launch fewer per GDN layer) and the GDN kernel reads its two
    halves; where it merged attn_qkv + attn_gate, one [M, conv + value] product per GDN layer
    whose column parts the conv, the gated norm and the commit read (one launch fewer); where it
    merged ffn_gate + ffn_up, one [M, 2 n_ff] product whose column halves the SwiGLU reads (one
    launch fewer per layer). The logits equal the block's with merging off.
    The GEMV is the torch product on the int8 codes under the interpreter (as above), the real
    one on a GPU."""
    dev = "cpu" if INTERP else "cuda"     # no GPU: the kernels are interpreted (_interp)
    shapes = []
    _record_gemv(monkeypatch, dev, lambda act, out: shapes.append(tuple(out.shape)))
    c = small_q4_gates.config
    prompt = _prompt(small_q4_gates, 2, 5)
    got = {}
    for merge in ("1", "0"):
        _, st, vg = _prefilled_block(small_q4_gates, monkeypatch, dev, prompt,
                                     "TIGHTFIT_MERGE_LINEARS", merge)
        assert vg._ba_merged() == (merge == "1") and vg.qkv_merged == (merge == "1")
        ffn = [[f"blk.{il}.ffn_gate.weight", f"blk.{il}.ffn_up.weight"] for il in range(c.n_layer)]
        assert all((vg._merged_pair(n) is not None) == (merge == "1") for n in ffn)
        shapes.clear()
        with torch.no_grad():
            vg._pass(st, 3, "single")
            logits = vg.views(3).logits.clone()
            # keep 2 of the 3 tokens: the commit reads the u rows through their row stride
            vg.op_commit_block(st.conv, st.ssm, vg.conv_rows, vg.ssm_in, st.status, 2, 3)
        assert vg.conv_rows.stride(1) == (c.conv_dim + c.value_dim if merge == "1" else c.conv_dim)
        a = int(st.status[0])
        got[merge] = (logits, list(shapes), st.conv[a].clone(), st.ssm[a].clone(),
                      int(st.status[2]))
    # the committed state: the same window rows and recurrent state, the same position
    torch.testing.assert_close(got["1"][2], got["0"][2], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got["1"][3], got["0"][3], rtol=1e-6, atol=1e-6)
    assert got["1"][4] == got["0"][4] == len(prompt) + 2
    hv, n_rec, ff = c.ssm_v_heads, len(c.recurrent_ids), c.n_ff
    assert got["1"][1].count((3, 2 * hv)) == n_rec and got["1"][1].count((3, hv)) == 0
    # (the tiny model's other products can have these widths too: attention's q + gate, the GDN
    # gate: count what merging changes)
    assert got["1"][1].count((3, 2 * ff)) - got["0"][1].count((3, 2 * ff)) == c.n_layer
    gate_too = n_rec if c.value_dim == ff else 0           # the GDN gate's own product
    assert got["0"][1].count((3, ff)) - got["1"][1].count((3, ff)) == 2 * c.n_layer + gate_too
    assert got["0"][1].count((3, hv)) == 2 * n_rec
    cw = c.conv_dim + c.value_dim
    assert got["1"][1].count((3, cw)) - got["0"][1].count((3, cw)) == n_rec
    assert len(got["0"][1]) - len(got["1"][1]) == 2 * n_rec + c.n_layer
    torch.testing.assert_close(got["1"][0], got["0"][0], rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def small_iq4(tmp_path_factory):
    mf = _small(tmp_path_factory, "IQ4_XS", 9)
    yield mf
    mf.close()


@pytest.mark.parametrize("which", ["ffn", "qkv"])
def test_gemv_mmh_inputs_are_the_norms_bf16_pairs(small_iq4, monkeypatch, which):
    """Where matrices go to gemv_mmh, the norm that writes their input also writes it as bf16
    pairs (norm.PACK_LAYOUT, v_xpk) and they read those with kind "foldp": the FFN's gate and up
    (the norm writes only the pairs), or the GDN's qkv alone (the pairs beside the int8 copy that
    attn_gate, beta and alpha read). The pairs are xpack of the norm's float output bit for bit,
    every other product keeps its path, and the logits agree with TIGHTFIT_MMH_PACK=0 (fp32 x,
    "table" kind) to the folded weights' bf16 rounding. The route is forced (the small model's
    matrices are below gemv_mmh's size bound) and the kernel is its reference here
    (tests/test_gemv_mmh*.py check kernel against reference); the norm is the real Triton kernel
    (interpreted on the CPU, compiled on a GPU)."""
    dev = "cpu" if INTERP else "cuda"
    if not INTERP and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 or CUDA")
    from tightfit.kernels import gemv_mmh as H
    from tightfit.kernels import gemv_route
    from tightfit.model import verify_graph as VG
    if INTERP:       # the other products as torch products (on a GPU: the real kernels)
        monkeypatch.setattr(gemv_route, "gemv_act", _torch_gemv_act())
    holder: dict = {}
    cfg = small_iq4.config
    if which == "ffn":
        mats = {f"blk.{il}.ffn_{w}.weight" for il in range(cfg.n_layer) for w in ("gate", "up")}
    else:
        mats = {f"blk.{il}.attn_qkv.weight" for il in range(cfg.n_layer) if cfg.is_recurrent(il)}
        assert mats
    by_ptr: dict = {}
    calls = []

    def routed(qtype, n, w, weights, packed=False):
        return int(qtype) == 23 and 4 <= int(n) <= 8 and w.data_ptr() in by_ptr

    def fake(x, w, qtype, n_out, out, rt=None, kind=None):
        name = by_ptr[w.data_ptr()]
        calls.append((name, kind, x.clone(), holder["vg"].views(x.shape[0]).xn.clone()))
        k = x.shape[1] * (2 if kind == "foldp" else 1)
        if kind == "foldp":                       # the pairs back to elements
            u = x.cpu().numpy().view(np.uint32).reshape(x.shape[0], -1, 16)
            b = np.concatenate([u & 0xFFFF, u >> 16], axis=2).astype(np.uint32) << 16
            xf = b.reshape(x.shape[0], k).view(np.float32)
        else:
            xf = x.cpu().numpy()
        y = H.gemv_mmh_ref(xf, w.cpu().numpy(), n_out, kind or "table")
        out.copy_(torch.from_numpy(y).float())
        return out
    monkeypatch.setattr(gemv_route, "mmh_routed", routed)
    monkeypatch.setattr(gemv_route, "mmh_input", lambda x: x is not None and x.dtype == torch.float32)
    monkeypatch.setattr(H, "gemv_mmh", fake)
    prompt = _prompt(small_iq4, 2, 4)
    got = {}
    for pack in ("1", "0"):
        monkeypatch.setenv("TIGHTFIT_MMH_PACK", pack)
        exe = _exe(small_iq4, True, device=dev)
        by_ptr.clear()
        by_ptr.update({exe.lin[n].raw.data_ptr(): n for n in mats if exe.lin[n].qtype == 23})
        assert len(by_ptr) == len(mats)
        st = exe.new_state(128)
        exe.forward(prompt, st, logits="none")
        vg = holder["vg"] = VG.VerifyGraph(exe, 4)
        calls.clear()
        with torch.no_grad():
            vg._pass(st, 4, "single")
        got[pack] = vg.views(4).logits.clone()
        # gate and up (or their merged product, which the fake sees under gate's name), nothing else
        want = {n for n in mats if not (n.endswith("ffn_up.weight") and vg._merged_pair(
            [n.replace("ffn_up", "ffn_gate"), n]) is not None)}
        assert {c[0] for c in calls} == want
        kinds = {c[1] for c in calls}
        assert kinds == ({"foldp"} if pack == "1" else {None})
        if pack == "1":               # each layer's pairs = xpack of the norm's float output
            for _, _, xpk, xn in calls:
                assert torch.equal(xpk, H.xpack(xn))
    ref, packed = got["0"], got["1"]
    err = float((packed - ref).abs().max() / ref.abs().max())
    assert 0 < err < 2e-2, err                # bf16 weights: a small, nonzero difference
