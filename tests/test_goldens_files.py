"""The committed llama.cpp goldens (tests/goldens/, made by scripts/make_goldens.py) still refer to
the bytes the generator writes: every golden's GGUF is regenerated from its manifest arguments and
its sha256 compared with the one recorded when llama.cpp evaluated it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tightfit.model.generate import make_model, sha256_file

HERE = Path(__file__).resolve().parent
GOLD = HERE / "goldens"
MANIFEST = GOLD / "manifest.json"
SHARED = HERE.parent.parent / "shared"

pytestmark = pytest.mark.skipif(not (SHARED / "fixtures" / "ggml-vocab-qwen35.gguf").exists(),
                                reason=f"shared fixtures (vocabulary, chat template) not found at {SHARED}")


def _manifest() -> dict:
    return json.loads(MANIFEST.read_text())


CASES = _manifest()["cases"] if MANIFEST.exists() else []
# the 27B-geometry slice writes ~0.95 GB into tmp_path (about 10 s on 2 cores)
REGEN = [pytest.param(c, marks=pytest.mark.slow) if c["bytes"] > 200e6 else c for c in CASES]


def test_manifest_shape():
    m = _manifest()
    assert m["llama_cpp_python"] and m["llama_settings"]["flash_attn"] is False
    assert m["llama_settings"]["type_k"] == 0 and m["llama_settings"]["type_v"] == 0
    assert len(m["tokens"]) == m["n_prompt"] + m["n_decode"]
    assert len(CASES) >= 20
    total = sum(p.stat().st_size for p in GOLD.iterdir())
    assert total < 15e6, f"goldens take {total / 1e6:.1f} MB"
    greedy = [c for c in CASES if "greedy" in c]
    assert any(c["args"]["preset"] == "tiny" and c["args"]["qtype"] == "F32" for c in greedy)
    for c in greedy:
        assert len(c["greedy"]["ids"]) >= 32


@pytest.mark.parametrize("case", REGEN, ids=[c["id"] for c in CASES])
def test_golden_bytes_regenerate(case, tmp_path):
    a = case["args"]
    q = tmp_path / "q.gguf"
    tw = tmp_path / "t.gguf" if "twin_sha256" in case else None
    make_model(q, a["preset"], seed=a["seed"], qtype=a["qtype"], mix=a["mix"], vocab=a["vocab"], mtp=a["mtp"],
               tied=a["tied"], layers=a["layers"], f32_twin_path=tw)
    assert sha256_file(q) == case["sha256"], "generator output changed: rerun scripts/make_goldens.py"
    if tw is not None:
        assert sha256_file(tw) == case["twin_sha256"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_golden_logits_consistent(case):
    """llama.cpp's logits on the quantized file and on its F32 twin describe the same model (only
    llama.cpp's activation quantization separates them), so the twin really is the dequantized file."""
    m = _manifest()
    z = np.load(GOLD / f"{case['id']}.npz")
    assert z["tokens"].tolist() == m["tokens"]
    L = z["logits"]
    assert L.dtype == np.float32 and L.shape == (len(m["tokens"]), 1000) and np.isfinite(L).all()
    if "logits_twin" in z:
        T = z["logits_twin"]
        d = np.abs(L - T) / T.std()
        assert d.max() < 0.35 and np.sqrt((d ** 2).mean()) < 0.05
        assert (L.argmax(1) == T.argmax(1)).mean() >= 0.85


@pytest.mark.llama
def test_llama_cpp_reproduces_a_twin_golden(tmp_path):
    """Re-evaluate one twin with the installed llama.cpp: float math must agree to ~1e-3 of std."""
    llama_cpp = pytest.importorskip("llama_cpp")
    m = _manifest()
    case = next(c for c in CASES if c["id"] == "small-Q4_K")
    a = case["args"]
    tw = tmp_path / "t.gguf"
    make_model(tmp_path / "q.gguf", a["preset"], seed=a["seed"], qtype=a["qtype"], vocab=a["vocab"], f32_twin_path=tw)
    llm = llama_cpp.Llama(str(tw), **m["llama_settings"])
    toks = m["tokens"]
    llm.eval(toks[: m["n_prompt"]])
    for t in toks[m["n_prompt"]:]:
        llm.eval([t])
    got = np.array(llm.scores[: len(toks)])
    ref = np.load(GOLD / "small-Q4_K.npz")["logits_twin"]
    assert np.abs(got - ref).max() / ref.std() < 1e-3
