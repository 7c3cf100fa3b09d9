"""Piecewise graphs of the host-rows decode step (tightfit.model.segments, issue 5).

CPU: a fake capture backend records every op as a replayable call into the open segment; the
segment bookkeeping must cover the eager step's ops once each, in order, with exactly the eager
host calls between segments (D2H closing a segment, the GPU prefix in its own graph, the copies
back opening the next); the capture pass and later REPLAYS of the recorded segments must give
bitwise the logits of the eager split executor (a separate executor on the existing path) and
match the CPU reference model (the outside oracle).
CUDA (skipped without it): the real segment graphs against the eager split step
(TIGHTFIT_HOST_GRAPHS=0: bitwise), the unsplit whole-graph executor and the reference (within
bench/device_tests.py's tolerance for int8 activations), greedy included. Run this file alone on
the device (Triton's interpreter mode is fixed by the first test module imported)."""
from __future__ import annotations

import os

import torch

# Triton picks interpreter mode when its kernel modules are imported (once per session): without
# a GPU they come in interpreted; on the device compiled (run this file alone there)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from _placed import close, ladder_rows, small_q8, split_plan  # noqa: E402

from tightfit.model import segments as S  # noqa: E402
from tightfit.plan.budget import PlanOptions, plan_model  # noqa: E402
from tightfit.plan.placement import inventory_from_gguf  # noqa: E402

CTX = 32
OPS = ("op_norm", "op_swiglu", "op_gnorm", "op_commit", "op_conv", "op_gdn", "op_qk", "op_attn")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    yield from small_q8(tmp_path_factory, "segs", seed=5)


def _plan(path, host_embd: bool = True):
    """Splits on every kind of input (attention/GDN input projections, FFN gate/up), blk.1's
    ffn_down wholly on the host (a host point without a GPU prefix), the head split."""
    kinds = ("ffn_gate", "ffn_up", "attn_qkv", "attn_gate", "attn_q", "attn_v")
    return split_plan(path, CTX, ladder_rows(kinds), host_embd=host_embd)


# ---- CPU: a fake backend ---------------------------------------------------------------------
class FakeGraph:
    def __init__(self) -> None:
        self.calls: list = []          # (label, fn, args, kwargs)
        self.replays = 0

    @property
    def labels(self) -> list:
        return [c[0] for c in self.calls]

    def replay(self) -> None:
        self.replays += 1
        for _, fn, a, k in self.calls:
            fn(*a, **k)


class FakeEvent:
    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


class FakeBackend:
    """Runs everything at once (CPU) and records it into the open graph for replay."""
    event = FakeEvent

    def __init__(self) -> None:
        self.cur = None
        self.opened: list = []
        self.bufs: set = set()                      # the "pinned" buffers handed out

    def begin(self):
        assert self.cur is None, "a segment opened inside another"
        self.cur = FakeGraph()
        self.opened.append(self.cur)
        return self.cur

    def end(self, g):
        assert self.cur is g
        self.cur = None
        return g

    def buffer(self, n):
        b = torch.full((1, n), float("nan"))       # never read before written
        self.bufs.add(b.data_ptr())
        return b

    def host_point(self, p):
        assert self.cur is None, "a host call inside an open segment"
        p.compute()

    def copy(self, dst, src):
        self.call("d2h" if dst.data_ptr() in self.bufs else "h2d", dst.copy_, (src,), {})

    def call(self, label, fn, a, k):
        assert self.cur is not None, f"{label} outside every segment"
        self.cur.calls.append((label, fn, a, k))
        return fn(*a, **k)


def _instrument(exe, sink) -> None:
    """Route the executor's ops and GPU GEMVs through sink(label, fn, args, kwargs)."""
    for name in OPS:
        f = getattr(exe, name)
        setattr(exe, name, lambda *a, _f=f, _n=name, **k: sink(_n, _f, a, k))
    g = exe._gpu_linears

    def gl(x, pairs):
        return sink(("gemv",) + tuple(n for n, _ in pairs if n in exe.lin or n in exe.pcie), g,
                    (x, pairs), {})
    exe._gpu_linears = gl


def _exe(mf, plan, device="cpu", **kw):
    from tightfit.model.executor import GPUModel
    return GPUModel.from_model_file(mf, device=device, n_ctx=CTX, plan=plan, progress=False, **kw)


