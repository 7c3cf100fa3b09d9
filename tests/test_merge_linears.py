"""Merged GEMV launches (tightfit.model.merge, TIGHTFIT_MERGE_LINEARS=1): consecutive matrices of
one call site with the same quant type read as ONE matrix over their adjacent bytes, writing one
contiguous output whose slices are the parts' outputs.

The CPU tests run the executor interpreted (TRITON_INTERPRET=1, TIGHTFIT_GEMV=v1) with the GEMV
replaced by a torch one that dequantizes the bytes it is given and reads every byte of the
prepared activation; each output row is a row-wise reduction whose order does not depend on how
many rows the launch has, so a merged launch must give the parts' values BIT FOR BIT, and the
logits of the merged executor must equal the unmerged executor's exactly. The CPU reference
forward (tightfit/model/reference.py) is the outside oracle for both. The expected groups are
written out from the mix each model is generated with, not computed by the code under test."""
from __future__ import annotations

import os

import _interp

if __name__ != "__main__":          # the device A/B at the bottom runs the real kernels
    # interpreted only where there is no GPU (tests/_interp.py has the rule and why)
    _interp.interpret_without_gpu()
else:                               # run as a script from the repository root
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.api import open_model  # noqa: E402
from tightfit.model import merge  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402

# interpreter-only tests follow how the kernels were built (possibly by an earlier test
# module), not the environment now
INTERP = _interp.interpreted("tightfit.kernels.gemv", "tightfit.kernels.norm",
                             "tightfit.kernels.attn_decode", "tightfit.kernels.gdn",
                             "tightfit.kernels.embed")
interp = pytest.mark.skipif(not INTERP, reason="needs TRITON_INTERPRET=1")

# seed-mix-like: GDN qkv/gate IQ4_XS, beta/alpha Q8_0, FFN gate/up IQ4_XS except blocks 1 (up
# Q4_K) and 6 (gate Q5_K), attention q IQ4_XS, k Q6_K, v Q5_K except block 7 (v Q6_K, like
# blk.23/63 of the seed mix); everything else Q5_K
MIX = {"blk.1.ffn_up.weight": "Q4_K", "blk.6.ffn_gate.weight": "Q5_K",
       r"blk\.\d+\.ffn_(gate|up)\.weight": "IQ4_XS",
       r"blk\.\d+\.attn_(qkv|gate)\.weight": "IQ4_XS",
       r"blk\.\d+\.ssm_(alpha|beta)\.weight": "Q8_0",
       r"blk\.\d+\.attn_q\.weight": "IQ4_XS",
       "blk.7.attn_v.weight": "Q6_K",
       r"blk\.\d+\.attn_k\.weight": "Q6_K",
       r"blk\.\d+\.attn_v\.weight": "Q5_K"}
GDN_LAYERS = (0, 1, 2, 4, 5, 6)          # 'small', 8 layers: blocks 3 and 7 are attention


def _expected(beta_alpha: bool = True, skip_ffn=(1, 6)) -> set:
    g = set()
    for il in GDN_LAYERS:
        p = f"blk.{il}."
        g.add((p + "attn_qkv.weight", p + "attn_gate.weight"))
        if beta_alpha:
            g.add((p + "ssm_beta.weight", p + "ssm_alpha.weight"))
    g.add(("blk.7.attn_k.weight", "blk.7.attn_v.weight"))
    for il in range(8):
        if il not in skip_ffn:
            g.add((f"blk.{il}.ffn_gate.weight", f"blk.{il}.ffn_up.weight"))
    return g


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    p = tmp_path_factory.mktemp("merge") / "small-mix.gguf"
    make_model(p, preset="small", qtype="Q5_K", mix=MIX, seed=11)
    mf = open_model(p)
    yield p, mf
    mf.close()


