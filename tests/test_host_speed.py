"""Host-speed-aware row placement (issue 5, 8 GiB seed-mix decode): the per-format throughput
table, the host ms/token estimate, and the placer's choice of which rows go to the host.

Expectations come from outside the code under test: byte counts from gguf-py's quant-size table,
the seed-mix recipe of shared/bench/seed-mix.md (which blocks hold which low-bit formats), the
GB/s of the device profile quoted below, and the bench's own plan options (ctx 4096, 8 GiB)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from tightfit.errors import UserError
from tightfit.plan import host_speed as HS
from tightfit.plan.budget import GiB, PlanOptions, plan_model
from tightfit.plan.placement import build_placement, inventory_from_preset, spec_for
from tightfit.plan.rowsplit import FFN_KINDS, MIXER_KINDS, check_exact_cover, split_candidates

SEED = "qwen3.8-27b-seedmix"
# the device profile of 2026-11-29 (bench/plan_vram.py --budgets 8GiB, 16 threads): GB/s by group
PROFILE_GBPS = {"Q5_K": 39.1, "IQ4_XS": 40.5, "Q6_K": 41.9, "IQ2_S": 7.8, "IQ3_XXS": 9.0,
                "IQ3_S": 8.1, "Q3_K": 7.5}
# its host MB per token, all groups together (the embedding row is not a GEMV)
PROFILE_HOST_MB = 2328.5 + 2281.1 + 2272.8 + 228.4 + 136.5 + 584.9 + 76.6 + 25.9
# the issue: the portable low-bit host kernels, and the SIMD ones
LOWBIT = {"IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "Q2_K", "Q3_K"}
FAST = {"IQ4_XS", "Q4_K", "Q5_K", "Q6_K"}
# seed-mix.md: the FFN matrices of those low-bit formats
SEED_LOWBIT_FFN = ({"blk.0.ffn_gate", "blk.12.ffn_gate"}
                   | {f"blk.13.{k}" for k in FFN_KINDS}
                   | {f"blk.{i}.{k}" for i in range(14, 18) for k in FFN_KINDS}
                   | {"blk.18.ffn_up", "blk.19.ffn_up"})


@pytest.fixture(scope="module")
def inv():
    return inventory_from_preset(SEED)


@pytest.fixture(scope="module")
def plans(inv):
    """The 8 GiB plan as bench/plan_vram.py made it when the profile was taken (plan_for: ctx 4096,
    defaults), new and old split order. Its bill had no cuBLAS workspace (session 17 added it to
    the scratch line; CUBLAS_WORKSPACE_CONFIG=":0:0" prices it at 0), so its placement is the
    profiled one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
        return {order: plan_model(inv, PlanOptions(ctx=4096, available=8 * GiB, split_order=order))
                for order in ("host_speed", "layer")}


def gguf_row_bytes(t) -> int:
    bs, ts = GGML_QUANT_SIZES[Q(t.qtype)]
    return t.ne[0] // bs * ts


def host_rows(plan, name) -> int:
    return sum(s.row_end - s.row_start for s in plan.placement.segments[name] if s.where == "host")


def gpu_rows(plan, name) -> int:
    return sum(s.row_end - s.row_start for s in plan.placement.segments[name] if s.where == "gpu")


def estimate(plan) -> float:
    """Host GEMV ms/token from the placement's row counts, gguf-py's row sizes and the profile's
    GB/s: independent of tightfit.plan.host_speed's arithmetic."""
    ms = 0.0
    for name in plan.placement.segments:
        if name == "token_embd.weight":
            continue
        k = host_rows(plan, name)
        if k:
            t = plan.inventory.tensors[name]
            ms += k * gguf_row_bytes(t) / (PROFILE_GBPS[Q(t.qtype).name] * 1e9) * 1e3
    return ms