@pytest.mark.parametrize("pcie", ["", "0.5"])
def test_segments_cover_the_step_and_replay_bitwise(small, monkeypatch, pcie):
    """pcie "0.5": half of each host suffix (whole 64-row groups) is computed by the device
    GEMV (tightfit.model.pcie_rows; the CPU's rows here), in the host point's prefix graph --
    also for blk.1's ffn_down, which has no device rows."""
    path, mf, ref = small
    plan = _plan(path)
    monkeypatch.setenv("TIGHTFIT_PCIE_ROWS", pcie)
    eager = _exe(mf, plan, use_triton=False)
    segd = _exe(mf, plan, use_triton=False)
    assert bool(segd.pcie) == bool(pcie)
    if pcie:
        assert "blk.1.ffn_down.weight" in segd.pcie and "blk.1.ffn_down.weight" not in segd.lin
        assert segd.host_cpu_bytes < segd.host_weight_bytes
    assert not eager.host_graphs and not segd.host_graphs          # CPU: eager by default
    se, ss, rs = eager.new_state(CTX), segd.new_state(CTX), ref.new_state(CTX)
    prompt = [3, 4, 5]
    for m, st in ((eager, se), (segd, ss)):
        m.forward(prompt, st, logits="last")
    ref.forward(prompt, rs, logits="last")

    elog: list = []
    ehost: list = []
    _instrument(eager, lambda lab, fn, a, k: (elog.append(lab), fn(*a, **k))[1])
    hg = eager._host_group
    eager._host_group = lambda names: (ehost.append(names), hg(names))[1]
    fb = FakeBackend()
    _instrument(segd, fb.call)

    toks = [7, 8, 9, 10]
    seg = None
    for i, tok in enumerate(toks):
        elog.clear()
        ehost.clear()
        with torch.no_grad():
            eager.step_token(tok, se, head=True)
            segd._load_embedding(tok)
            if seg is None:                # the capture pass (everything runs as it is recorded)
                seg = S.Recorder(segd, fb).run(ss, "single", True, False)
            else:                          # replays of the recorded segments
                seg.replay()
            ss.advanced(1)
        want = ref.forward([tok], rs, logits="last")
        assert torch.equal(segd.logits, eager.logits), f"token {i}"
        close(segd.logits, want)
        close(eager.logits, want)
        if i == 0:
            # bookkeeping: N host points, N + 1 segments, order of ops = the eager step's
            n = len(seg.points)
            assert n == len(ehost) == len(segd._hgroups) >= 8
            assert len(seg.graphs) == n + 1
            assert [p.names for p in seg.points] == ehost
            flat = []
            for j, g in enumerate(seg.graphs):
                labs = g.labels
                if j < n:
                    assert labs[-1] == "d2h", labs[-3:]           # the segment ends with x
                if j > 0:                                          # and starts with the results
                    k = len(seg.points[j - 1].names)
                    assert labs[:k] == ["h2d"] * k, labs[:k + 1]
                assert labs.count("d2h") == (j < n)
                assert labs.count("h2d") == (len(seg.points[j - 1].names) if j else 0)
                flat += [x for x in labs if x not in ("d2h", "h2d")]
                if j < n:
                    p = seg.points[j]
                    has_gpu = any(name in segd.lin or name in segd.pcie for name in p.names)
                    if p.prefix is not None:
                        assert p.prefix.labels and all(x[0] == "gemv" for x in p.prefix.labels)
                        flat += p.prefix.labels
                    else:
                        assert not has_gpu
            # (the eager step also calls the GPU part of a wholly-host matrix: a no-op)
            assert flat == [x for x in elog if x != ("gemv",)]
            # blk.1 ffn_down: host only (a prefix graph of its PCIe rows when they are on)
            assert any(p.prefix is None for p in seg.points) == (not pcie)
            opened = len(fb.opened)
            assert opened == n + 1 + sum(p.prefix is not None for p in seg.points)
    assert all(g.replays == len(toks) - 1 for g in seg.graphs)
    assert ss.pos == se.pos == rs.pos

    # the profiled replay (TIGHTFIT_HOST_PROFILE's path for segment graphs): disjoint buckets
    # summing to the wall time, one call record per host point, the same logits
    from tightfit.model import host_profile as HP
    prof = HP.HostProfile()
    with torch.no_grad():
        eager.step_token(11, se, head=True)
        prof.step(segd, 11, ss, "single", True, False, run=lambda: seg.replay(prof))
        ss.advanced(1)
    assert torch.equal(segd.logits, eager.logits)
    rec, = prof.tokens
    b = rec["b"]
    assert set(b) == set(HP.BUCKETS) and sum(b.values()) == rec["wall"]
    assert all(v >= 0 for v in b.values()), b
    assert b["replay"] > 0 and b["kernel"] > 0 and b["embed"] > 0
    assert b["x_d2h"] == 0 and b["copy_back"] == 0      # inside the graphs now
    assert [c[0] for c in rec["calls"]] == [p.names for p in seg.points]
    assert sum(c[1] for c in rec["calls"]) == segd.host_cpu_bytes


