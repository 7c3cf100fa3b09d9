"""The GPU executor with a QUANTIZED KV cache (issue 11 item 2), run on the CPU: torch fallbacks
(quantize-on-write with kvquant.reference.quantize, attn_decode_q_ref) and once the Triton
kernels under TRITON_INTERPRET=1 (kv_write_q + attn_decode_q, single pass and split-K). The
oracle is the CPU ReferenceModel with the SAME kv_type (State stores the bytes natively,
attention_quant reads the codes): logits within 1e-4 relative on an F32 model."""
from __future__ import annotations

import _interp

# interpreted only where there is no GPU (tests/_interp.py has the rule and why)
_interp.interpret_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.api import open_model  # noqa: E402
from tightfit.errors import UserError  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402
from tightfit.runtime.state import StateError  # noqa: E402

# interpreter-only tests follow how the kernels were built (possibly by an earlier test
# module), not the environment now
INTERP = _interp.interpreted("tightfit.kernels.gemv", "tightfit.kernels.norm",
                             "tightfit.kernels.attn_decode", "tightfit.kernels.gdn",
                             "tightfit.kernels.embed", "tightfit.kernels.attn_decode_q",
                             "tightfit.kernels.kv_write_q")

TOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("exq") / "tiny-f32.gguf"
    make_model(p, preset="tiny", qtype="F32", seed=7)
    mf = open_model(p)
    yield mf
    mf.close()


def _exe(mf, kv_type, **kw):
    from tightfit.model.executor import GPUModel
    return GPUModel.from_model_file(mf, device="cpu", n_ctx=64, kv_type=kv_type, **kw)


def _close(a, b, tol=TOL):
    a, b = np.asarray(a.detach().cpu(), np.float64), np.asarray(b.detach().cpu(), np.float64)
    err = np.abs(a - b).max()
    assert err <= tol * (np.abs(b).max() + 1e-9), f"max err {err}, scale {np.abs(b).max()}"


def _decode_step_resynced(exe, gs, ref, rs, tok, flips, tol=TOL):
    """One decode step of the executor and the reference, compared. Both quantize their own fp32
    K/V rows with the same quantizer, but the rows come from different float pipelines (equal to
    ~1e-7, not bitwise), so a value that lies on a code boundary can take the neighbouring code in
    one of them: one such row was seen on a CPU with AVX-512 FP16 / AMX (tq3, position 9), none on
    others. So: when the step's new K/V bytes are equal, the logits must agree to `tol`; when a row
    differs, it must be one row of one layer, the logits may differ by what one code of that row
    moves (1e-2 relative), and the executor's cache takes the reference's bytes, so the next steps
    are compared strictly again on identical codes (what the attention over codes must match).
    Appends (position, layer) of every resynced row to `flips`; returns the reference's argmax."""
    pos = rs.pos
    lr = ref.forward([tok], rs, logits="last")
    lg = exe.forward([tok], gs, logits="last")
    differ = []
    for il in ref.config.attention_ids:
        kb, vb = rs.kv_bytes(il, pos + 1)
        s = rs.attn_slot[il]
        for mine, want in ((gs.k[s, :pos + 1], kb), (gs.v[s, :pos + 1], vb)):
            if not torch.equal(mine[:pos], want[:pos]):
                raise AssertionError(f"layer {il}: rows before {pos} changed")
            if not torch.equal(mine[pos], want[pos]):
                differ.append(il)
                mine[pos].copy_(want[pos])
    if not differ:
        _close(lg, lr, tol)
    else:
        assert len(differ) == 1, f"position {pos}: rows of {differ} differ"
        _close(lg, lr, 1e-2)
        flips.append((pos, differ[0]))
    return int(lr.argmax()), int(lg.argmax())


@pytest.fixture
def small_single_pass():
    """Decoding past SINGLE_PASS_MAX is impractical on the CPU: shrink it (with chunk=4) so the
    steps cross from the single pass into split-K."""
    from tightfit.kernels import attn_decode as A
    old = A.SINGLE_PASS_MAX
    A.SINGLE_PASS_MAX = 6
    yield
    A.SINGLE_PASS_MAX = old