# ---- the table --------------------------------------------------------------------------------
def test_table_has_the_profile_figures():
    for name, gbps in PROFILE_GBPS.items():
        assert HS.host_gbps(int(Q[name])) == gbps
    # every one of the seed's 12 trunk formats has a native figure (none on the fallback)
    for name in ("IQ4_XS", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XS", "IQ2_S",
                 "IQ3_S", "IQ3_XXS", "Q8_0"):
        assert HS.host_gbps(int(Q[name])) > 1.0, name
    # no native host GEMV: the 0.1 GB/s NumPy dequantizer, the last class
    for name in ("F16", "BF16", "IQ2_XXS", "IQ1_S"):
        assert HS.host_gbps(int(Q[name])) == 0.1
        assert HS.speed_rank(int(Q[name])) > max(HS.speed_rank(int(Q[n]))
                                                 for n in LOWBIT | FAST | {"Q8_0", "IQ4_NL"})


def test_classes_are_ordered_by_their_figures():
    ranks = {n: HS.speed_rank(int(Q[n])) for n in LOWBIT | FAST | {"Q8_0", "Q4_0", "IQ4_NL",
                                                                   "TQ2_0", "TQ1_0"}}
    assert {ranks[n] for n in FAST} == {0}
    assert min(ranks[n] for n in LOWBIT) > 0
    # a faster class never holds a type slower than one of a later class
    for a, ra in ranks.items():
        for b, rb in ranks.items():
            if ra < rb:
                assert HS.host_gbps(int(Q[a])) > HS.host_gbps(int(Q[b])), (a, b)


def test_host_ms_hand_computed():
    gate = spec_for("blk.0.ffn_gate.weight", int(Q.IQ4_XS), (5120, 17408))
    down = spec_for("blk.0.ffn_down.weight", int(Q.IQ2_S), (17408, 5120))
    emb = spec_for("token_embd.weight", int(Q.Q3_K), (5120, 248320))
    p = build_placement([gate, down, emb], {gate.name: 1024, down.name: 64, emb.name: 248320})
    # IQ4_XS row: 5120/256*136 = 2720 B; IQ2_S row: 17408/256*82 = 5576 B; embedding left out
    want = {"IQ4_XS": 1024 * 2720 / 40.5e6, "IQ2_S": 64 * 5576 / 7.8e6}
    got = HS.host_ms_by_type(p, {t.name: t for t in (gate, down, emb)})
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12)
    assert HS.host_ms_per_token(p, {t.name: t for t in (gate, down, emb)}) == \
        pytest.approx(sum(want.values()), rel=1e-12)


# ---- candidate order -------------------------------------------------------------------------
def test_layer_order_is_the_old_rule(inv):
    n = inv.config.n_layer
    got = [t.name for t in split_candidates(inv.needed(), n, "layer")]
    want = []
    for kinds in (FFN_KINDS, MIXER_KINDS):
        for il in range(n - 1, -1, -1):
            want += [f"blk.{il}.{k}.weight" for k in kinds
                     if f"blk.{il}.{k}.weight" in inv.tensors]
    want.append("output.weight")
    assert got == want


def test_speed_order_is_a_tiered_permutation(inv):
    n = inv.config.n_layer
    old = split_candidates(inv.needed(), n, "layer")
    new = split_candidates(inv.needed(), n)
    assert sorted(t.name for t in new) == sorted(t.name for t in old)
    tier = [0 if ".ffn_" in t.name else 1 if t.name.startswith("blk.") else 2 for t in new]
    assert tier == sorted(tier)                       # FFN, then mixers, then the output head
    ffn = [t for t in new if ".ffn_" in t.name]
    names = [Q(t.qtype).name for t in ffn]
    first_slow = next(i for i, q in enumerate(names) if q not in FAST)
    assert all(q in FAST for q in names[:first_slow])
    assert not any(q in FAST for q in names[first_slow:])
    assert {t.name[:-len(".weight")] for t in ffn[first_slow:]} == SEED_LOWBIT_FFN
    # inside the fast class: the old rule (last layers first, gate/up/down)
    fast_old = [t.name for t in old if ".ffn_" in t.name and Q(t.qtype).name in FAST]
    assert [t.name for t in ffn[:first_slow]] == fast_old
    with pytest.raises(ValueError):
        split_candidates(inv.needed(), n, "fastest")
    with pytest.raises(UserError):
        PlanOptions(ctx=4096, available=8 * GiB, split_order="fastest").validate(inv.config)


