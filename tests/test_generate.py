"""Synthetic qwen35 generator: checked against gguf-py (reader, dequantizers), llama.cpp, the byte
facts of seed 000 / shared/bench/seed-mix.md and the counts in spec/qwen35.md."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

from tightfit.errors import UserError
from tightfit.model import generate as G
from tightfit.model.presets import SUPPORTED_TYPES

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
VOCAB = SHARED / "fixtures" / "ggml-vocab-qwen35.gguf"
needs_shared = pytest.mark.skipif(not VOCAB.exists(), reason=f"shared fixtures not found at {SHARED}")

# seed 000 / bench/seed-mix.md facts (outside numbers, not computed here)
SEED_TRUNK_BYTES = 14_231_162_880
SEED_FORMATS = {"IQ4_XS", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XS", "IQ2_S", "IQ3_S",
                "IQ3_XXS", "Q8_0"}


@pytest.fixture(scope="module")
def seed_plan():
    return G.plan_model("qwen3.8-27b-seedmix", vocab="real", mtp=True)


def test_seedmix_reproduces_seed_byte_facts(seed_plan):
    b = seed_plan.by_name()
    ffn13 = [b[f"blk.13.ffn_{k}.weight"] for k in ("gate", "up", "down")]
    assert {t.qtype for t in ffn13} == {"Q3_K"}
    assert round(sum(t.nbytes for t in ffn13) / 1e6, 1) == 114.9
    g = b["blk.0.ffn_gate.weight"], b["blk.12.ffn_gate.weight"]
    assert {t.qtype for t in g} == {"IQ2_XS"} and round(sum(t.nbytes for t in g) / 1e6, 1) == 51.5
    assert b["token_embd.weight"].nbytes == 546_304_000 and b["token_embd.weight"].qtype == "Q3_K"
    assert b["output.weight"].qtype == "Q6_K" and round(b["output.weight"].nbytes / 1e9, 2) == 1.04
    mtp_down = b["blk.64.ffn_down.weight"]
    assert mtp_down.qtype == "Q6_K" and round(mtp_down.nbytes / 1e6, 1) == 73.1
    trunk = [t for t in seed_plan.tensors if t.name.startswith("blk.") and not t.name.startswith("blk.64.")]
    quant = [t for t in trunk if t.qtype != "F32"]
    assert {t.qtype for t in quant} == SEED_FORMATS
    total = sum(t.nbytes for t in quant)
    # the recipe in seed-mix.md gives 14,227,824,640 B: 3,338,240 B (0.023 %) under the seed's figure
    assert abs(total - SEED_TRUNK_BYTES) / SEED_TRUNK_BYTES < 5e-4
    f32 = sum(t.nbytes for t in trunk if t.qtype == "F32")
    assert 10.4e6 < f32 < 10.8e6                       # seed: "plus 10.7 MB of F32 vectors"


def test_seedmix_tensor_counts_match_spec(seed_plan):
    # spec/qwen35.md §2.4: 851 trunk tensors; a published 27B load reports 353 F32 tensors
    trunk = [t for t in seed_plan.tensors if not t.name.startswith("blk.64.")]
    assert len(trunk) == 851
    assert sum(t.qtype == "F32" for t in trunk) == 353
    assert len(seed_plan.tensors) - len(trunk) == 15    # MTP: 14 required + shared_head_norm


def test_layers_slice_and_errors():
    p = G.plan_model("qwen3.8-27b-seedmix", layers=4, vocab="small:1000")
    assert p.cfg.n_layer == 4 and p.cfg.attention_ids == [3]
    assert p.by_name()["blk.3.attn_q.weight"].qtype == "IQ4_NL"
    with pytest.raises(UserError):
        G.plan_model("qwen3.8-27b-seedmix", layers=3)
    with pytest.raises(UserError, match="multiple of 256"):
        G.plan_model("tiny", qtype="Q4_K")
    with pytest.raises(UserError):
        G.plan_model("nope")
    with pytest.raises(UserError):
        G.plan_model("tiny", vocab="small:10")


# llama.cpp's required key types (spec/gguf-synthetic-traps.md §3 table), written out by hand
KEY_TYPES = {
    "general.architecture": GGUFValueType.STRING, "qwen35.block_count": GGUFValueType.UINT32,
    "qwen35.context_length": GGUFValueType.UINT32, "qwen35.embedding_length": GGUFValueType.UINT32,
    "qwen35.feed_forward_length": GGUFValueType.UINT32, "qwen35.attention.head_count": GGUFValueType.UINT32,
    "qwen35.attention.head_count_kv": GGUFValueType.UINT32, "qwen35.attention.key_length": GGUFValueType.UINT32,
    "qwen35.attention.value_length": GGUFValueType.UINT32,
    "qwen35.attention.layer_norm_rms_epsilon": GGUFValueType.FLOAT32,
    "qwen35.rope.freq_base": GGUFValueType.FLOAT32, "qwen35.rope.dimension_count": GGUFValueType.UINT32,
    "qwen35.rope.dimension_sections": GGUFValueType.ARRAY, "qwen35.ssm.conv_kernel": GGUFValueType.UINT32,
    "qwen35.ssm.state_size": GGUFValueType.UINT32, "qwen35.ssm.group_count": GGUFValueType.UINT32,
    "qwen35.ssm.time_step_rank": GGUFValueType.UINT32, "qwen35.ssm.inner_size": GGUFValueType.UINT32,
    "qwen35.nextn_predict_layers": GGUFValueType.UINT32, "tokenizer.ggml.eos_token_id": GGUFValueType.UINT32,
}


@needs_shared
def test_seedmix_header_reads_back_with_gguf_py(tmp_path):
    """Header + tensor infos of the 27B seed-mix file (small vocab to keep the reader fast), file
    extended sparsely to its full size; gguf-py must see exactly the planned tensors."""
    plan = G.plan_model("qwen3.8-27b-seedmix", vocab="small:1000", mtp=True)
    path = tmp_path / "seed-header.gguf"
    start = G.write_header(path, plan)
    assert path.stat().st_size == start + plan.data_bytes
    r = GGUFReader(path)
    for k, t in KEY_TYPES.items():
        assert r.fields[k].types[0] == t, k
    assert list(r.fields["qwen35.rope.dimension_sections"].contents()) == [11, 11, 10, 0]
    assert r.fields["qwen35.block_count"].contents() == 65
    assert r.fields["qwen35.nextn_predict_layers"].contents() == 1
    rec = r.fields["qwen35.attention.recurrent_layers"].contents()
    assert len(rec) == 65 and rec[3] is False and rec[0] is True and rec[64] is False
    assert len(r.tensors) == len(plan.tensors) == 866
    for t, p in zip(r.tensors, plan.tensors):
        assert t.name == p.name and t.tensor_type.name == p.qtype and tuple(int(x) for x in t.shape) == p.ne
        assert t.n_bytes == p.nbytes and t.data_offset == start + p.offset
    assert r.tensors[0].shape.tolist() == [5120, 1000]


def _read(path):
    r = GGUFReader(path)
    return r, {t.name: t for t in r.tensors}


@needs_shared
def test_small_cover_file_and_twin(tmp_path):
    q, tw = tmp_path / "m.gguf", tmp_path / "m.f32.gguf"
    plan = G.make_model(q, "small", mix="cover", mtp=True, seed=3, f32_twin_path=tw)
    rq, tq = _read(q)
    rt, tt = _read(tw)
    assert set(tq) == set(tt) == {p.name for p in plan.tensors}
    assert len({t.tensor_type.name for t in rq.tensors}) >= 14
    for name, t in tq.items():
        x = dequantize(t.data, t.tensor_type).reshape(tt[name].data.shape)
        assert tt[name].tensor_type.name == "F32"
        np.testing.assert_array_equal(x, tt[name].data, err_msg=name)   # twin == gguf-py dequant, exactly
        kind = name.rsplit(".", 1)[0]
        if name.endswith("norm.weight"):
            assert t.tensor_type.name == "F32" and 0.8 < x.mean() < 1.2
        elif name.endswith("ssm_a"):
            assert (x < 0).all()
        elif name.endswith("ssm_conv1d.weight"):
            assert t.tensor_type.name == "F32" and tuple(t.shape) == (4, 1280)
        elif name == "token_embd.weight":
            assert abs(x.std() - 0.2) < 0.03
        elif name.endswith(("ffn_down.weight", "ssm_out.weight", "attn_output.weight")):
            assert abs(x.std() - 0.01) < 0.0025, (kind, x.std())
        elif name.endswith("weight") and x.size >= 4096:
            assert abs(x.std() - 0.02) < 0.005, (kind, x.std())
            assert abs(x.mean()) < 0.1 * x.std(), kind
    assert rq.fields["tokenizer.ggml.tokens"].types[-1] == GGUFValueType.STRING
    assert "<|im_start|>" in rq.fields["tokenizer.chat_template"].contents()


@pytest.mark.parametrize("qtype", [t for t in SUPPORTED_TYPES if t not in ("F32", "F16", "BF16")])
def test_every_type_gives_valid_centred_blocks(qtype):
    data, twin = G.tensor_chunk(5, "blk.1.ffn_up.weight", qtype, 1024, 48, 0, want_twin=True)
    from gguf import GGMLQuantizationType as T
    x = dequantize(data, T[qtype])
    assert np.isfinite(x).all()
    assert abs(x.std() - 0.02) < 0.003, x.std()            # init rule: 0.02 for ffn_up
    assert abs(x.mean()) < 0.05 * x.std()
    np.testing.assert_array_equal(x.reshape(twin.shape), twin)


def test_reproducible_and_seeded(tmp_path, monkeypatch):
    monkeypatch.setattr(G, "CHUNK_BYTES", 4096)   # many chunks per tensor: order must not matter
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    G.make_model(a, "tiny", qtype="Q8_0", processes=1)
    G.make_model(b, "tiny", qtype="Q8_0", processes=2)
    G.make_model(c, "tiny", qtype="Q8_0", seed=1, processes=1)
    assert G.sha256_file(a) == G.sha256_file(b) != G.sha256_file(c)
    assert not list(tmp_path.glob("*.partial"))


@needs_shared
def test_small_vocab_and_minimal_parser_against_gguf_py():
    r = GGUFReader(VOCAB)
    ref_tokens = r.fields["tokenizer.ggml.tokens"]
    tokens, types, merges = G._fixture_vocab(str(VOCAB))
    assert len(tokens) == 151936 and len(merges) == 151387
    idx = [0, 255, 256, 151642, 151643, 151935]
    assert [tokens[i] for i in idx] == [ref_tokens.parts[ref_tokens.data[i]].tobytes().decode() for i in idx]
    md = {k: v for k, v, *_ in G.tokenizer_metadata("small:500")}
    toks = md["tokenizer.ggml.tokens"]
    assert len(toks) == 500 and toks[:497] == tokens[:497]
    assert toks[497:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert md["tokenizer.ggml.token_type"][497:] == [3, 3, 3]
    assert md["tokenizer.ggml.eos_token_id"] == 499 and md["tokenizer.ggml.padding_token_id"] == 497
    kept = set(toks)
    assert md["tokenizer.ggml.merges"] and all(
        m.split(" ")[0] in kept and m.split(" ")[1] in kept and m.replace(" ", "") in kept
        for m in md["tokenizer.ggml.merges"])
    assert "i n" in md["tokenizer.ggml.merges"]


def test_cli(tmp_path, capsys):
    from tightfit.cli import main
    out = tmp_path / "cli.gguf"
    assert main(["make-model", str(out), "--preset", "tiny", "--qtype", "f16", "--tied", "--seed", "3"]) == 0
    assert out.exists()
    r, t = _read(out)
    assert "output.weight" not in t and t["blk.0.ffn_up.weight"].tensor_type.name == "F16"
    assert main(["make-model", str(tmp_path / "x.gguf"), "--qtype", "Q4_K"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("tightfit make-model: error:") and "256" in err[-1]


@needs_shared
def test_demo_model_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path))
    from tightfit.model.demo import demo_model_path
    p = demo_model_path()
    assert p.parent == tmp_path and p.exists()
    r, t = _read(p)
    assert "RANDOM WEIGHTS" in r.fields["general.description"].contents()
    mtime = p.stat().st_mtime_ns
    assert demo_model_path() == p and p.stat().st_mtime_ns == mtime     # cached, not rewritten
    with open(p, "r+b") as f:                                            # corrupt one byte
        f.seek(-1, os.SEEK_END)
        f.write(b"\x7f")
    sha_bad = G.sha256_file(p)
    demo_model_path()
    assert G.sha256_file(p) != sha_bad and json.loads((tmp_path / (p.name + ".json")).read_text())["sha256"] == G.sha256_file(p)


@pytest.mark.llama
@needs_shared
def test_llama_cpp_loads_generated_files(tmp_path):
    """The final oracle for 'valid qwen35 file': llama.cpp loads it and computes finite logits."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = tmp_path / "odd.gguf"
    G.make_model(path, "small-odd", mix="cover", mtp=True, tied=True, seed=9)
    llm = llama_cpp.Llama(str(path), n_ctx=32, n_batch=32, n_threads=2, logits_all=True, verbose=False)
    assert llm.n_vocab() == 1000
    llm.eval([1, 2, 3, 400, 5])
    x = np.array(llm.scores[:5])
    assert np.isfinite(x).all() and 0.1 < x.std() < 20


