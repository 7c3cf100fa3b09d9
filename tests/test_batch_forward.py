"""The executor's batched forward (tightfit/model/batch.py via GPUModel.forward for n > 1, and
GPUModel.forward_block for speculative verify) on the CPU, against the ReferenceModel oracle:
prefill of N tokens then decode equals the reference; chunk boundaries (prefill chunks and GDN
chunks) at awkward positions; prompts of 1, 31, 32, 33 tokens; a model covering the quant formats;
partial acceptance of a verify block without re-running."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import _interp

# the GEMV route tests run the kernels interpreted, only where there is no GPU
# (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

from tightfit.api import open_model  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402
from tightfit.runtime.state import NonFiniteError, StateError  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("batch") / "tiny-f32.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=7)
    mf = open_model(p)
    yield mf
    mf.close()


@pytest.fixture(scope="module")
def cover(tmp_path_factory):
    p = tmp_path_factory.mktemp("batch") / "small-cover.gguf"
    make_model(p, preset="small", mix="cover", seed=3)
    mf = open_model(p)
    yield mf
    mf.close()


def _gemv_interpreted() -> bool:
    """The GEMV route on the CPU (gemv_on_cpu) needs its kernels built for the interpreter: they
    may have been imported compiled by an earlier test module on a GPU machine."""
    return _interp.interpreted("tightfit.kernels.gemv", "tightfit.kernels.gemv2",
                               "tightfit.kernels.quantize_act")


def _exe(mf, prefill_chunk=16, gdn_chunk=8, **kw):
    from tightfit.model.executor import GPUModel
    kw.setdefault("use_triton", False)
    exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=128, prefill_chunk=prefill_chunk,
                                   **kw)
    exe.batcher().gdn_chunk = gdn_chunk
    return exe


def _close(a, b, tol=2e-5):
    a, b = np.asarray(a.detach().cpu(), np.float64), np.asarray(b.detach().cpu(), np.float64)
    assert a.shape == b.shape
    err = np.abs(a - b).max()
    assert err <= tol * (np.abs(b).max() + 1e-9), f"max err {err}, scale {np.abs(b).max()}"


@pytest.mark.parametrize("n", [1, 31, 32, 33])
def test_prefill_then_decode(tiny, n):
    ref, exe = ReferenceModel.from_model_file(tiny), _exe(tiny)
    rng = np.random.default_rng(n)
    prompt = rng.integers(0, tiny.config.n_vocab, n).tolist()
    rs, gs = ref.new_state(128), exe.new_state(128)
    _close(exe.forward(prompt, gs, logits="all"), ref.forward(prompt, rs, logits="all"))
    assert gs.pos == rs.pos == n and int(gs.status[2]) == n
    tok = 3
    for _ in range(3):
        lg, lr = exe.forward([tok], gs, logits="last"), ref.forward([tok], rs, logits="last")
        _close(lg, lr)
        tok = int(lr.argmax())


def test_state_only_modes_and_progress(tiny):
    ref, exe = ReferenceModel.from_model_file(tiny), _exe(tiny, prefill_chunk=13, gdn_chunk=5)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, tiny.config.n_vocab, 40).tolist()
    rs, gs = ref.new_state(128), exe.new_state(128)
    seen = []
    out = exe.forward(prompt[:30], gs, logits="none", progress=lambda d, t: seen.append((d, t)))
    assert out.shape == (0, tiny.config.n_vocab)
    assert seen == [(13, 30), (26, 30), (30, 30)]
    ref.forward(prompt[:30], rs, logits="none")
    _close(exe.forward(prompt[30:], gs, logits="last"), ref.forward(prompt[30:], rs, logits="last"))
    # the batched path and the token-by-token step agree after a batched prefill too
    _close(exe.forward([5, 6], gs, logits="all"), ref.forward([5, 6], rs, logits="all"))


def test_second_prefill_over_prefix(tiny):
    """A block after a prefix: attention over cached rows + the block (explicit causal mask)."""
    ref, exe = ReferenceModel.from_model_file(tiny), _exe(tiny, prefill_chunk=7, gdn_chunk=4)
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 1000, 11).tolist(), rng.integers(0, 1000, 9).tolist()
    rs, gs = ref.new_state(128), exe.new_state(128)
    exe.forward(a, gs, logits="none")
    ref.forward(a, rs, logits="none")
    _close(exe.forward(b, gs, logits="all"), ref.forward(b, rs, logits="all"))


def test_quant_formats_model(cover):
    ref, exe = ReferenceModel.from_model_file(cover), _exe(cover, prefill_chunk=12, gdn_chunk=8)
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, cover.config.n_vocab, 25).tolist()
    rs, gs = ref.new_state(128), exe.new_state(128)
    _close(exe.forward(prompt, gs, logits="all"), ref.forward(prompt, rs, logits="all"), 1e-4)
    _close(exe.forward([9], gs, logits="last"), ref.forward([9], rs, logits="last"), 1e-4)


@pytest.mark.parametrize("keep_n", [1, 3, 6])
def test_forward_block_partial_commit(cover, keep_n):
    ref, exe = ReferenceModel.from_model_file(cover), _exe(cover, gdn_chunk=4)
    rng = np.random.default_rng(keep_n)
    prompt = rng.integers(0, cover.config.n_vocab, 7).tolist()
    block = rng.integers(0, cover.config.n_vocab, 6).tolist()
    rs, gs = ref.new_state(128), exe.new_state(128)
    exe.forward(prompt, gs, logits="none")
    ref.forward(prompt, rs, logits="none")
    snap = rs.snapshot()
    blk = exe.forward_block(block, gs)
    assert gs.pos == 7                                          # nothing committed yet
    _close(blk.logits, ref.forward(block, rs, logits="all"), 1e-4)
    assert blk.hidden.shape == (6, cover.config.n_embd)
    assert blk.row(2).shape == (cover.config.n_vocab,)
    rs.restore(snap)
    ref.forward(block[:keep_n], rs, logits="none")
    blk.commit(keep_n)
    assert gs.pos == rs.pos == 7 + keep_n
    with pytest.raises(StateError):
        blk.commit(keep_n)
    _close(exe.forward([11], gs, logits="last"), ref.forward([11], rs, logits="last"), 1e-4)
    _close(exe.forward([12, 13], gs, logits="all"), ref.forward([12, 13], rs, logits="all"), 1e-4)


def test_forward_block_without_keep(tiny):
    exe = _exe(tiny)
    gs = exe.new_state(128)
    exe.forward([1, 2, 3], gs, logits="none")
    blk = exe.forward_block([4, 5, 6], gs, keep_states=False)
    with pytest.raises(StateError):
        blk.commit(2)
    blk.commit(3)
    assert gs.pos == 6
    stale = exe.forward_block([7, 8], gs)
    exe.forward([9], gs, logits="none")                          # the state moved on
    with pytest.raises(StateError):
        stale.commit(1)


def test_nonfinite_chunk_keeps_state(tiny):
    exe = _exe(tiny, prefill_chunk=4)
    gs = exe.new_state(128)
    exe.forward([1, 2, 3, 4, 5], gs, logits="none")
    snap = gs.snapshot()
    w = exe.vec["output_norm.weight"]
    keep = w[0].item()
    w[0] = float("nan")
    try:
        with pytest.raises(NonFiniteError):
            exe.forward([6, 7, 8], gs, logits="last")
        assert gs.pos == 5 and int(gs.status[2]) == 5
        after = gs.snapshot()
        for a, b in zip(snap.ssm + snap.conv, after.ssm + after.conv):
            assert torch.equal(a, b)
    finally:
        w[0] = keep


def test_workspace_line(tiny):
    from tightfit.model.batch import workspace_bytes
    from tightfit.model.config import QWEN35_27B
    from tightfit.plan.budget import PlanOptions, _fixed_lines
    ws = workspace_bytes(QWEN35_27B, 2048, depth=32768)
    assert ws["gemm_scratch"] == 64 << 20
    assert all(v >= 0 for v in ws.values())
    # bounded attention: nothing grows with depth (f16: the cache is read in place)
    assert ws == workspace_bytes(QWEN35_27B, 2048, depth=131072 - 2048)
    q = workspace_bytes(QWEN35_27B, 1024, depth=8192, kv_type="tq3")
    assert q == workspace_bytes(QWEN35_27B, 1024, depth=100_000, kv_type="tq3")
    # the planner's prefill line is this very figure (one formula)
    line = _fixed_lines(QWEN35_27B, PlanOptions(ctx=32768, available=1 << 40,
                                                prefill_chunk=1024))["scratch"]
    assert line.details["prefill_bytes"] == workspace_bytes(QWEN35_27B, 1024, 32768 - 1024)["total"]


@pytest.mark.parametrize("p0", [0, 1, 9])
@pytest.mark.parametrize("fallback", [False, True])
def test_attn_prefill_kernel(p0, fallback, monkeypatch):
    """attn_prefill (SDPA, lower-right causal bias or explicit mask) vs the float64 oracle."""
    from tightfit.kernels import attn_prefill as AP
    if fallback:
        monkeypatch.setattr(AP, "_causal_lower_right", None)
    g = torch.Generator().manual_seed(p0)
    n, H, Hkv, D = 6, 6, 2, 16
    q = torch.randn(n, H, D, generator=g)
    kc = torch.randn(p0 + n + 3, Hkv, D, generator=g).half()
    vc = torch.randn(p0 + n + 3, Hkv, D, generator=g).half()
    got = AP.attn_prefill(q, kc, vc, p0)
    want = AP.attn_prefill_ref(q, kc, vc, p0)
    assert (got.double() - want).abs().max() < 1e-5


def test_qk_prep_block_matches_step_reference():
    """Block q/k norm + RoPE + cache write == the decode step's reference, row by row."""
    from tightfit.kernels import attn_decode as A
    from tightfit.kernels import attn_prefill as AP
    g = torch.Generator().manual_seed(4)
    n, H, Hkv, D, p0 = 5, 4, 2, 16, 3
    cos, sin = A.rope_tables(32, 8, 1e4)
    qg, k, v = torch.randn(n, H * 2 * D, generator=g), torch.randn(n, Hkv * D, generator=g), \
        torch.randn(n, Hkv * D, generator=g)
    qn, kn = torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5
    kc, vc = torch.zeros(32, Hkv, D, dtype=torch.float16), torch.zeros(32, Hkv, D, dtype=torch.float16)
    q = AP.qk_prep_block(qg, k, v, qn, kn, cos, sin, kc, vc, p0, 1e-6)
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
    for i in range(n):
        status = torch.tensor([0, 0, p0 + i, 0], dtype=torch.int32)
        qo = torch.empty(H, D)
        A.qk_prep_ref(qg[i], k[i], v[i], qn, kn, cos, sin, kc2, vc2, qo, status, 1e-6)
        assert torch.allclose(qo, q[i], atol=1e-6)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def _rel(a, b):
    a, b = np.asarray(a.detach().cpu(), np.float64), np.asarray(b.detach().cpu(), np.float64)
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30))