# ---- the 8 GiB seed-mix plan -----------------------------------------------------------------
def test_no_lowbit_on_host_while_fast_ffn_rows_on_gpu(plans, inv):
    p = plans["host_speed"]
    assert p.fits and p.host_embd
    ffn = [n for n in inv.tensors if ".ffn_" in n and int(n.split(".")[1]) < inv.config.n_layer]
    fast_left_on_gpu = [n for n in ffn if Q(inv.tensors[n].qtype).name in FAST and gpu_rows(p, n)]
    # (the Q3_K embedding is on the host too, but one row per token is no GEMV)
    lowbit_on_host = [n for n in p.placement.segments if n != "token_embd.weight"
                      and Q(inv.tensors[n].qtype).name in LOWBIT and host_rows(p, n)]
    assert fast_left_on_gpu, "8 GiB leaves some fast FFN rows on the GPU"
    assert lowbit_on_host == []
    # only FFN matrices are split at 8 GiB (the mixers keep their whole layers on the device)
    split = [n for n in p.placement.split_tensors() if n != "token_embd.weight"]
    assert split and all(".ffn_" in n for n in split)


def test_old_order_put_the_profiled_lowbit_matrices_on_the_host(plans):
    """The old rule reproduces the device's placement: the same host bytes as the profile, and
    low-bit matrices among them; the new one keeps all of those on the GPU."""
    old = plans["layer"]
    emb = old.inventory.tensors["token_embd.weight"]
    assert (old.host_weights_bytes - emb.nbytes) / 1e6 == pytest.approx(PROFILE_HOST_MB, rel=1e-3)
    assert {Q(old.inventory.tensors[n].qtype).name for n in old.placement.split_tensors()} \
        >= {"IQ2_S", "IQ3_XXS", "IQ3_S", "Q3_K"}


def test_exact_cover_and_bill(plans, inv):
    for p in plans.values():
        check_exact_cover(p.placement, inv.tensors)
        gpu = host = 0
        for t in inv.needed():
            cnt = np.zeros(t.n_rows, np.int64)
            for s in p.placement.segments[t.name]:
                cnt[s.row_start:s.row_end] += 1
                n = (s.row_end - s.row_start) * gguf_row_bytes(t)
                assert s.byte_end - s.byte_start == n
                if s.where == "gpu":
                    gpu += n
                else:
                    host += n
            assert (cnt == 1).all(), t.name
        bs_ts = [GGML_QUANT_SIZES[Q(t.qtype)] for t in inv.needed()]
        model = sum(int(np.prod(t.ne)) // bs * ts for t, (bs, ts) in zip(inv.needed(), bs_ts))
        assert gpu + host == model
        assert p.line("weights").bytes == gpu and p.host_weights_bytes == host
        # bytes freed >= bytes needed: the whole bill, every line, fits the budget
        assert p.total_bytes == sum(l.bytes for l in p.lines) <= 8 * GiB
    # both orders free about the same bytes (they differ by split quanta and alignment only)
    a, b = (plans[o].host_weights_bytes for o in ("host_speed", "layer"))
    assert abs(a - b) < 50e6


def test_estimate_drops_vs_old_order(plans):
    new, old = estimate(plans["host_speed"]), estimate(plans["layer"])
    # the old placement's estimate is the profile's own host kernel time (245.2 ms summed)
    assert old == pytest.approx(59.53 + 58.01 + 56.12 + 29.43 + 15.21 + 13.95 + 9.51 + 3.45,
                                rel=0.01)
    # ~0.47 GB of low-bit rows (~8 GB/s) swapped for fast ones (~40 GB/s): ~45 ms/token less
    assert old - new > 35.0
    for order, p in plans.items():
        assert p.host_ms_per_token == pytest.approx(estimate(p), rel=1e-9), order
        d = p.to_json()
        assert d["host_ms_per_token_est"] == pytest.approx(estimate(p), rel=1e-9)
        assert d["split_order"] == order
        assert sum(d["host_ms_by_type_est"].values()) == pytest.approx(d["host_ms_per_token_est"])
        assert any("host GEMV estimate" in n for n in p.notes)
