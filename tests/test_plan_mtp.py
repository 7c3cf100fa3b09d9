"""The MTP (nextn) drafter in the plan: its block's weights and the `mtp` line (its own one-layer
KV cache + step scratch) are priced, count in every fit and max-ctx computation, and a budget that
cannot hold the whole model with them on the GPU is refused (no host rows, a reason naming MTP).
Expected figures are written out by hand from the 27B geometry (spec/qwen35.md §0) and the byte
counts of the inventory's tensors."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tightfit.errors import PlanError, UserError
from tightfit.plan.budget import GiB, MiB, PlanOptions, plan_model, require_fit
from tightfit.plan.placement import inventory_from_gguf, inventory_from_preset

SEED = "qwen3.8-27b-seedmix"       # the 27B with its MTP block blk.64
RESERVE = 256 * MiB                # fixed, so that budgets can be set to the byte
CHUNK = 64                         # the smallest prefill chunk: the planner cannot lower it to fit


@pytest.fixture(scope="module")
def inv():
    return inventory_from_preset(SEED)


def opts(**kw) -> PlanOptions:
    base = dict(ctx=8192, available=64 * GiB, reserve=RESERVE)
    base.update(kw)
    return PlanOptions(**base)


def aligned(n: int) -> int:
    """Arena regions start at multiples of 256 B."""
    return -(-n // 256) * 256


def mtp_block(inv):
    return [t for name, t in inv.tensors.items() if name.startswith("blk.64.")]


# ---- the line --------------------------------------------------------------------------------
def test_mtp_line_hand_computed(inv):
    line = plan_model(inv, opts(include_mtp=True)).line("mtp")
    # one full-attention layer, fp16 K and V: ctx x (K, V) x n_head_kv (4) x head_dim (256) x 2 B
    kv = 8192 * 2 * 4 * 256 * 2
    assert kv == 32 * MiB
    assert line.details["kv"] == kv
    # eager pair chunk: 64 MiB of fp32 scores x 3 (scores, masked, softmax) over [H=24, ctx]
    per_pair = 3 * 24 * 8192 * 4
    assert line.details["pair_chunk"] == (64 << 20) // per_pair == 28
    # fp32 intermediates per pair but its scores (E 5120, F 17408, H 24, D 256, Hkv 4), as
    # tightfit.plan.mtp lists them: 12 E of rows, 4 H D of q|gate, 4 H D of q/o temporaries,
    # 6 Hkv D of k/v, 4 F of the FFN, 2 (2E + F) int8 GEMV copies
    row = (12 * 5120 + 4 * 24 * 256 + 4 * 24 * 256 + 6 * 4 * 256 + 4 * 17408
           + 2 * (2 * 5120 + 17408)) * 4
    assert row == 966_656
    blk = 2 << 20                                     # the caching allocator's small blocks
    # the captured step: its row, 3 x [H, ctx] scores (768 KiB each) and 2 x logits (970 KiB):
    # all under 1 MiB, so all in 2 MiB blocks
    step = -(-(row + 64 + 3 * 24 * 8192 * 4 + 2 * 248320 * 4) // blk) * blk
    assert step == 3 * blk
    # the eager chunk of 28 pairs: rows + last logits in small blocks, 3 x 21 MiB of scores in
    # large segments (each rounded to 2 MiB: 22,020,096 B -> 11 blocks)
    small = -(-(28 * row + 248320 * 4) // blk) * blk
    big = 3 * 11 * blk
    assert line.details["scratch"] == step + small + big == 100 * MiB
    assert line.bytes == kv + line.details["scratch"]


def test_mtp_line_scales_with_ctx(inv):
    a = plan_model(inv, opts(ctx=8192, include_mtp=True)).line("mtp")
    b = plan_model(inv, opts(ctx=16384, include_mtp=True)).line("mtp")
    assert b.details["kv"] == 2 * a.details["kv"]
    assert b.details["pair_chunk"] == (64 << 20) // (3 * 24 * 16384 * 4) == 14
    assert b.bytes > a.bytes


def test_no_mtp_line_without_mtp(inv):
    p = plan_model(inv, opts())
    assert "mtp" not in [l.key for l in p.lines]
    assert "mtp_bytes" not in p.to_json()
    assert not any("MTP" in n for n in p.notes)


def test_weights_and_bill_with_mtp(inv):
    off = plan_model(inv, opts(host_embd="no"))
    on = plan_model(inv, opts(include_mtp=True))
    assert off.fits and on.fits and on.host_weights_bytes == 0 and not on.host_embd
    block = mtp_block(inv)
    assert len(block) == 15 and on.placement.excluded == ()
    raw = sum(t.nbytes for t in block)
    pad = sum(aligned(t.nbytes) - t.nbytes for t in block)
    assert on.line("weights").bytes - off.line("weights").bytes == raw
    assert on.line("alignment").details["weights"] - off.line("alignment").details["weights"] == pad
    # the drafter's bytes are the mtp line; nothing else of the bill moves at this budget
    for key in ("kv_cache", "recurrent_state", "workspace", "scratch", "staging", "reserve"):
        assert on.line(key).bytes == off.line(key).bytes, key
    mtp = on.line("mtp").bytes
    assert on.total_bytes - off.total_bytes == raw + pad + mtp + (aligned(mtp) - mtp)
    assert on.to_json()["mtp_bytes"] == mtp
    assert any("MTP drafter costs" in n for n in on.notes)


# ---- refusal ---------------------------------------------------------------------------------
def test_exact_budget_boundary(inv):
    """The mtp line counts in the fit: the whole-GPU bill with MTP fits at its own total and not
    one byte below."""
    full = plan_model(inv, opts(include_mtp=True, prefill_chunk=CHUNK))
    at = plan_model(inv, opts(available=full.total_bytes, include_mtp=True, prefill_chunk=CHUNK))
    assert at.fits and at.total_bytes == full.total_bytes
    below = plan_model(inv, opts(available=full.total_bytes - 1, include_mtp=True,
                                 prefill_chunk=CHUNK))
    assert not below.fits


def test_refused_where_the_model_alone_fits(inv):
    # the model wholly on the GPU at the smallest chunk: the MTP plan has no smaller one to take
    budget = plan_model(inv, opts(host_embd="no", prefill_chunk=CHUNK)).total_bytes
    off = plan_model(inv, opts(available=budget, prefill_chunk=CHUNK))
    assert off.fits and off.host_weights_bytes == 0 and not off.host_embd
    on = plan_model(inv, opts(available=budget, include_mtp=True, prefill_chunk=CHUNK))
    assert not on.fits
    # nothing moved to the host: the drafter cannot run with host rows
    assert on.host_weights_bytes == 0 and not on.host_embd and on.placement.split_tensors() == []
    w = on.would_fit["mtp"]
    assert w["over_bytes"] == on.total_bytes - budget > 0
    assert w["weights_bytes"] == sum(aligned(t.nbytes) for t in mtp_block(inv))
    assert w["line_bytes"] == aligned(on.line("mtp").bytes)
    assert on.would_fit["move_to_host"] is None
    assert any("MTP drafter needs the whole model on the GPU" in n for n in on.notes)
    with pytest.raises(PlanError) as e:
        require_fit(on)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "MTP" in msg and "--spec" in msg and "blk.64" in msg


def test_refused_where_the_model_alone_needs_host_rows(inv):
    budget = int(13.5e9)
    off = plan_model(inv, opts(available=budget))
    assert off.fits and off.host_weights_bytes > 0          # embedding + FFN rows on the host
    on = plan_model(inv, opts(available=budget, include_mtp=True))
    assert not on.fits and on.host_weights_bytes == 0 and on.placement.split_tensors() == []
    assert on.would_fit["max_ctx"] == on.would_fit["max_ctx_with_moves"]   # moves do not help


def test_max_ctx_shrinks_with_mtp(inv):
    o = opts(available=24 * GiB, host_embd="no", split=False)
    off = plan_model(inv, o)
    on = plan_model(inv, replace(o, include_mtp=True))
    assert 8192 < on.max_ctx_that_fits < off.max_ctx_that_fits < inv.config.n_ctx_train
    assert on.max_ctx_same_placement < off.max_ctx_same_placement
    # the search prices the mtp line at each ctx: its answer is the exact edge of the bill
    edge = on.max_ctx_that_fits
    assert plan_model(inv, replace(o, ctx=edge, include_mtp=True)).fits
    assert not plan_model(inv, replace(o, ctx=edge + 1, include_mtp=True)).fits


def test_mtp_options_refused():
    tiny = inventory_from_preset("tiny")                     # no MTP block
    with pytest.raises(UserError, match="no MTP block"):
        plan_model(tiny, PlanOptions(ctx=256, available=GiB, include_mtp=True))
    seed = inventory_from_preset(SEED)
    with pytest.raises(UserError, match="whole model on the GPU"):
        plan_model(seed, opts(host_embd="yes", include_mtp=True))


# ---- tightfit plan --mtp ---------------------------------------------------------------------
def test_cli_plan_mtp(capsys, monkeypatch):
    from tightfit.cli import main
    monkeypatch.setenv("COLUMNS", "240")                      # rich: no wrapped labels
    assert main(["plan", "--preset", SEED, "--vram", "24GiB", "--mtp"]) == 0
    out = capsys.readouterr().out
    assert "MTP drafter: KV cache + step scratch" in out and "MTP drafter costs" in out
    assert main(["plan", "--preset", SEED, "--vram", "24GiB", "--mtp", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mtp_bytes"] > 8192 * 2 * 4 * 256 * 2 and d["placement"]["excluded"] == []
    assert main(["plan", "--preset", SEED, "--vram", "24GiB"]) == 0
    assert "MTP drafter" not in capsys.readouterr().out
    # short: exit 2, the bill printed, the reason names the drafter
    assert main(["plan", "--preset", SEED, "--vram", "15.6GiB", "--mtp"]) == 2
    cap = capsys.readouterr()
    assert "does not fit" in cap.out and "MTP drafter needs the whole model" in cap.err


# ---- the loader and serve --------------------------------------------------------------------
def test_plan_for_mtp(tiny_gguf):
    from tightfit.model.placed import plan_for
    p = plan_for(tiny_gguf, 256, "1GiB", device="cpu", mtp=True)
    assert p.options.include_mtp and p.line("mtp").bytes > 0 and p.placement.excluded == ()
    no = plan_for(tiny_gguf, 256, "1GiB", device="cpu")
    assert not no.options.include_mtp and no.placement.excluded
    # a budget that holds the model wholly on the GPU but not with the drafter
    inv = inventory_from_gguf(tiny_gguf)
    budget = plan_model(inv, PlanOptions(ctx=256, available=GiB, host_embd="no", reserve=0,
                                         prefill_chunk=CHUNK)).total_bytes
    kw = dict(device="cpu", reserve=0, prefill_chunk=CHUNK)
    assert plan_for(tiny_gguf, 256, budget, **kw).fits
    with pytest.raises(PlanError, match="MTP drafter"):
        plan_for(tiny_gguf, 256, budget, mtp=True, **kw)


def test_load_engine_refuses_plan_without_mtp(tiny_gguf):
    """Checked before anything touches CUDA, so it runs on any machine."""
    from tightfit.runtime.loader import load_engine
    plan = plan_model(inventory_from_gguf(tiny_gguf), PlanOptions(ctx=256, available=GiB))
    with pytest.raises(UserError, match="make the plan with MTP"):
        load_engine(str(tiny_gguf), device="cuda", plan=plan, mtp=True)


@pytest.mark.parametrize("spec,device,want", [("ngram,mtp", "cuda", True),
                                              ("ngram,mtp", "cpu", False),
                                              ("ngram,suffix", "cuda", False)])
def test_serve_asks_for_mtp(tiny_gguf, monkeypatch, spec, device, want):
    """serve --spec ...,mtp on cuda loads the MTP block (through load_from_args -> load_engine);
    with --vram it also plans verify blocks of --draft-max + 1 tokens; the server itself is
    stubbed: only the loader it is given is run."""
    import uvicorn

    import tightfit.runtime.loader as loader_mod
    import tightfit.runtime.spec as spec_mod
    import tightfit.server.app as app_mod
    from tightfit.cli import main
    calls, loaders = [], []
    monkeypatch.setattr(loader_mod, "load_engine", lambda path, **kw: calls.append(kw) or "engine")
    monkeypatch.setattr(spec_mod, "build_speculative", lambda engine, drafters, **kw: engine)
    monkeypatch.setattr(app_mod, "create_app", lambda loader, **kw: loaders.append(loader) or object())

    class Server:
        def __init__(self, config):
            pass

        def run(self, sockets):
            for s in sockets:
                s.close()
    monkeypatch.setattr(uvicorn, "Server", Server)
    rc = main(["serve", "-m", str(tiny_gguf), "--port", "0", "--device", device, "--spec", spec])
    assert rc == 0 and len(loaders) == 1
    assert loaders[0]() == "engine"
    assert calls[0].get("mtp", False) is want
    assert "batch" not in calls[0]                      # no --vram: no plan to price it in
    if device == "cuda":
        rc = main(["serve", "-m", str(tiny_gguf), "--port", "0", "--device", device, "--spec", spec,
                   "--vram", "8GiB", "--draft-max", "5"])
        assert rc == 0 and loaders[1]() == "engine"
        assert calls[1]["batch"] == 6 and calls[1]["vram"] == "8GiB"