@pytest.fixture(scope="module")
def tiny_block_runs(tiny):
    """One verify block (7 tokens after a 5-token prefix, GDN chunks of 3: the block spans three
    chunks) committed at every j, each against the reference fed prefix + block[:j]."""
    ref, exe = ReferenceModel.from_model_file(tiny), _exe(tiny, gdn_chunk=3)
    rng = np.random.default_rng(21)
    prefix = rng.integers(0, tiny.config.n_vocab, 5).tolist()
    block = rng.integers(0, tiny.config.n_vocab, 7).tolist()
    return ref, exe, prefix, block


@pytest.mark.parametrize("j", [1, 3, 4, 7])
def test_forward_block_commit_f32_strict(tiny_block_runs, j):
    """Both sides float32 (F32 weights, fp32 state; K/V fp16 on both sides): after
    forward_block + commit(j) the executor's state equals the reference's after prefix +
    block[:j] to fp32 rounding (recurrent conv/ssm state of every GDN block, position, bank), the
    block's logit rows equal the reference's, and the next tokens' logits too. Bounds are a few
    times the fp32 summation-order noise of these shapes (observed <= 4e-7); a wrong state row,
    an off-by-one in the kept state or conv window, or a stale KV row gives >= 1e-2."""
    ref, exe, prefix, block = tiny_block_runs
    rs, gs = ref.new_state(64), exe.new_state(64)
    exe.forward(prefix, gs, logits="none")
    ref.forward(prefix, rs, logits="none")
    a0 = int(gs.status[0])
    blk = exe.forward_block(block, gs)
    assert gs.pos == 5 and int(gs.status[0]) == a0 and int(gs.status[2]) == 5
    want_rows = ref.forward(block[:j], rs, logits="all")
    assert _rel(blk.logits[:j], want_rows) < 2e-6
    blk.commit(j)
    assert gs.pos == rs.pos == 5 + j and int(gs.status[2]) == 5 + j
    assert int(gs.status[0]) == 1 - a0
    sg, sr = gs.snapshot(), rs.snapshot()
    assert len(sg.conv) == len(sr.conv) > 0
    for cg, cr in zip(sg.conv, sr.conv):
        assert cg.dtype == cr.dtype == torch.float32
        assert _rel(cg, cr) < 2e-6
    for mg, mr in zip(sg.ssm, sr.ssm):
        assert mg.dtype == mr.dtype == torch.float32
        assert _rel(mg, mr) < 2e-6
    # the rejected tokens' KV rows are overwritten by what follows
    nxt = [block[(j + 3) % 7], 17, 4]
    got, want = exe.forward(nxt[:1], gs, logits="last"), ref.forward(nxt[:1], rs, logits="last")
    assert _rel(got, want) < 2e-6
    got, want = exe.forward(nxt[1:], gs, logits="all"), ref.forward(nxt[1:], rs, logits="all")
    assert _rel(got, want) < 2e-6


