"""GPUModel with a placement (issue 5): weights in one arena allocated from the plan, host rows read
in place from the mmap and computed on the CPU (tightfit.kernels.cpu_gemv), host embedding, MTP
excluded, exact cover checked before the first token. Run on the CPU with the torch fallbacks;
logits are compared with tightfit.model.reference.ReferenceModel (the outside oracle, which reads
the file its own way and knows nothing of placements)."""
from __future__ import annotations

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from _placed import close, small_q8  # noqa: E402

from tightfit.api import open_model  # noqa: E402
from tightfit.errors import UserError  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402
from tightfit.plan.budget import PlanOptions, plan_model  # noqa: E402
from tightfit.plan.placement import GPU, HOST, Segment, inventory_from_gguf  # noqa: E402
from tightfit.plan.rowsplit import PlacementError, SPLIT_ROW_QUANTUM  # noqa: E402

# interpreter-only tests follow how the kernels were built (possibly by an earlier test
# module), not the environment now
INTERP = _interp.interpreted("tightfit.kernels.gemv", "tightfit.kernels.norm",
                             "tightfit.kernels.attn_decode", "tightfit.kernels.gdn",
                             "tightfit.kernels.embed")

CTX = 48


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """4-layer 'small' geometry (E=256, n_ff=768): Q8_0 matrices, an MTP block (blk.4)."""
    yield from small_q8(tmp_path_factory, "placed", seed=3, mtp=True)


def _opts(available: int, **kw) -> PlanOptions:
    kw.setdefault("host_embd", "no")
    return PlanOptions(ctx=CTX, available=available, reserve=0, prefill_chunk=16, **kw)


def _full(path) -> tuple:
    inv = inventory_from_gguf(path)
    full = plan_model(inv, _opts(1 << 34))
    return inv, full


def _exe(mf, plan, **kw):
    from tightfit.model.executor import GPUModel
    return GPUModel.from_model_file(mf, device="cpu", n_ctx=CTX, plan=plan, use_triton=False,
                                    progress=False, **kw)


def _compare(exe, ref, seed: int, n_prompt: int = 7, n_decode: int = 3) -> None:
    """Batched prefill (logits of every row) then one-token steps, both against the reference."""
    V = ref.config.n_vocab
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, V, n_prompt).tolist()
    rs, gs = ref.new_state(CTX), exe.new_state(CTX)
    close(exe.forward(prompt, gs, logits="all"), ref.forward(prompt, rs, logits="all"))
    for tok in rng.integers(0, V, n_decode).tolist():
        close(exe.forward([tok], gs, logits="last"), ref.forward([tok], rs, logits="last"))
    assert gs.pos == rs.pos == n_prompt + n_decode


def _in_arena(t: torch.Tensor, exe) -> bool:
    buf = exe.placed.arena.buffer
    lo = buf.data_ptr()
    return lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= lo + buf.numel()


def test_everything_on_device_one_arena_mtp_excluded(small):
    path, mf, ref = small
    inv, plan = _full(path)
    pl = plan.placement
    assert not pl.host_segments() and not plan.host_embd
    mtp = [n for n in inv.tensors if n.startswith("blk.4.")]
    assert mtp and set(pl.excluded) == set(mtp)
    exe = _exe(mf, plan)
    assert not exe.hostw and not any(n.startswith("blk.4.") for n in exe.lin)
    # every matrix, every F32 vector, the KV cache and the recurrent banks alias the ONE arena
    for L in exe.lin.values():
        assert _in_arena(L.raw, exe) and L.n_out == inv.tensors[L.info.name].n_rows
    for name, v in exe.vec.items():
        assert _in_arena(v, exe), name
    st = exe.new_state(CTX)
    for t in (st.k, st.v, st.conv, st.ssm, st.status):
        assert _in_arena(t, exe)
    rep = exe.placed.upload
    assert rep.bytes == plan.line("weights").bytes == pl.gpu_bytes
    assert rep.bytes == sum(t.nbytes for n, t in inv.tensors.items() if n not in mtp)
    del st
    _compare(exe, ref, seed=1)