# ---- pure logic -------------------------------------------------------------------------------
def test_runs():
    key = {"a": 1, "b": 1, "c": 2, "d": None, "e": 2, "f": 2, "g": 2, "h": 3}.get
    assert merge.runs("abcdefgh", key) == [("a", "b"), ("e", "f", "g")]
    assert merge.runs("ad", key) == []
    assert merge.runs("dd", key) == []            # None never groups, even with itself


def test_relayout_packs_chain_keeps_others_aligned():
    from tightfit.plan.buffers import Buf, pack
    bufs = [Buf("x", (1, 5)), Buf("u", (1, 13)), Buf("y", (13,)), Buf("zg", (1, 7)),
            Buf("o", (3, 3)), Buf("alpha", (1, 3)), Buf("beta", (1, 3)), Buf("z", (9,))]
    offs, total = pack(bufs, 64)
    order = [(b.name, b.nbytes) for b in bufs]
    moved = merge.relayout(order, offs, [("u", "zg", "beta", "alpha")], 64)
    new = {**offs, **moved}
    assert set(moved) <= {"u", "y", "zg", "o", "alpha", "beta"}
    assert new["u"] == offs["u"]
    assert new["zg"] == new["u"] + 13 * 4
    assert new["beta"] == new["zg"] + 7 * 4
    assert new["alpha"] == new["beta"] + 3 * 4
    spans = sorted((new[b.name], new[b.name] + b.nbytes) for b in bufs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))       # no overlap
    assert spans[-1][1] <= total
    for n in ("y", "o"):
        assert new[n] % 64 == 0
    lo, hi = offs["u"], offs["beta"] + 12        # everything stays inside the chain's old range
    assert all(lo <= new[n] and new[n] + dict(order)[n] <= hi for n in moved)
    # an already contiguous chain moves nothing
    assert merge.relayout(order, offs, [("alpha",)], 64) == {}


def test_relayout_uses_the_last_slots_padding():
    """The 27B's GDN site (buffers as tightfit.plan.buffers carves them at 256 bytes): packed
    without padding, u, zg, beta, alpha end 128 bytes off the alignment, so y, o and on move one
    unit later and the range needs the 64 bytes of padding after the last member (beta). The
    limit at beta's last byte refused the chain, and every GDN site stayed two launches."""
    from tightfit.plan.buffers import Buf, pack
    bufs = [Buf("x", (1, 5120)), Buf("u", (1, 10240)), Buf("y", (1, 10240)), Buf("zg", (1, 6144)),
            Buf("o", (1, 6144)), Buf("on", (1, 6144)), Buf("alpha", (1, 48)), Buf("beta", (1, 48)),
            Buf("g", (1, 17408))]
    offs, total = pack(bufs, 256)
    order = [(b.name, b.nbytes) for b in bufs]
    moved = merge.relayout(order, offs, [("u", "zg", "beta", "alpha")], 256)
    new = {**offs, **moved}
    assert new["zg"] == new["u"] + 10240 * 4
    assert new["beta"] == new["zg"] + 6144 * 4 and new["alpha"] == new["beta"] + 48 * 4
    spans = sorted((new[b.name], new[b.name] + b.nbytes) for b in bufs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))       # no overlap
    assert new["g"] == offs["g"] and spans[-1][1] <= total
    assert all(new[n] % 256 == 0 for n in ("y", "o", "on"))
    assert max(new[n] + dict(order)[n] for n in moved) <= offs["g"]   # inside the old slots


def test_adjacent_and_span():
    buf = torch.arange(64, dtype=torch.uint8)
    a, b, c = buf[0:16], buf[16:48], buf[48:64]
    assert merge.adjacent([a, b, c])
    assert not merge.adjacent([a, c])
    assert not merge.adjacent([a, buf[17:49]])                  # a gap
    assert not merge.adjacent([buf[0:8], buf[8:24]])            # second part misaligned (16)
    assert not merge.adjacent([a, torch.arange(16, dtype=torch.uint8)])   # other storage
    assert torch.equal(merge.span(b, (40,)), buf[16:56])