def test_forward_block_commit_equals_short_forward(tiny_block_runs):
    """commit(j) rebuilds the state after token j-1 from the kept K/U/decays; running the batched
    path on block[:j] from the same start must give the same state (same kernels, same chunk
    starts): equal to 1e-6 (at a chunk end, a chunk start, mid-chunk)."""
    ref, exe, prefix, block = tiny_block_runs
    for j in (2, 3, 4):
        s1, s2 = exe.new_state(64), exe.new_state(64)
        for s in (s1, s2):
            exe.forward(prefix, s, logits="none")
        exe.forward_block(block, s1).commit(j)
        exe.forward(block[:j], s2, logits="none")
        n1, n2 = s1.snapshot(), s2.snapshot()
        assert s1.pos == s2.pos == 5 + j
        for x, y in zip(n1.conv + n1.ssm, n2.conv + n2.ssm):
            assert _rel(x, y) < 1e-6, j


# ---- row-split matrices in prefill: host rows streamed through the ring (issue 8 item 4) --------
def _split_matrix(qtype=12, n_out=45, n_in=512, seed=5):
    """Random raw blocks of a quantized matrix (valid fp16 scales) as [n_out, row_bytes] uint8."""
    from tightfit.quant.traits import traits
    tr = traits(qtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n_out * n_in // tr.block_size, tr.type_size), dtype=np.uint8)
    f16 = {12: [0, 2], 8: [0]}[qtype]
    for off in f16:
        raw[:, off:off + 2] = rng.uniform(0.001, 0.01, raw.shape[0]).astype(np.float16) \
            .view(np.uint8).reshape(-1, 2)
    return raw.reshape(n_out, -1)


def _fake_split_batch(w, qtype, n_in, row_start, min_m):
    """A BatchForward over one matrix whose rows [row_start:] are HostRows-like (host numpy)."""
    from types import SimpleNamespace
    from tightfit.model.batch import BatchForward
    from tightfit.quant.dequant import dequantize
    L = SimpleNamespace(raw=torch.from_numpy(w[:row_start].reshape(-1).copy()), qtype=qtype,
                        n_out=row_start, n_in=n_in, kind="quant")
    host = w[row_start:]
    H = SimpleNamespace(w=host, qtype=qtype, row_start=row_start, row_end=w.shape[0],
                        n_rows=w.shape[0] - row_start, n_in=n_in,
                        gemv=lambda x, out=None: (x.astype(np.float64) @ dequantize(
                            host.reshape(-1), qtype, (host.shape[0], n_in)).T.astype(np.float64)
                        ).astype(np.float32))     # stands in for cpu_gemv (slow first build)
    bf = BatchForward.__new__(BatchForward)
    bf.m = SimpleNamespace(lin={"m": L} if row_start else {}, hostw={"m": H})
    bf.scratch_bytes = 64 << 20
    bf.ring = None
    bf.ring_min_m = min_m
    return bf


@pytest.mark.parametrize("row_start", [0, 7, 32])
def test_ring_streams_host_rows(row_start):
    """M >= ring_min_m: the host suffix goes through the two ring slots in pieces (slot of 5 rows:
    several pieces, the last one partial) and is multiplied like the device rows; equal to the
    whole matrix through gemm_q (fp32 CPU path) to 1e-6."""
    from tightfit.kernels.gemm_q import gemm_q
    from tightfit.model.batch import HostRowRing, ring_line
    qt, n_out, n_in, M = 12, 45, 512, 6
    w = _split_matrix(qt, n_out, n_in)
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((M, n_in)).astype(np.float32))
    bf = _fake_split_batch(w, qt, n_in, row_start, min_m=4)
    bf.ring = HostRowRing(torch.device("cpu"), slot_bytes=5 * w.shape[1] + 3)
    y = bf.lin(x, "m")
    want = gemm_q(x, torch.from_numpy(w.reshape(-1).copy()), qt, n_out, n_in)
    assert y.shape == (M, n_out)
    _close(y, want, 1e-6)
    host_rows = n_out - row_start
    assert bf.ring.pieces == -(-host_rows // 5) and bf.ring.bytes == host_rows * w.shape[1]
    assert ring_line(1 << 20) == {"ring_device": 2 << 20, "ring_pinned_host": 2 << 20}
    with pytest.raises(ValueError):
        HostRowRing(torch.device("cpu"), slot_bytes=10).rows_per_piece(w.shape[1])


def test_split_small_block_uses_cpu_rows():
    """M < ring_min_m: the host rows are computed on the CPU (HostRows.gemv), the device prefix by
    gemm_q, concatenated in row order."""
    from tightfit.kernels.gemm_q import gemm_q_ref
    qt, n_out, n_in, M = 12, 20, 512, 3
    w = _split_matrix(qt, n_out, n_in, seed=9)
    x = np.random.default_rng(2).standard_normal((M, n_in)).astype(np.float32)
    bf = _fake_split_batch(w, qt, n_in, 8, min_m=32)
    y = bf.lin(torch.from_numpy(x), "m")
    assert bf.ring is None and y.shape == (M, n_out)
    _close(y, torch.from_numpy(gemm_q_ref(x, w, qt, n_out, n_in)), 1e-5)


def test_prefill_chunk_from_plan():
    """Without an explicit chunk, a placed model's batch chunk is the plan's priced prefill chunk."""
    from types import SimpleNamespace
    from tightfit.model.batch import BatchForward, DEFAULT_PREFILL_CHUNK
    info = SimpleNamespace(numpy_shape=(4, 8), raw=lambda: np.zeros(4 * 32, np.uint8), qtype=0)
    cfg = SimpleNamespace()
    plan = SimpleNamespace(options=SimpleNamespace(prefill_chunk=384))
    m = SimpleNamespace(config=cfg, _embd_info=info, placed=SimpleNamespace(plan=plan))
    assert BatchForward(m).chunk == 384
    assert BatchForward(m, chunk=100).chunk == 100
    m.placed = None
    assert BatchForward(m).chunk == DEFAULT_PREFILL_CHUNK


@pytest.mark.slow      # interpreted GEMV over a whole small model: > 15 min on a 2-core CPU
@pytest.mark.parametrize("qtype", ["IQ4_XS"])
def test_small_block_matrices_through_gemv(tmp_path, monkeypatch, qtype):
    """Blocks of M <= 16 tokens send every matrix to the GEMV dispatcher (N = M columns: v2 for
    IQ4_XS / Q4_K at M >= 3, v1 for Q6_K), run interpreted here (gemv_on_cpu). The verify block's
    logits match the ReferenceModel (int8 activations: ~1 % relative error) and the gemm_q route
    of the same executor; a partial commit then continues like the reference."""
    if not _gemv_interpreted():
        pytest.skip("needs TRITON_INTERPRET=1")
    from tightfit.kernels import gemv as gm
    import tightfit.model.batch as B
    p = tmp_path / f"small-{qtype}.gguf"
    make_model(p, preset="small", qtype=qtype, layers=4, seed=11)
    mf = open_model(p)
    try:
        ref = ReferenceModel.from_model_file(mf)
        exe = _exe(mf, use_triton=True)
        bf = exe.batcher()
        rng = np.random.default_rng(5)
        prompt = rng.integers(0, mf.config.n_vocab, 6).tolist()
        block = rng.integers(0, mf.config.n_vocab, 5).tolist()
        rs, gs = ref.new_state(128), exe.new_state(128)
        exe.forward(prompt, gs, logits="none")            # gemv_on_cpu still off: gemm_q
        ref.forward(prompt, rs, logits="none")
        snap, gsnap = rs.snapshot(), gs.snapshot()
        blk_q = exe.forward_block(block, gs)               # gemm_q route (CPU default)
        gs.restore(gsnap)
        calls, gemm = [], []
        real_gemv, real_gemm = gm.gemv, B.gemm_q
        monkeypatch.setattr(gm, "gemv", lambda x, *a, **k: calls.append(x.shape[0])
                            or real_gemv(x, *a, **k))
        monkeypatch.setattr(B, "gemm_q", lambda *a, **k: gemm.append(1) or real_gemm(*a, **k))
        bf.gemv_on_cpu = True
        blk = exe.forward_block(block, gs)
        quant = sum(1 for L in exe.lin.values() if L.kind in ("quant", "float"))
        assert gs.pos == 6 and not gemm and calls and set(calls) == {5}
        assert len(calls) == quant                         # every matrix once (incl. the head)
        want = np.asarray(ref.forward(block, rs, logits="all"), np.float64)
        got = np.asarray(blk.logits.detach().cpu(), np.float64)
        rel = np.abs(got - want).max() / np.abs(want).max()
        assert np.isfinite(got).all() and rel < 0.05, rel
        relq = np.abs(got - np.asarray(blk_q.logits.detach().cpu(), np.float64)).max() \
            / np.abs(want).max()
        assert relq < 0.05, relq
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.6
        rs.restore(snap)
        ref.forward(block[:2], rs, logits="none")
        blk.commit(2)
        assert gs.pos == rs.pos == 8
        a = np.asarray(exe.forward([7, 8, 9], gs, logits="all").detach().cpu(), np.float64)
        b = np.asarray(ref.forward([7, 8, 9], rs, logits="all"), np.float64)
        assert np.abs(a - b).max() / np.abs(b).max() < 0.05
        # above the bound: gemm_q again
        calls.clear()
        bf.gemv_max_m = 2
        exe.forward_block(block[:3], gs).commit(3)
        assert not calls and gemm
    finally:
        mf.close()


def test_split_small_block_gemv_prefix(monkeypatch):
    """A row-split matrix in a small block: the device prefix through gemv (gemv_on_cpu), the host
    rows on the CPU, concatenated in row order."""
    if not _gemv_interpreted():
        pytest.skip("needs TRITON_INTERPRET=1")
    from tightfit.kernels import gemv as gm
    from tightfit.kernels.gemm_q import gemm_q_ref
    qt, n_out, n_in, M = 12, 20, 512, 4
    w = _split_matrix(qt, n_out, n_in, seed=9)
    x = np.random.default_rng(2).standard_normal((M, n_in)).astype(np.float32)
    bf = _fake_split_batch(w, qt, n_in, 8, min_m=32)
    bf.gemv_on_cpu = True
    calls = []
    real = gm.gemv
    monkeypatch.setattr(gm, "gemv", lambda x, *a, **k: calls.append(x.shape) or real(x, *a, **k))
    y = bf.lin(torch.from_numpy(x), "m")
    assert calls == [(M, n_in)] and y.shape == (M, n_out)
    _close(y, torch.from_numpy(gemm_q_ref(x, w, qt, n_out, n_in)), 2e-2)
