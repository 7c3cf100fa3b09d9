"""Plan figures against numbers stated outside this code: seed 000 ('第一步', '实测'), spec/qwen35.md
§4, shared/bench/seed-mix.md, and byte counts from gguf-py's own quant-size table."""
from __future__ import annotations

from dataclasses import replace

import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from tightfit.errors import PlanError, UserError
from tightfit.model.config import QWEN35_27B
from tightfit.plan.budget import (GiB, MiB, PlanOptions, kv_bytes_per_token, kv_format,
                                  parse_size, plan_model, require_fit, _decode_scratch)
from tightfit.plan.placement import inventory_from_preset

SEED = "qwen3.8-27b-seedmix"


@pytest.fixture(scope="module")
def inv():
    return inventory_from_preset(SEED)


def gguf_bytes(t) -> int:
    """Byte count from gguf-py's table, independent of tightfit.quant."""
    bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType(t.qtype)]
    n = 1
    for d in t.ne:
        n *= d
    return n // bs * ts


def opts(**kw):
    base = dict(ctx=8192, available=int(15.6 * GiB))
    base.update(kw)
    return PlanOptions(**base)


def test_kv_per_token_matches_seed():
    # seed 000: 4,096 B per layer per token, 65,536 B for 16 layers; 512 MiB at 8K, 2 GiB at 32K
    assert kv_bytes_per_token(QWEN35_27B, kv_format("f16")) == 65536
    inv = inventory_from_preset(SEED)
    assert plan_model(inv, opts(ctx=8192, available=64 * GiB)).line("kv_cache").bytes == 512 * MiB
    assert plan_model(inv, opts(ctx=32768, available=64 * GiB)).line("kv_cache").bytes == 2 * GiB


def test_kv_q8_0_hand_derived():
    # 16 layers x (K,V) x 1024 elements / 32 x 34 bytes
    assert kv_bytes_per_token(QWEN35_27B, kv_format("q8_0")) == 16 * 2 * 32 * 34


def test_recurrent_state_matches_seed(inv):
    line = plan_model(inv, opts(available=64 * GiB)).line("recurrent_state")
    assert line.details["bytes_per_layer"] == 3_268_608          # seed 000, spec §4
    assert line.details["bytes_per_bank"] == 156_893_184         # 48 layers, one sequence
    assert line.details["conv_bytes_per_layer"] == 122_880       # spec §4
    assert line.bytes == 2 * 156_893_184                         # two banks


def test_scratch_figures_from_seed():
    d1 = _decode_scratch(QWEN35_27B, 1, 32768, partials=True)
    assert d1["ffn"] == 165_504                  # seed 000: FFN sub-layer workspace
    assert d1["attention_partials"] == 928_384 - 132_736   # seed 000: 32K total minus <=1K base
    assert _decode_scratch(QWEN35_27B, 1, 1024, partials=True)["attention_partials"] == 0


def test_seed_mix_tensor_sizes(inv):
    t = inv.tensors
    assert t["token_embd.weight"].nbytes == 546_304_000            # seed 000 / seed-mix.md
    ffn13 = sum(t[f"blk.13.{k}.weight"].nbytes for k in ("ffn_gate", "ffn_up", "ffn_down"))
    assert round(ffn13 / 1e6, 1) == 114.9                            # seed-mix.md
    gates = t["blk.0.ffn_gate.weight"].nbytes + t["blk.12.ffn_gate.weight"].nbytes
    assert round(gates / 1e6, 1) == 51.5                             # seed 000
    assert round(t["blk.64.ffn_down.weight"].nbytes / 1e6, 1) == 73.1   # MTP ffn_down, Q6_K
    for spec in t.values():
        assert spec.nbytes == gguf_bytes(spec), spec.name


def test_weights_line_exact_and_mtp_excluded(inv):
    p = plan_model(inv, opts(available=64 * GiB, host_embd="no"))
    expect = sum(gguf_bytes(s) for n, s in inv.tensors.items() if not n.startswith("blk.64."))
    assert p.line("weights").bytes == expect
    assert p.host_weights_bytes == 0
    assert all(n.startswith("blk.64.") for n in p.placement.excluded) and p.placement.excluded
    # seed 000 '6KB 对齐损耗': 96 F32 vectors of 192 B, each padded to 256
    assert p.placement.padding_bytes == 6144
    with_mtp = plan_model(inv, opts(available=64 * GiB, host_embd="no", include_mtp=True))
    assert with_mtp.line("weights").bytes == sum(gguf_bytes(s) for s in inv.tensors.values())


def test_total_is_sum_and_json_keys(inv):
    p = plan_model(inv, opts())
    j = p.to_json()
    for k in ("weights_bytes", "kv_cache_bytes", "recurrent_state_bytes", "workspace_bytes",
              "scratch_bytes", "staging_bytes", "reserve_bytes", "total_bytes", "available_bytes",
              "fits", "host_weights_bytes", "max_ctx_that_fits", "lines", "placement"):
        assert k in j, k
    assert j["total_bytes"] == sum(l["bytes"] for l in j["lines"])
    assert j["total_bytes"] <= j["available_bytes"] and j["fits"]


def test_host_embedding_chosen_first(inv):
    full = plan_model(inv, opts(available=64 * GiB, host_embd="no"))
    # a budget 100 MB short of the all-GPU bill: moving the embedding (546 MB) is enough
    short = full.total_bytes - 100_000_000
    p = plan_model(inv, opts(available=short, reserve=full.line("reserve").bytes))
    assert p.fits and p.host_embd
    assert p.placement.split_tensors() == ["token_embd.weight"]
    assert full.line("weights").bytes - p.line("weights").bytes == 546_304_000
    assert p.host_weights_bytes == 546_304_000