# ---- the executor -----------------------------------------------------------------------------
def _fast_gemv(monkeypatch, launches: list):
    """gemv_route.gemv_act -> torch (float64, row-wise sums), recording each launch's n_out."""
    import tightfit.kernels.gemv_route as route
    from tightfit.kernels.quantize_act import LAYOUTS, QuantAct
    from tightfit.quant.dequant import dequantize
    cache = {}

    def gemv_act(act, w, qtype, n_out, out, workspace=None):
        assert isinstance(act, QuantAct)
        k = act.k
        key = (w.data_ptr(), w.numel(), int(qtype), int(n_out))
        if key not in cache:
            cache[key] = torch.from_numpy(np.ascontiguousarray(dequantize(
                w.cpu().numpy(), int(qtype), (int(n_out), k)), np.float32)).double()
        pos = torch.from_numpy(np.argsort(LAYOUTS[act.layout])).long()
        q = act.q.reshape(-1, 32).double()[:, pos]
        x = (q * act.d.reshape(-1, 1).double()).reshape(1, k)
        assert out.shape[-1] == n_out and out.is_contiguous()
        out.copy_((cache[key] * x).sum(1).reshape(1, -1).float())
        launches.append(int(n_out))
        return out
    monkeypatch.setattr(route, "gemv_act", gemv_act)


def _greedy(mf, monkeypatch, on: bool, steps: int = 8, **kw):
    from tightfit.model.executor import GPUModel
    monkeypatch.setenv("TIGHTFIT_GEMV", "v1")
    monkeypatch.setenv("TIGHTFIT_MERGE_LINEARS", "1" if on else "0")
    launches: list = []
    _fast_gemv(monkeypatch, launches)
    exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=48, use_triton=True, **kw)
    st = exe.new_state(48)
    tok, rows, toks = 5, [], []
    for _ in range(steps):
        lg = exe.forward([tok], st, logits="last").detach().cpu().clone()
        rows.append(lg)
        tok = int(lg.argmax())
        toks.append(tok)
    return exe, torch.cat(rows), toks, launches


def _check_reference(mf, toks, logits):
    ref = ReferenceModel.from_model_file(mf)
    r = np.asarray(ref.forward([5] + toks[:-1], ref.new_state(48), logits="all"), np.float64)
    got = logits.numpy().astype(np.float64)
    rel = np.abs(got - r).max() / np.abs(r).max()
    assert np.isfinite(got).all() and rel < 0.05, rel


@interp
def test_groups_and_logits_legacy(mixed, monkeypatch):
    _, mf = mixed
    exe0, a, toks0, l0 = _greedy(mf, monkeypatch, False)
    exe1, b, toks1, l1 = _greedy(mf, monkeypatch, True)
    assert not exe0.merged
    assert {M.names for M in exe1.merged.values()} == _expected()
    # each part is a slice of its group's one buffer, and the merged view is exactly those bytes
    for M in exe1.merged.values():
        parts = [exe1.lin[n].raw for n in M.names]
        assert M.raw.data_ptr() == parts[0].data_ptr()
        assert torch.equal(M.raw, torch.cat(parts))
        assert M.n_out == sum(exe1.lin[n].n_out for n in M.names)
        assert torch.equal(parts[0], torch.from_numpy(np.asarray(
            mf.gguf.tensors[M.names[0]].raw(), np.uint8).reshape(-1)))
    assert toks0 == toks1
    assert torch.equal(a, b), (a - b).abs().max()
    # one launch fewer per extra part of every group, per token
    saved = sum(len(g) - 1 for g in _expected())
    assert len(l0) - len(l1) == 8 * saved
    _check_reference(mf, toks1, b)
    # the moved step buffers still have their shapes; outputs of a site are back to back
    assert exe1.u.shape == exe0.u.shape and exe1.alpha.shape == exe0.alpha.shape
    for names in (("u", "zg", "beta", "alpha"), ("qg", "kk", "vv"), ("g", "up")):
        ts = [getattr(exe1, n) for n in names]
        assert merge.outputs_contiguous(ts), names
    base = exe1._ws_region.data_ptr()            # the buffers in between keep their alignment
    assert (exe1.y.data_ptr() - base) % 256 == 0 and (exe1.o.data_ptr() - base) % 256 == 0
    assert exe1.buffers()["zg"].data_ptr() == exe1.zg.data_ptr()