@pytest.mark.parametrize("kv_type", ["q8_0", "tq3"])
def test_prefill_then_decode_matches_reference(tiny, kv_type, small_single_pass):
    ref = ReferenceModel.from_model_file(tiny, kv_type=kv_type)
    exe = _exe(tiny, kv_type, use_triton=False, chunk=4)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, tiny.config.n_vocab, 5).tolist()
    rs, gs = ref.new_state(64), exe.new_state(64)
    assert gs.k.dtype == torch.uint8 and gs.kv_type == kv_type
    # batched prefill (quantize-on-write per chunk, attention over codes)
    _close(exe.forward(prompt, gs, logits="all"), ref.forward(prompt, rs, logits="all"))
    s = rs.attn_slot[tiny.config.attention_ids[0]]
    kb, vb = rs.kv_bytes(tiny.config.attention_ids[0], 5)
    assert torch.equal(gs.k[s, :5], kb) and torch.equal(gs.v[s, :5], vb)
    # decode: positions 5..13, single pass up to T = 6, split-K (chunk 4) after
    tok = int(rng.integers(0, tiny.config.n_vocab))
    flips: list = []
    for _ in range(9):
        tok, tok_g = _decode_step_resynced(exe, gs, ref, rs, tok, flips)
        assert tok == tok_g
    assert len(flips) <= 2, flips
    assert gs.pos == rs.pos == 14
    kb, vb = rs.kv_bytes(tiny.config.attention_ids[-1], 14)
    s = rs.attn_slot[tiny.config.attention_ids[-1]]
    assert torch.equal(gs.k[s, :14], kb) and torch.equal(gs.v[s, :14], vb)
    # a second prefill chunk after a prefix (batched path reads earlier decode rows)
    more = rng.integers(0, tiny.config.n_vocab, 4).tolist()
    _close(exe.forward(more, gs, logits="last"), ref.forward(more, rs, logits="last"))


def test_triton_interpreter_quant_kernels(tiny, small_single_pass):
    """kv_write_q + attn_decode_q (interpreted) in the executor's step: single pass then
    split-K, tq3 (rotating codebook) for K and q8_0 for V."""
    if not INTERP:
        pytest.skip("needs TRITON_INTERPRET=1")
    kv_type = "tq3+q8_0"
    ref = ReferenceModel.from_model_file(tiny, kv_type=kv_type)
    exe = _exe(tiny, kv_type, use_triton=True, chunk=4, batched=False)
    rs, gs = ref.new_state(64), exe.new_state(64)
    toks = [5, 6, 7, 8, 9, 10, 11, 12]       # T = 1..8: single pass to 6, split-K after
    _close(exe.forward(toks, gs, logits="all"), ref.forward(toks, rs, logits="all"))
    il = tiny.config.attention_ids[0]
    kb, vb = rs.kv_bytes(il, 8)
    assert torch.equal(gs.k[rs.attn_slot[il], :8], kb)
    assert torch.equal(gs.v[rs.attn_slot[il], :8], vb)


def test_state_and_loader_checks(tiny, tmp_path):
    exe = _exe(tiny, "q8_0", use_triton=False)
    st = exe.new_state(16)
    c = tiny.config
    from tightfit.kvquant.formats import kv_bytes_per_token
    assert exe.state_bytes(16)["kv"] == 16 * kv_bytes_per_token("q8_0", c.n_head_kv, c.head_dim,
                                                                  len(c.attention_ids))
    assert st.k.numel() + st.v.numel() == exe.state_bytes(16)["kv"]
    f16 = _exe(tiny, None, use_triton=False)
    with pytest.raises(StateError):
        f16.forward([1], st)
    exe.forward([1, 2], st, logits="none")
    snap = st.snapshot(include_kv=True)
    assert snap.kv_type == "q8_0"
    with pytest.raises(StateError):
        f16.new_state(16).restore(snap)
    st2 = exe.new_state(16)
    st2.restore(snap)
    assert torch.equal(st2.k[:, :2], st.k[:, :2])
    with pytest.raises(UserError):
        _exe(tiny, "f32", use_triton=False)
    with pytest.raises(UserError):
        _exe(tiny, "tq9", use_triton=False)
    # loader: --vram with a quantized cache is no longer refused; without a GPU it is the missing
    # CUDA device that is reported, with one the placed engine carries the asked-for format
    from tightfit.runtime.loader import load_engine
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA"):
            load_engine(tiny.path, device="cuda", kv_type="tq3", vram="1GiB")
    else:
        eng = load_engine(tiny.path, device="cuda", kv_type="tq3", vram="1GiB", progress=False)
        assert eng.model.kv_type == "tq3"