def test_bad_segment_list_refused():
    with pytest.raises(ValueError):
        S.SegmentStep([object()], [object()])


def test_switch_read_from_env(monkeypatch):
    monkeypatch.setenv("TIGHTFIT_HOST_GRAPHS", "0")
    assert not S.enabled()
    monkeypatch.setenv("TIGHTFIT_HOST_GRAPHS", "1")
    assert S.enabled()
    monkeypatch.delenv("TIGHTFIT_HOST_GRAPHS")
    assert S.enabled()


# ---- CUDA ------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                          reason="needs CUDA (and compiled Triton kernels)")


@cuda
@pytest.mark.parametrize("host_embd", [True, False])
def test_cuda_segment_graphs_match_eager_and_unsplit(small, monkeypatch, host_embd):
    path, mf, ref = small
    plan = _plan(path, host_embd=host_embd)
    monkeypatch.setenv("TIGHTFIT_HOST_GRAPHS", "0")
    eager = _exe(mf, plan, device="cuda")
    monkeypatch.setenv("TIGHTFIT_HOST_GRAPHS", "1")
    segd = _exe(mf, plan, device="cuda")
    assert segd.host_graphs and not eager.host_graphs
    if host_embd:
        assert not segd.device_embedding
    full = plan_model(inventory_from_gguf(path), PlanOptions(ctx=CTX, available=1 << 34, reserve=0,
                                                             prefill_chunk=16, host_embd="no"))
    whole = _exe(mf, full, device="cuda")
    assert not whole.hostw and whole.use_graphs
    sts = [m.new_state(CTX) for m in (eager, segd, whole)]
    rs = ref.new_state(CTX)
    prompt = [3, 4, 5, 6]
    for m, st in zip((eager, segd, whole), sts):
        m.forward(prompt, st, logits="last")
    ref.forward(prompt, rs, logits="last")
    rng = np.random.default_rng(1)
    for i, tok in enumerate(rng.integers(0, ref.config.n_vocab, 5).tolist()):
        head = i != 1                      # one step without the head (its own segment set)
        outs = []
        with torch.no_grad():
            for m, st in zip((eager, segd, whole), sts):
                m.step_token(tok, st, head=head)
                torch.cuda.synchronize()
                outs.append(m.logits.clone())
        want = ref.forward([tok], rs, logits="last")
        if head:
            assert torch.equal(outs[1], outs[0]), f"token {i}: graphs != eager split step"
            # int8 activations on both sides of the split: bench/device_tests.py's bound vs
            # the reference (5e-2), tighter vs the unsplit step (same GPU kernels for most rows)
            close(outs[1], outs[2], 2e-2)
            close(outs[1], want, 5e-2)
    assert ("host-segments", "single", True, False) in sts[1].graphs
    assert ("host-segments", "single", False, False) in sts[1].graphs
    for st in sts:
        st.sync()
    # greedy: device feedback (feed=True segments) with the device embedding, host argmax else
    got = [m.greedy(11, st, 6) for m, st in zip((eager, segd, whole), sts)]
    assert got[1] == got[0]
    assert sts[1].pos == sts[0].pos


@cuda
def test_cuda_segment_profile_buckets(small):
    from tightfit.model import host_profile as HP
    path, mf, _ = small
    segd = _exe(mf, _plan(path), device="cuda")
    assert segd.host_graphs
    prof = segd.host_profile = HP.HostProfile()
    st = segd.new_state(CTX)
    with torch.no_grad():
        for tok in (3, 4, 5):
            segd.step_token(tok, st, head=True)
    seg = st.graphs[("host-segments", "single", True, False)]
    assert len(prof.tokens) == 3
    for rec in prof.tokens:
        b = rec["b"]
        assert set(b) == set(HP.BUCKETS) and sum(b.values()) == rec["wall"]
        assert b["replay"] > 0 and b["kernel"] > 0 and b["x_d2h"] == 0 and b["copy_back"] == 0
        assert len(rec["calls"]) == len(seg.points)
        assert sum(c[1] for c in rec["calls"]) == segd.host_cpu_bytes