@interp
def test_placed_host_rows_never_merged(mixed, monkeypatch):
    """Placed path: groups only where the arena already put the parts back to back (beta/alpha of
    6 Q8_0 rows = 1632 B are padded to 256 B boundaries, so they stay separate), and never a
    matrix with host rows (blk.2 ffn_up keeps 256 rows on the host)."""
    from tightfit.model.placed import replace_host_rows
    from tightfit.plan.budget import PlanOptions, plan_model
    from tightfit.plan.placement import inventory_from_gguf
    p, mf = mixed
    inv = inventory_from_gguf(p)
    full = plan_model(inv, PlanOptions(ctx=48, available=1 << 34, reserve=0, prefill_chunk=16,
                                       host_embd="no"))
    plan = replace_host_rows(full, {"blk.2.ffn_up.weight": 256}, host_embd=False)
    kw = dict(plan=plan, progress=False, batched=False)
    exe0, a, toks0, _ = _greedy(mf, monkeypatch, False, steps=4, **kw)
    exe1, b, toks1, _ = _greedy(mf, monkeypatch, True, steps=4, **kw)
    assert "blk.2.ffn_up.weight" in exe1.hostw
    got = {M.names for M in exe1.merged.values()}
    assert got == _expected(beta_alpha=False, skip_ffn=(1, 2, 6))
    assert not any(n in exe1.hostw for g in got for n in g)
    assert toks0 == toks1
    assert torch.equal(a, b), (a - b).abs().max()
    _check_reference(mf, toks1, b)


@interp
def test_on_by_default_off_with_env_0(mixed, monkeypatch):
    from tightfit.model.executor import GPUModel
    monkeypatch.delenv("TIGHTFIT_MERGE_LINEARS", raising=False)
    monkeypatch.setenv("TIGHTFIT_GEMV", "v1")
    exe = GPUModel.from_model_file(mixed[1], device="cpu", n_ctx=48, use_triton=True)
    assert exe.merge and exe.merged
    monkeypatch.setenv("TIGHTFIT_MERGE_LINEARS", "0")
    exe = GPUModel.from_model_file(mixed[1], device="cpu", n_ctx=48, use_triton=True)
    assert not exe.merge and not exe.merged


# ---- the device -------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available() or INTERP,
                    reason="needs CUDA (run without TRITON_INTERPRET)")
def test_device_graphs_merged_vs_unmerged(tmp_path, monkeypatch):
    """The captured step with and without merging, 8 greedy steps. Bitwise when the kernels pick
    the same geometry for the merged n_out; gemv_cuda chooses warps per row from n_out
    (pick_wpr), which can change the fp32 summation order of a row, so a difference must stay at
    rounding level and the greedy tokens must agree."""
    from tightfit.model.executor import GPUModel
    p = tmp_path / "small-mix.gguf"
    make_model(p, preset="small", qtype="Q5_K", mix=MIX, seed=11)
    res = {}
    with open_model(p) as mf:
        for on in (False, True):
            monkeypatch.setenv("TIGHTFIT_MERGE_LINEARS", "1" if on else "0")
            exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=64)
            assert exe.use_graphs and bool(exe.merged) == on
            st = exe.new_state(64)
            tok, rows, toks = 5, [], []
            for _ in range(8):
                lg = exe.forward([tok], st, logits="last").float().cpu().clone()
                rows.append(lg)
                tok = int(lg.argmax())
                toks.append(tok)
            res[on] = (torch.cat(rows), toks, exe)
            if on:
                assert {M.names for M in exe.merged.values()} == _expected()
        a, ta, _ = res[False]
        b, tb, _ = res[True]
        print("merged == unmerged bitwise:", torch.equal(a, b),
              "max abs diff", float((a - b).abs().max()))
        assert ta == tb
        rel = float((a - b).abs().max() / a.abs().max())
        assert torch.equal(a, b) or rel < 1e-4, rel
        _check_reference(mf, tb, b)