def test_row_split_when_still_short(inv):
    p = plan_model(inv, opts(available=int(13.5e9)))
    assert p.fits and p.host_embd
    split = [n for n in p.placement.split_tensors() if n != "token_embd.weight"]
    assert all(".ffn_" in n for n in split)
    # documented rule: last layers first, every FFN matrix of a later layer wholly on the host
    layers = sorted({int(n.split(".")[1]) for n in split})
    assert layers == list(range(layers[0], 64))
    for n in split:
        t = inv.tensors[n]
        host = sum(s.row_end - s.row_start for s in p.placement.segments[n] if s.where == "host")
        assert host == t.n_rows or int(n.split(".")[1]) == layers[0]
    assert p.total_bytes <= p.available_bytes


def test_does_not_fit_exit_2_and_no_downgrade(inv):
    o = opts(ctx=131072, available=7600 * MiB)
    p = plan_model(inv, o)
    assert not p.fits
    assert p.options.kv_type == "f16" and p.line("kv_cache").bytes == 131072 * 65536
    with pytest.raises(PlanError) as e:
        require_fit(p)
    assert e.value.exit_code == 2
    w = p.would_fit
    assert 0 < w["max_ctx"] < 131072
    assert plan_model(inv, replace(o, ctx=w["max_ctx"])).fits
    assert not plan_model(inv, replace(o, ctx=w["max_ctx"] + 1)).fits


def test_would_fit_lists_moves_when_split_disabled(inv):
    p = plan_model(inv, opts(available=int(13.5e9), split=False))
    assert not p.fits
    moves = p.would_fit["move_to_host"]
    assert moves and moves[0]["tensor"] == "token_embd.weight"
    assert p.would_fit["move_to_host_bytes"] == sum(m["bytes"] for m in moves)


def test_max_ctx_same_placement_is_tight(inv):
    p = plan_model(inv, opts())
    assert p.max_ctx_same_placement >= 8192
    grow = p.max_ctx_same_placement + 1
    # per token: 65,536 B of KV + RoPE cos/sin rows (2 x n_rot/2 x 4 = 256 B); per 512-token
    # split-K chunk: 24 heads x (m, l, 256 acc) x 4 B
    more = (grow - 8192) * (65536 + 256) + (-(-grow // 512) - 8192 // 512) * 24 * 258 * 4
    assert p.total_bytes + more > p.available_bytes


def test_user_errors(inv):
    with pytest.raises(UserError):
        plan_model(inv, opts(kv_type="q3_weird"))
    with pytest.raises(UserError):
        plan_model(inv, opts(ctx=10**7))
    with pytest.raises(UserError):
        inventory_from_preset("nope")


@pytest.mark.parametrize("text,value", [("16GiB", 16 * 2**30), ("7.6GB", 7_600_000_000),
                                        ("7600MiB", 7600 * 2**20), ("123456", 123456),
                                        ("8G", 8 * 2**30), ("512 MB", 512_000_000)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GB", "12XB", "-1GB", "1iB"])
def test_parse_size_rejects(text):
    with pytest.raises(UserError):
        parse_size(text)


def test_mma_fixup_line_matches_kernel_workspace(inv, monkeypatch):
    """With the CUDA GEMV routed (as on the H200), the step buffers carry the tensor-core GEMV's
    fixup workspace, priced exactly as gemv_mma.fixup_workspace_bytes for the largest routable
    n_out (the output head) on the default 132 SMs; without the CUDA route there is no line."""
    from tightfit.kernels import gemv_mma
    from tightfit.kernels import gemv_route
    from tightfit.plan.budget import mma_fixup_rows, workspace_buffers
    from tightfit.plan.buffers import DEFAULT_SMS
    cfg = QWEN35_27B
    o = opts()
    assert "mma_fixup" not in {b.name for b in workspace_buffers(cfg, o, inv)}
    monkeypatch.setattr(gemv_route, "cuda_routed", lambda q: True)
    bufs = {b.name: b for b in workspace_buffers(cfg, o, inv)}
    rows = mma_fixup_rows(cfg, o, inv)
    head = [t for t in inv.needed(False) if t.name == "output.weight"] or [
        inv.tensors["token_embd.weight"]]
    assert rows == head[0].ne[1] == 248320          # the output head (Q6_K)
    assert bufs["mma_fixup"].dtype == "u8"
    assert bufs["mma_fixup"].nbytes == gemv_mma.fixup_workspace_bytes(rows, DEFAULT_SMS)


def test_scratch_line_prices_the_cublas_workspace(monkeypatch):
    """The prefill GEMM's cuBLAS workspace is a block torch keeps beside the arena (session 17:
    32 MiB on the H200, held to the end of the run): the scratch line adds it, sized by
    CUBLAS_WORKSPACE_CONFIG when set."""
    from tightfit.model.config import QWEN35_27B
    from tightfit.plan.budget import PlanOptions, _fixed_lines, cublas_workspace_bytes
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert cublas_workspace_bytes() == 32 << 20
    o = PlanOptions(ctx=4096, available=1 << 40, prefill_chunk=512)
    line = _fixed_lines(QWEN35_27B, o)["scratch"]
    d = line.details
    assert d["cublas_workspace"] == 32 << 20
    assert line.bytes == max(d["decode_bytes"], d["prefill_bytes"]) + (32 << 20)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8")
    assert cublas_workspace_bytes() == (4096 * 2 + 16 * 8) * 1024
    assert _fixed_lines(QWEN35_27B, o)["scratch"].bytes == line.bytes - (32 << 20) + 8320 * 1024
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "garbage")
    assert cublas_workspace_bytes() == 32 << 20