def test_host_embedding(small):
    path, mf, ref = small
    inv, full = _full(path)
    plan = plan_model(inv, _opts(1 << 34, host_embd="yes"))
    segs = plan.placement.segments["token_embd.weight"]
    assert [s.where for s in segs] == [HOST]
    exe = _exe(mf, plan)
    assert exe.placed.embedding_on_host() and "token_embd.weight" not in exe.hostw
    assert exe.placed.arena.nbytes < full.arena_bytes     # the table is not in the arena
    _compare(exe, ref, seed=2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ffn_rows_split_random_budgets(small, seed):
    """The planner squeezed by a random deficit splits FFN matrices (output rows, at multiples of
    64 rows = whole blocks): GPU prefix in the arena, host suffix computed from the mmap."""
    path, mf, ref = small
    inv, full = _full(path)
    rng = np.random.default_rng(seed)
    ffn = sum(t.nbytes for n, t in inv.tensors.items() if ".ffn_" in n and not n.startswith("blk.4."))
    deficit = int(rng.uniform(0.05, 0.9) * ffn)
    plan = plan_model(inv, _opts(full.total_bytes - deficit))
    assert plan.fits
    split = plan.placement.split_tensors()
    assert split and all(".ffn_" in n for n in split), split
    for n in split:
        for s in plan.placement.segments[n]:
            assert s.row_start % SPLIT_ROW_QUANTUM == 0
            assert s.byte_start % inv.tensors[n].block_bytes == 0
    exe = _exe(mf, plan)
    assert set(exe.hostw) == set(split)
    assert exe.host_weight_bytes == plan.placement.host_bytes > 0
    _compare(exe, ref, seed=10 + seed)


def test_chosen_splits_everywhere(small):
    """Random block-aligned splits of FFN, mixer and head matrices, some matrices wholly on the
    host, plus the host embedding (via tightfit.model.placed.replace_host_rows)."""
    from tightfit.model.placed import replace_host_rows
    path, mf, ref = small
    inv, full = _full(path)
    rng = np.random.default_rng(5)
    rows = {}
    for il in range(4):
        for k in ("ffn_gate", "ffn_up", "ffn_down", "attn_qkv", "ssm_out", "attn_q",
                  "attn_output"):
            t = inv.tensors.get(f"blk.{il}.{k}.weight")
            if t is None:
                continue
            q = t.n_rows // SPLIT_ROW_QUANTUM
            rows[t.name] = int(rng.integers(1, q + 1)) * SPLIT_ROW_QUANTUM   # q: whole matrix
    rows["blk.1.ffn_down.weight"] = inv.tensors["blk.1.ffn_down.weight"].n_rows
    V = inv.tensors["output.weight"].n_rows
    rows["output.weight"] = V - V // SPLIT_ROW_QUANTUM // 2 * SPLIT_ROW_QUANTUM   # GPU prefix
    plan = replace_host_rows(full, rows, host_embd=True)
    exe = _exe(mf, plan)
    assert "blk.1.ffn_down.weight" not in exe.lin and "blk.1.ffn_down.weight" in exe.hostw
    assert exe.lin["output.weight"].n_out == V // SPLIT_ROW_QUANTUM // 2 * SPLIT_ROW_QUANTUM
    _compare(exe, ref, seed=20, n_prompt=5, n_decode=2)


def test_batched_host_rows_grouped_per_input(small, monkeypatch):
    """In the batched forward (prefill chunks, speculative verify blocks) the host rows of matrices
    that read the same x run as ONE CPU call per input (placed.HostGroup), like the step: a
    4-token block with ffn_gate / ffn_up / attn_qkv split makes one group call per (layer, input),
    its logits bit-identical to computing each matrix's host rows on its own."""
    import tightfit.model.placed as P
    from tightfit.model.placed import replace_host_rows
    path, mf, ref = small
    inv, full = _full(path)
    rows = {}
    for il in range(4):
        for k in ("ffn_gate", "ffn_up", "attn_qkv", "attn_gate"):
            t = inv.tensors.get(f"blk.{il}.{k}.weight")
            if t is not None:
                rows[t.name] = t.n_rows // SPLIT_ROW_QUANTUM // 2 * SPLIT_ROW_QUANTUM or \
                    SPLIT_ROW_QUANTUM
    exe = _exe(mf, replace_host_rows(full, rows))
    calls = []
    real = P.HostGroup.gemv

    def counted(self, x, out=None):
        calls.append(tuple(h.name for h in self.rows))
        return real(self, x, out)
    monkeypatch.setattr(P.HostGroup, "gemv", counted)
    prompt = [3, 9, 27, 81]
    gs = exe.new_state(CTX)
    grouped = exe.forward(prompt, gs, logits="all").detach().clone()
    n_groups = len(calls)
    # the same block with every matrix's host rows alone (the pre-session-11 path)
    B = exe.batcher()
    monkeypatch.setattr(type(B), "lin_many", lambda self, x, names: [self.lin(x, n) for n in names])
    gs2 = exe.new_state(CTX)
    alone = exe.forward(prompt, gs2, logits="all")
    assert torch.equal(grouped, alone)
    ffn = {c for c in calls[:n_groups] if any(".ffn_gate." in n for n in c)}
    mix = {c for c in calls[:n_groups] if any(".attn_qkv." in n for n in c)}
    assert all(len(c) == 2 for c in ffn | mix), calls
    assert len(ffn) == 4 and len(mix) == sum(1 for il in range(4)
                                             if f"blk.{il}.attn_qkv.weight" in rows)
    rs = ref.new_state(CTX)
    close(grouped, ref.forward(prompt, rs, logits="all"))


def test_placed_prefill_through_the_ring(small, monkeypatch):
    """By default a placed model's blocks of >= ring_min_m tokens send the host rows of split
    matrices to the device through the host-row ring (here the CPU's synchronous form of the same
    piece loop) instead of multiplying them on the CPU: logits of every row against the
    reference, and the ring really carried them (pieces counted); TIGHTFIT_PLACED_RING=0 turns
    it off."""
    from tightfit.model.placed import replace_host_rows
    path, mf, ref = small
    inv, full = _full(path)
    rows = {}
    for il in range(4):
        for k in ("ffn_gate", "ffn_up", "ffn_down"):
            t = inv.tensors[f"blk.{il}.{k}.weight"]
            rows[t.name] = t.n_rows // SPLIT_ROW_QUANTUM // 2 * SPLIT_ROW_QUANTUM
    rows["blk.2.ffn_up.weight"] = inv.tensors["blk.2.ffn_up.weight"].n_rows   # wholly on the host
    exe = _exe(mf, replace_host_rows(full, rows))
    monkeypatch.delenv("TIGHTFIT_PLACED_RING", raising=False)      # the default: on
    B = exe.batcher()
    B.ring_min_m = 8
    prompt = np.random.default_rng(4).integers(0, ref.config.n_vocab, 12).tolist()
    gs, rs = exe.new_state(CTX), ref.new_state(CTX)
    close(exe.forward(prompt, gs, logits="all"), ref.forward(prompt, rs, logits="all"))
    assert B.ring is not None and B.ring.pieces >= 12        # 3 host matrices x 4 layers
    monkeypatch.setenv("TIGHTFIT_PLACED_RING", "0")           # the CPU path: no further pieces
    n = B.ring.pieces
    exe.forward(prompt, exe.new_state(CTX), logits="last")
    assert B.ring.pieces == n


def _assert_refused(mf, plan, monkeypatch, match):
    """Construction fails with PlacementError before the arena is allocated (so before any
    token could run)."""
    import tightfit.model.placed as P

    def no_arena(*a, **k):
        raise AssertionError("the arena was allocated before the exact-cover check")
    monkeypatch.setattr(P, "Arena", no_arena)
    with pytest.raises(PlacementError, match=match):
        _exe(mf, plan)


def test_exact_cover_failure_refused_before_first_token(small, monkeypatch):
    import dataclasses
    path, mf, ref = small
    inv, full = _full(path)
    from tightfit.model.placed import replace_host_rows
    name = "blk.2.ffn_gate.weight"
    plan = replace_host_rows(full, {name: 256})
    g, h = plan.placement.segments[name]
    rb = inv.tensors[name].row_bytes
    bad = {
        "gap": [g, Segment(name, HOST, h.row_start + 64, h.row_end, h.byte_start + 64 * rb,
                           h.byte_end)],
        "overlap": [g, Segment(name, HOST, h.row_start - 64, h.row_end, h.byte_start - 64 * rb,
                               h.byte_end)],
        "multiple of": [Segment(name, GPU, 0, g.row_end - 1, 0, g.byte_end - rb, g.arena_offset),
                        Segment(name, HOST, g.row_end - 1, h.row_end, g.byte_end - rb,
                                h.byte_end)],
        "uncovered": [g],
    }
    for match, segs in bad.items():
        pl = dataclasses.replace(plan.placement, segments={**plan.placement.segments, name: segs})
        _assert_refused(mf, dataclasses.replace(plan, placement=pl), monkeypatch, match)
    # a tensor the executor reads, excluded by the placement
    segs = dict(plan.placement.segments)
    del segs["blk.0.ffn_up.weight"]
    pl = dataclasses.replace(plan.placement, segments=segs,
                             excluded=plan.placement.excluded + ("blk.0.ffn_up.weight",))
    _assert_refused(mf, dataclasses.replace(plan, placement=pl), monkeypatch, "leaves it out")


def test_plan_must_describe_this_file(small, tmp_path):
    path, mf, ref = small
    other = tmp_path / "other.gguf"
    make_model(other, preset="small", layers=4, qtype="Q4_0", seed=3)
    inv, plan = _full(other)
    with pytest.raises(UserError, match="not"):
        _exe(mf, plan)
    from tightfit.plan.placement import inventory_from_preset
    pinv = inventory_from_preset("tiny")
    pplan = plan_model(pinv, _opts(1 << 34))
    with pytest.raises(UserError, match="no weights"):
        _exe(mf, pplan)


def test_loader_and_cli_options(small):
    import argparse

    from tightfit.commands.common import add_model_args
    from tightfit.model.placed import plan_for, vram_bytes
    from tightfit.runtime.loader import load_engine
    path, mf, ref = small
    with pytest.raises(UserError, match="--device cuda"):
        load_engine(str(path), device="cpu", vram="16GiB")
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    assert ap.parse_args(["--vram", "12GiB"]).vram == "12GiB"
    assert vram_bytes("12GiB") == 12 << 30
    plan = plan_for(path, CTX, "1GiB", device="cpu")
    assert plan.fits and plan.options.ctx == CTX
    from tightfit.errors import PlanError
    with pytest.raises(PlanError):
        plan_for(path, CTX, "1MiB", device="cpu", split=False)


def test_triton_interpreter_split(tmp_path):
    """The Triton kernels (interpreted) on the GPU prefixes, cpu_gemv on the host suffixes: tiny
    F32 model, FFN gate/up split at row 64 of 96, host embedding."""
    from tightfit.model.executor import GPUModel
    from tightfit.model.placed import replace_host_rows
    if not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    p = tmp_path / "tiny-f32.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=7)
    inv = inventory_from_gguf(p)
    full = plan_model(inv, _opts(1 << 34))
    plan = replace_host_rows(full, {"blk.7.ffn_gate.weight": 32, "blk.7.ffn_up.weight": 32,
                                    "blk.3.ffn_down.weight": 64}, host_embd=True)
    with open_model(p) as mf:
        ref = ReferenceModel.from_model_file(mf)
        exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=CTX, plan=plan, use_triton=True,
                                       progress=False, batched=False)
        assert exe.lin["blk.7.ffn_up.weight"].kind == "float"
        rs, gs = ref.new_state(CTX), exe.new_state(CTX)
        close(exe.forward([5, 6, 7], gs, logits="all"), ref.forward([5, 6, 7], rs, logits="all"),
               1e-4)