@interp
@pytest.mark.parametrize("names,gemv", [(("ssm_beta", "ssm_alpha"), "auto"),
                                        (("ssm_beta", "ssm_alpha"), "v1")])
def test_real_kernel_merged_rows(mixed, monkeypatch, names, gemv):
    """The premise, on the real (interpreted) GEMV: the bytes of two matrices back to back, run as
    one matrix, give each part's rows (Q8_0 on the small path, layout 100, and on v1)."""
    import tightfit.kernels.gemv_route as route
    monkeypatch.setenv("TIGHTFIT_GEMV", gemv)
    t = mixed[1].gguf.tensors
    parts = [torch.from_numpy(np.asarray(t[f"blk.0.{n}.weight"].raw(), np.uint8).reshape(-1))
             for n in names]
    rows = [int(t[f"blk.0.{n}.weight"].numpy_shape[0]) for n in names]
    qt = int(t[f"blk.0.{names[0]}.weight"].qtype)
    k = int(t[f"blk.0.{names[0]}.weight"].numpy_shape[1])
    lay = route.act_layout(qt)
    assert route.is_small(lay) == (gemv == "auto")
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(3))
    act = route.quantize_into(x, lay, route.new_act(lay, 1, k, "cpu"))
    ws = torch.zeros(route.split_bound(1))
    sep = [route.gemv_act(act, w, qt, r, torch.empty(1, r), ws).clone()
           for w, r in zip(parts, rows)]
    both = route.gemv_act(act, torch.cat(parts), qt, sum(rows), torch.empty(1, sum(rows)), ws)
    sep = torch.cat(sep, 1)
    assert torch.allclose(both, sep, rtol=1e-5, atol=1e-5 * float(sep.abs().max())), \
        (both - sep).abs().max()
    print("bitwise:", torch.equal(both, sep))


# ---- device A/B on a real file (not a test): python3 tests/test_merge_linears.py --path FILE
def _ab(path: str, tokens: int, steps: int) -> dict:
    """One executor built with merging on; the same captured step with its groups (exe.merged)
    and without them (exe.merged = {}: every part launched alone into the same re-laid buffers),
    each on a fresh state (fresh graphs): logits of `tokens` steps and the GPU ms per step."""
    import json
    from tightfit.model.executor import GPUModel
    os.environ["TIGHTFIT_MERGE_LINEARS"] = "1"
    with open_model(path) as mf:
        exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=1024, lazy_check=True)
        groups = exe.merged
        toks = [int(t) for t in np.random.default_rng(0).integers(0, mf.config.n_vocab, tokens)]

        def run():
            st = exe.new_state(tokens + steps + 8)
            outs = []
            with torch.no_grad():
                for t in toks:
                    exe.step_token(t, st, head=True)
                    outs.append(exe.logits.clone())
                torch.cuda.synchronize()
                a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                a.record()
                for i in range(steps):
                    exe.step_token(toks[i % len(toks)], st, head=True)
                b.record()
                torch.cuda.synchronize()
            st.sync()
            return torch.cat(outs).float().cpu(), a.elapsed_time(b) / steps

        on, ms_on = run()
        exe.merged = {}
        off, ms_off = run()
        exe.merged = groups
        _, ms_on2 = run()
    res = dict(groups=len(groups), launches_saved=sum(len(M.names) - 1 for M in groups.values()),
               identical=bool(torch.equal(on, off)), max_abs_diff=float((on - off).abs().max()),
               argmax_same=bool(torch.equal(on.argmax(1), off.argmax(1))),
               ms_merged=ms_on, ms_unmerged=ms_off, ms_merged_again=ms_on2)
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=128)
    a = ap.parse_args()
    _ab(a.path, a.tokens, a.steps)
