"""open_model / check_inventory / `tightfit inspect`.

Oracles: gguf-py's GGUFReader (tensor list, byte counts), and shapes derived by hand from
spec/qwen35.md §2 for the TINY geometry (E=64, n_ff=96, H=4, Hkv=2, D=32, S=16, Hk=2, Hv=6, K=4,
V=1000): conv channels C = 2*Hk*S + Hv*S = 160, attn_q = {E, 2*H*D} = {64, 256}; a Gated DeltaNet
block has 14 tensors, a full-attention block 11, an MTP block 11 + 4 nextn = 15; the trunk of 6 GDN
+ 2 attention blocks plus token_embd/output_norm/output has 109.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import gguf
import pytest

from conftest import REPO
from tightfit.api import ModelFile, open_model
from tightfit.cli import main
from tightfit.errors import GGUFError


def expect_open(path, *fragments):
    with pytest.raises(GGUFError) as ei:
        open_model(path)
    msg = str(ei.value)
    assert path.name in msg and "\n" not in msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def test_open_model_splits_trunk_and_mtp(tiny_gguf):
    oracle = gguf.GGUFReader(str(tiny_gguf))
    names = [t.name for t in oracle.tensors]
    with open_model(tiny_gguf) as mf:
        assert isinstance(mf, ModelFile)
        assert mf.config.n_layer == 8 and mf.config.nextn_layers == 1
        assert list(mf.trunk_tensors) == [n for n in names if not n.startswith("blk.8.")]
        assert len(mf.trunk_tensors) == 109
        assert sorted(mf.mtp_tensors) == sorted(n for n in names if n.startswith("blk.8."))
        assert len(mf.mtp_tensors) == 15 and "blk.8.nextn.eh_proj.weight" in mf.mtp_tensors
        assert mf.inventory.mtp_complete and not mf.inventory.tied_output
        assert mf.tokenizer_metadata["tokenizer.ggml.pre"] == "qwen35"
        assert len(mf.tokenizer_metadata["tokenizer.ggml.tokens"]) == 1000
        assert mf.gguf.tensors["blk.0.ssm_conv1d.weight"].ne == (4, 160)
        assert mf.gguf.tensors["blk.3.attn_q.weight"].ne == (64, 256)
    # (tightfit.load returns an Engine: tested in test_engine_api.py on a file with a real vocab)


def test_missing_tensor(make_qwen35):
    expect_open(make_qwen35(drop=["blk.3.attn_k.weight"]), "'blk.3.attn_k.weight' not found")


def test_missing_gdn_qkv(make_qwen35):
    # llama.cpp accepts this and crashes in graph build (traps §8); we refuse it at open
    expect_open(make_qwen35(drop=["blk.1.attn_qkv.weight"]), "'blk.1.attn_qkv.weight' not found")


def test_conv1d_transposed(make_qwen35):
    p = make_qwen35(shapes={"blk.0.ssm_conv1d.weight": (160, 4)})
    expect_open(p, "'blk.0.ssm_conv1d.weight' has wrong shape; expected {4, 160}, got {160, 4}")


def test_attn_q_without_gate(make_qwen35):
    p = make_qwen35(shapes={"blk.3.attn_q.weight": (64, 128)})
    expect_open(p, "'blk.3.attn_q.weight' has wrong shape; expected {64, 256}, got {64, 128}")


def test_token_count_differs_from_embedding_rows(make_qwen35):
    p = make_qwen35(n_tokens=1024)
    expect_open(p, "'token_embd.weight' has wrong shape; expected {64, 1024}, got {64, 1000}")


@pytest.mark.parametrize("name", ["blk.0.ssm_a", "blk.0.ssm_conv1d.weight", "blk.3.attn_q_norm.weight",
                                  "output_norm.weight", "blk.2.ssm_dt.bias"])
def test_vectors_must_be_f32(make_qwen35, name):
    expect_open(make_qwen35(types={name: "F16"}), f"'{name}' is F16", "F32")


def test_unknown_tensor(make_qwen35):
    p = make_qwen35(extra_tensors={"blk.0.attn_q.weight": (64, 256)})
    expect_open(p, "unexpected tensor 'blk.0.attn_q.weight'", "linear-attention")


def test_mtp_tensors_without_nextn_metadata(make_qwen35):
    p = make_qwen35(mtp=True, meta_drop=["qwen35.nextn_predict_layers"],
                    meta_override={"qwen35.block_count": (8, "UINT32")})
    expect_open(p, "unexpected tensor 'blk.8.", "block_count 8")


def test_nextn_metadata_without_mtp_tensors(make_qwen35):
    from tightfit.model.config import TINY
    import dataclasses
    mtp_names = dataclasses.replace(TINY, nextn_layers=1).block_tensor_shapes(8)
    with open_model(make_qwen35(mtp=True, drop=list(mtp_names))) as mf:
        assert mf.config.nextn_layers == 1 and not mf.mtp_tensors
        assert not mf.inventory.mtp_complete
        assert "blk.8.nextn.eh_proj.weight" in mf.inventory.mtp_missing


def test_tied_output(make_qwen35):
    with open_model(make_qwen35(drop=["output.weight"])) as mf:
        assert mf.inventory.tied_output and mf.config.tied_output
        assert "output.weight" not in mf.trunk_tensors and len(mf.trunk_tensors) == 108


def test_missing_required_key(make_qwen35):
    expect_open(make_qwen35(meta_drop=["qwen35.ssm.conv_kernel"]), "qwen35.ssm.conv_kernel")


def test_block_count_wrong_type(make_qwen35):
    expect_open(make_qwen35(meta_override={"qwen35.block_count": (8, "INT32")}),
                "qwen35.block_count", "INT32")


@pytest.mark.parametrize("key,val", [("qwen35.block_count", 2**32 - 1),
                                     ("qwen35.full_attention_interval", 0)])
def test_absurd_values_fail_fast(make_qwen35, key, val):
    expect_open(make_qwen35(meta_override={key: (val, "UINT32")}), key.split(".", 1)[1])


# ---- the CLI -------------------------------------------------------------------------------------
def test_inspect_json_bytes_by_type(tiny_gguf, capsys):
    assert main(["inspect", str(tiny_gguf), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    s = json.loads(out)
    oracle = gguf.GGUFReader(str(tiny_gguf))
    want: dict[str, int] = defaultdict(int)
    n_params = 0
    for t in oracle.tensors:
        if not t.name.startswith("blk.8."):
            want[t.tensor_type.name] += int(t.n_bytes)
            n_params += int(t.n_elements)
    assert s["bytes_by_type"] == dict(want)
    assert set(want) == {"F32", "F16", "Q8_0"}
    assert s["arch"] == "qwen35" and s["n_layers"] == 8 and s["mtp_layers"] == 1
    assert s["n_params"] == n_params
    assert s["file_bytes"] == tiny_gguf.stat().st_size
    assert [b["kind"] for b in s["blocks"]] == ["gdn"] * 3 + ["attention"] + ["gdn"] * 3 + \
        ["attention", "mtp"]
    assert s["tokenizer"]["n_tokens"] == 1000 and s["tokenizer"]["eos_id"] == 999
    assert s["tokenizer"]["has_chat_template"] is True


def test_inspect_tables(tiny_gguf, capsys):
    assert main(["inspect", str(tiny_gguf), "--tensors"]) == 0
    out = capsys.readouterr().out
    for frag in ("Gated DeltaNet", "full attention", "MTP", "Q8_0", "F16", "blk.8.nextn.eh_proj.weight"):
        assert frag in out, frag


def test_inspect_without_model_uses_demo(capsys, monkeypatch, tiny_gguf):
    try:
        import tightfit.model.demo as demo
    except ModuleNotFoundError:
        assert main(["inspect", "--json"]) == 1
        assert "MODEL" in capsys.readouterr().err
        return
    monkeypatch.setattr(demo, "demo_model_path", lambda: tiny_gguf)
    assert main(["inspect", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str(tiny_gguf)


def test_cli_corrupt_file_one_line_no_traceback(tmp_path, tiny_gguf):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny_gguf.read_bytes()[:5000])
    r = subprocess.run([sys.executable, "-m", "tightfit.cli", "inspect", str(bad)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.gguf" in lines[0], r.stderr
    assert r.stdout == ""


def test_generator_output_passes_inventory(tmp_path, capsys):
    """Integration: tightfit's own generator and the inventory must agree (tied + MTP variant);
    byte sums still come from gguf-py's reader."""
    gen = pytest.importorskip("tightfit.model.generate")
    p = tmp_path / "gen.gguf"
    gen.make_model(p, "tiny", seed=1, qtype="Q8_0", mtp=True, tied=True)
    assert main(["inspect", str(p), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["mtp_layers"] == 1 and s["mtp"]["complete"] and s["geometry"]["tied_output"]
    oracle = gguf.GGUFReader(str(p))
    want: dict[str, int] = defaultdict(int)
    for t in oracle.tensors:
        if not t.name.startswith(f"blk.{s['n_layers']}."):
            want[t.tensor_type.name] += int(t.n_bytes)
    assert s["bytes_by_type"] == dict(want)
