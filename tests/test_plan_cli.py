"""`tightfit plan` end to end: JSON object, exit codes, and header-only GGUF planning."""
from __future__ import annotations

import json

import pytest
import torch

from tightfit.cli import main


def run(capsys, *argv):
    rc = main(["plan", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_fits(capsys):
    rc, out, _ = run(capsys, "--preset", "qwen3.8-27b-seedmix", "--ctx", "8192", "--vram",
                     "15.6GiB", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["fits"] and d["kv_cache_bytes"] == 512 * 2**20 and d["available_bytes"] == int(15.6 * 2**30)
    assert d["recurrent_state_bytes"] == 2 * 156_893_184


def test_does_not_fit_exit_2_with_whole_bill(capsys):
    rc, out, err = run(capsys, "--preset", "qwen3.8-27b-seedmix", "--ctx", "131072", "--vram",
                       "7600MiB", "--json")
    assert rc == 2
    d = json.loads(out)
    assert not d["fits"] and d["total_bytes"] > d["available_bytes"]
    assert d["would_fit"]["max_ctx"] > 0 and "largest ctx" in err
    rc, out, err = run(capsys, "--preset", "qwen3.8-27b-seedmix", "--ctx", "131072", "--vram", "7600MiB")
    assert rc == 2 and "does not fit" in out and "total" in out


def test_table_output(capsys):
    rc, out, _ = run(capsys, "--preset", "qwen3.8-27b-seedmix", "--vram", "13.5GB")
    assert rc == 0 and "fits" in out and "ffn_" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device gives a default --vram")
def test_no_cuda_needs_vram(capsys):
    rc, _, err = run(capsys, "--preset", "qwen3.8-27b-seedmix")
    assert rc == 1 and "--vram" in err


def test_gguf_header_plan(capsys, tmp_path):
    from test_plan_arena import write_tiny
    path = tmp_path / "t.gguf"
    write_tiny(path)
    rc, out, _ = run(capsys, str(path), "--ctx", "256", "--vram", "64MiB", "--json", "--reserve", "0")
    assert rc == 0
    d = json.loads(out)
    assert d["placement"]["excluded"] and all(n.startswith("blk.8.") for n in d["placement"]["excluded"])


def test_bad_args(capsys):
    rc, _, err = run(capsys, "--preset", "qwen3.8-27b-seedmix", "--vram", "lots")
    assert rc == 1 and "size" in err
    rc, _, err = run(capsys, "/nonexistent.gguf", "--vram", "8GiB")
    assert rc == 1 and "no such file" in err