def test_tq2_fast_blocks_are_valid_ternary():
    """Big TQ2_0 chunks are packed directly (generate._tq2_blocks_fast): every 2-bit code is a
    valid trit (never 3), gguf-py dequantizes them to {-d, 0, +d} per block with d the stored
    fp16 scale, and the three values appear with the intended 1/4, 1/2, 1/4 frequencies."""
    import gguf
    from tightfit.model import generate as G
    rows, ne0 = 8, 5120
    data = G._tq2_blocks_fast(np.random.default_rng(1), "blk.0.ffn_up.weight", rows, ne0)
    assert data.shape == (rows, ne0 // 256 * 66)
    blocks = data.reshape(-1, 66)
    codes = np.stack([(blocks[:, :64] >> s) & 3 for s in (0, 2, 4, 6)])
    assert codes.max() <= 2
    w = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.TQ2_0).reshape(-1, 256)
    d = blocks[:, 64:].copy().view("<f2").astype(np.float32)
    assert np.all(d > 0)
    t = w / d
    assert set(np.unique(t)) <= {-1.0, 0.0, 1.0}
    frac = [(t == v).mean() for v in (-1.0, 0.0, 1.0)]
    assert abs(frac[0] - 0.25) < 0.02 and abs(frac[1] - 0.5) < 0.02 and abs(frac[2] - 0.25) < 0.02
    # chunks below the threshold keep gguf-py's quantizer path (test models' bytes unchanged)
    small, _ = G.tensor_chunk(0, "blk.0.ffn_up.weight", "TQ2_0", 256, 4, 0)
    assert 4 * 256 < G.FAST_TERNARY_MIN and small.shape == (4, 66)
