"""Exact-cover checker and output-row split: property tests with random matrices and budgets.
The coverage oracle is an independent row-count array, not the checker itself."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from hypothesis import HealthCheck, given, settings, strategies as st

from tightfit.errors import PlanError
from tightfit.model.config import Qwen35Config
from tightfit.plan.budget import PlanOptions, plan_model, require_fit
from tightfit.plan.placement import (ARENA_ALIGN, GPU, HOST, ModelInventory, build_placement,
                                     spec_for)
from tightfit.plan.rowsplit import (SPLIT_ROW_QUANTUM, PlacementError, check_exact_cover,
                                    host_rows_for)

QTYPES = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q3_K", "IQ4_NL", "F32", "Q2_K"]


@st.composite
def matrices(draw):
    n = draw(st.integers(1, 6))
    out = []
    for i in range(n):
        q = draw(st.sampled_from(QTYPES))
        bs, _ = GGML_QUANT_SIZES[GGMLQuantizationType[q]]
        k = bs * draw(st.integers(1, 8))
        rows = draw(st.integers(1, 700))
        out.append(spec_for(f"m{i}.weight", int(GGMLQuantizationType[q]), (k, rows), offset=0))
    return out


def independent_cover(placement, tensors):
    """Rows covered per tensor by GPU and host segments, counted with numpy."""
    for t in tensors:
        cnt = np.zeros(t.n_rows, dtype=np.int64)
        total = 0
        for s in placement.segments[t.name]:
            cnt[s.row_start:s.row_end] += 1
            total += s.byte_end - s.byte_start
        assert (cnt == 1).all(), t.name
        assert total == t.nbytes


@settings(max_examples=150, deadline=None)
@given(matrices(), st.data())
def test_random_splits_are_exact_covers(tensors, data):
    host_rows = {}
    for t in tensors:
        need = data.draw(st.integers(0, t.nbytes + 1000))
        host_rows[t.name] = host_rows_for(t, need) if t.n_rows >= SPLIT_ROW_QUANTUM else 0
        k = host_rows[t.name]
        if t.n_rows >= SPLIT_ROW_QUANTUM:
            assert k * t.row_bytes >= min(need, t.nbytes)       # covers what was asked
            assert need > 0 or k == 0
        assert k in (0, t.n_rows) or (t.n_rows - k) % SPLIT_ROW_QUANTUM == 0
    p = build_placement(tensors, host_rows)
    check_exact_cover(p, tensors)
    independent_cover(p, tensors)
    for s in p.gpu_segments():
        assert s.arena_offset % ARENA_ALIGN == 0


def _valid():
    ts = [spec_for("a.weight", int(GGMLQuantizationType.Q4_K), (512, 256)),
          spec_for("b.weight", int(GGMLQuantizationType.Q8_0), (64, 130)),
          spec_for("c.weight", int(GGMLQuantizationType.Q6_K), (256, 128))]
    return ts, build_placement(ts, {"a.weight": 64, "c.weight": 128})


def _mutate(p, name, i, **kw):
    segs = list(p.segments[name])
    segs[i] = replace(segs[i], **kw)
    q = replace(p, segments={**p.segments, name: segs})
    return q


def test_valid_fixture_passes():
    ts, p = _valid()
    check_exact_cover(p, ts)
    assert [s.where for s in p.segments["a.weight"]] == [GPU, HOST]
    assert [s.where for s in p.segments["c.weight"]] == [HOST]


@pytest.mark.parametrize("corrupt", ["overlap", "gap", "misaligned_bytes", "off_quantum",
                                     "arena_overlap", "arena_unaligned", "missing", "excluded",
                                     "past_region", "host_first", "extra_tensor"])
def test_corrupted_placements_are_caught(corrupt):
    ts, p = _valid()
    a = ts[0]
    rb = a.row_bytes
    if corrupt == "overlap":          # GPU prefix runs one row into the host suffix
        q = _mutate(p, "a.weight", 0, row_end=193, byte_end=193 * rb)
    elif corrupt == "gap":            # one row nowhere
        q = _mutate(p, "a.weight", 1, row_start=193, byte_start=193 * rb)
    elif corrupt == "misaligned_bytes":   # cut inside a row (one block off)
        q = _mutate(p, "a.weight", 1, byte_start=192 * rb + a.block_bytes)
    elif corrupt == "off_quantum":    # split at a row that is not a multiple of the quantum
        q = _mutate(_mutate(p, "a.weight", 0, row_end=190, byte_end=190 * rb),
                    "a.weight", 1, row_start=190, byte_start=190 * rb)
    elif corrupt == "arena_overlap":
        q = _mutate(p, "b.weight", 0, arena_offset=p.segments["a.weight"][0].arena_offset)
    elif corrupt == "arena_unaligned":
        q = _mutate(p, "b.weight", 0, arena_offset=p.segments["b.weight"][0].arena_offset + 32)
    elif corrupt == "missing":
        q = replace(p, segments={k: v for k, v in p.segments.items() if k != "b.weight"})
    elif corrupt == "excluded":
        q = replace(p, excluded=("b.weight",))
    elif corrupt == "past_region":
        q = replace(p, weights_region_bytes=p.weights_region_bytes - 256)
    elif corrupt == "host_first":
        segs = p.segments["a.weight"]
        q = replace(p, segments={**p.segments, "a.weight": [
            replace(segs[1], row_start=0, row_end=64, byte_start=0, byte_end=64 * rb),
            replace(segs[0], row_start=64, row_end=256, byte_start=64 * rb, byte_end=256 * rb)]})
    else:
        q = replace(p, segments={**p.segments, "zzz.weight": []})
    with pytest.raises(PlacementError):
        check_exact_cover(q, ts)


def test_checker_is_a_plan_error():
    assert issubclass(PlacementError, PlanError)


@st.composite
def small_models(draw):
    E = 256 * draw(st.integers(1, 2))
    S = 16
    hk = draw(st.integers(1, 2))
    cfg = Qwen35Config(n_embd=E, n_ff=256 * draw(st.integers(1, 3)), n_layer=4 * draw(st.integers(1, 2)),
                       n_head=4, n_head_kv=2, head_dim=64, n_rot=16, rope_sections=(4, 2, 2, 0),
                       rope_freq_base=1e7, rms_eps=1e-6, ssm_conv_kernel=4, ssm_state=S,
                       ssm_k_heads=hk, ssm_v_heads=3 * hk, ssm_inner=3 * hk * S,
                       n_vocab=64 * draw(st.integers(4, 40)), n_ctx_train=4096)
    cfg.validate()
    ts = {}
    for name, ne in cfg.tensor_shapes().items():
        if cfg.is_vector_tensor(name):
            q = "F32"
        else:
            opts = [q for q in QTYPES if ne[0] % GGML_QUANT_SIZES[GGMLQuantizationType[q]][0] == 0]
            q = draw(st.sampled_from(opts))
        ts[name] = spec_for(name, int(GGMLQuantizationType[q]), ne)
    return ModelInventory(cfg, ts, "hypothesis")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_models(), st.integers(1, 4096), st.floats(0.0, 1.5), st.sampled_from(["auto", "yes", "no"]),
       st.booleans())
def test_planner_valid_or_refused(inv, ctx, frac, host_embd, split):
    """Any budget: the plan is an exact cover that fits, or require_fit refuses with PlanError."""
    weights = sum(t.nbytes for t in inv.tensors.values())
    o = PlanOptions(ctx=ctx, available=int(weights * frac) + 100_000, reserve=0,
                    host_embd=host_embd, split=split, prefill_chunk=64)
    p = plan_model(inv, o)
    check_exact_cover(p.placement, inv.tensors)
    independent_cover(p.placement, [inv.tensors[n] for n in p.placement.segments])
    assert p.total_bytes == sum(l.bytes for l in p.lines)
    if p.fits:
        assert p.total_bytes <= o.available
        require_fit(p)
        if host_embd == "no":
            assert not p.host_embd
        if not split:
            assert set(p.placement.split_tensors()) <= {"token_embd.weight"}
    else:
        assert p.total_bytes > o.available
        with pytest.raises(PlanError):
            require_fit(p)