# ---- the placed path (--vram / plan=): the cache lives in the plan's arena ---------------------
def _plan(mf, kv_type, ctx=64, attn_chunk=4):
    from tightfit.plan.budget import PlanOptions, plan_model
    from tightfit.plan.placement import inventory_from_gguf
    return plan_model(inventory_from_gguf(mf.path),
                      PlanOptions(ctx=ctx, available=1 << 34, kv_type=kv_type, reserve=0,
                                  prefill_chunk=16, host_embd="no", attn_chunk=attn_chunk))


@pytest.mark.parametrize("kv_type", ["q8_0", "tq3", "tq4+tq3"])
def test_placed_quant_kv_matches_reference(tiny, kv_type, small_single_pass):
    from tightfit.kvquant.formats import get_format, split_kv_type
    from tightfit.model.executor import GPUModel
    c = tiny.config
    plan = _plan(tiny, kv_type)
    exe = GPUModel.from_model_file(tiny, device="cpu", plan=plan, use_triton=False,
                                   progress=False)
    assert exe.kv_type == kv_type and exe.chunk == 4
    ref = ReferenceModel.from_model_file(tiny, kv_type=kv_type)
    rs, gs = ref.new_state(64), exe.new_state(64)
    buf = exe.placed.arena.buffer
    off, n = exe.placed.arena.regions["kv_cache"]
    for t in (gs.k, gs.v):
        assert t.dtype == torch.uint8
        assert buf.data_ptr() + off <= t.data_ptr() < buf.data_ptr() + off + n
    # the plan's KV line = what the state holds = the format's bytes, derived by hand:
    # layers x tokens x heads x (D / group x block bytes), K and V each
    kf, vf = (get_format(f) for f in split_kv_type(kv_type))
    hand = len(c.attention_ids) * 64 * c.n_head_kv * sum(
        c.head_dim // f.group * (f.group * f.bits // 8 + 2) for f in (kf, vf))
    assert gs.k.numel() + gs.v.numel() == plan.line("kv_cache").bytes == hand
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, c.n_vocab, 5).tolist()
    _close(exe.forward(prompt, gs, logits="all"), ref.forward(prompt, rs, logits="all"))
    tok = int(rng.integers(0, c.n_vocab))
    flips: list = []
    for _ in range(5):                       # T = 6..10: single pass, then split-K (chunk 4)
        tok, tok_g = _decode_step_resynced(exe, gs, ref, rs, tok, flips)
        assert tok == tok_g
    assert len(flips) <= 1, flips
    il = c.attention_ids[-1]
    kb, vb = rs.kv_bytes(il, 10)
    assert torch.equal(gs.k[rs.attn_slot[il], :10], kb)
    assert torch.equal(gs.v[rs.attn_slot[il], :10], vb)


def test_placed_kv_type_must_match_plan(tiny):
    from tightfit.model.executor import GPUModel
    plan = _plan(tiny, "f16")
    with pytest.raises(UserError, match="differs from the plan"):
        GPUModel.from_model_file(tiny, device="cpu", plan=plan, kv_type="tq3", progress=False)
    with pytest.raises(UserError, match="attention chunk"):
        GPUModel.from_model_file(tiny, device="cpu", plan=plan, chunk=8, progress=False)
    q = GPUModel.from_model_file(tiny, device="cpu", plan=_plan(tiny, "tq3"), kv_type="TQ3",
                                 use_triton=False, progress=False)
    assert q.kv_type == "tq3"


def test_plan_notes_truthful():
    """`tightfit plan --kv-type tq3`: priced exactly, and the note says where it runs."""
    import tightfit.kvquant as KQ
    from tightfit.plan.budget import kv_format
    from tightfit.plan.placement import inventory_from_preset
    from tightfit.plan.budget import PlanOptions, plan_model
    assert KQ.RUNTIME and kv_format("tq3").runtime and kv_format("q8_0").runtime
    p = plan_model(inventory_from_preset("qwen3.8-27b-seedmix"),
                   PlanOptions(ctx=131072, available=16 << 30, kv_type="tq3"))
    assert p.fits and p.line("kv_cache").bytes == 131072 * 16 * 2 * (1024 // 32 * 14)
    note = " ".join(p.notes)
    # the note carries the device measurement (bench/RESULTS.md session 3 call 4), not a promise
    assert "GPU" in note and "the f16 time" in note and "tq3/tq4 1.8-1.9x" in note
    assert "does not take it" not in note and "CPU path only" not in note
