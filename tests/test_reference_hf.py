"""ReferenceModel vs transformers' Qwen3_5ForCausalLM (outside oracle).

A small random HF model is converted to GGUF conventions by tests/hf_oracle.py (spec §2.5), the
reference runs a batched prompt then single-token decode steps, and every position's logits are
compared with one uncached HF forward over the same sequence. HF computes the delta rule in
float32 even for a float64 model, so float64 agreement is ~1e-5 of the logit std, not 1e-12.
Negative controls show that the comparison catches the classic conversion/forward mistakes.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers.models.qwen3_5")

from hf_oracle import hf_logits, hf_to_gguf, make_hf_model  # noqa: E402
from tightfit.model.reference import ReferenceModel  # noqa: E402

PROMPT, DECODE = 40, 6


def _tokens(n_vocab: int, n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_vocab, (n,), generator=g).tolist()


def _run(ref: ReferenceModel, toks: list[int], prompt: int) -> torch.Tensor:
    st = ref.new_state(len(toks) + 8)
    rows = [ref.forward(toks[:prompt], st)]
    for t in toks[prompt:]:
        rows.append(ref.forward([t], st))
    assert st.pos == len(toks)
    return torch.cat(rows).double()


def _dist(a: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |diff|, rms diff) in units of the oracle's logit std."""
    d = (a.double() - ref.double())
    s = float(ref.double().std())
    return float(d.abs().max()) / s, float(d.pow(2).mean().sqrt()) / s


GEOMETRIES = {
    # Hv/Hk = 3 (the 27B's ratio), attention every 4th block
    "ratio3": dict(k_heads=2, v_heads=6, n_layer=4),
    # Hv == Hk: the V-head permutation is the identity
    "ratio1": dict(k_heads=3, v_heads=3, n_layer=4, n_head=6, n_head_kv=3, head_dim=16,
                   mrope_section=(1, 1, 2)),
    # Hv/Hk = 2, explicit layer_types, tied LM head, a larger rotary fraction, MHA-ish GQA
    "ratio2_tied": dict(k_heads=2, v_heads=4, n_layer=5, tied=True, rotary_factor=0.5,
                        mrope_section=(3, 3, 2), n_head=2, n_head_kv=2,
                        layer_types=["linear_attention", "full_attention", "linear_attention",
                                     "linear_attention", "full_attention"]),
}


@pytest.fixture(scope="module", params=sorted(GEOMETRIES))
def hf_case(request):
    model = make_hf_model(seed=7, **GEOMETRIES[request.param])
    cfg, w = hf_to_gguf(model)
    toks = _tokens(cfg.n_vocab, PROMPT + DECODE, seed=3)
    return request.param, model, cfg, w, toks, hf_logits(model, toks)


def test_float64_matches_hf(hf_case):
    name, model, cfg, w, toks, ref = hf_case
    ref_model = ReferenceModel(cfg, w, dtype=torch.float64, kv_dtype=None)
    got = _run(ref_model, toks, PROMPT)
    mx, rms = _dist(got, ref)
    print(f"\n[{name}] float64 vs HF: max {mx:.2e} std, rms {rms:.2e} std")
    assert mx <= 1e-4, (name, mx)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_float32_f16kv_matches_hf(hf_case):
    """The default mode (float32 compute, K/V rounded to f16 like llama.cpp)."""
    name, model, cfg, w, toks, ref = hf_case
    w32 = {k: v.float() for k, v in w.items()}
    got = _run(ReferenceModel(cfg, w32), toks, PROMPT)
    mx, rms = _dist(got, ref)
    print(f"\n[{name}] float32+f16 KV vs HF: max {mx:.2e} std, rms {rms:.2e} std")
    assert mx <= 5e-3 and rms <= 1e-3, (name, mx, rms)


def test_bf16_storage_runs_close():
    """bf16 weight storage (the memory-saving mode) stays within bf16 weight noise of HF."""
    model = make_hf_model(seed=7, **GEOMETRIES["ratio3"])
    cfg, w = hf_to_gguf(model)
    toks = _tokens(cfg.n_vocab, 20, seed=4)
    ref = hf_logits(model, toks)
    wb = {k: (v.float() if v.dim() == 1 else v.to(torch.bfloat16)) for k, v in w.items()}
    got = _run(ReferenceModel(cfg, wb), toks, 12)
    mx, rms = _dist(got, ref)
    print(f"\n[ratio3] bf16 storage vs HF: max {mx:.2e} std, rms {rms:.2e} std")
    assert rms <= 0.05 and mx <= 0.25


def _perturbed_distance(model, toks, ref, mutate) -> float:
    cfg, w = hf_to_gguf(model)
    mutate(cfg, w)
    got = _run(ReferenceModel(cfg, w, dtype=torch.float64, kv_dtype=None), toks, PROMPT)
    return _dist(got, ref)[0]


def test_negative_controls_are_detected():
    """Each classic mistake moves the logits by far more than the 1e-4 tolerance, so the
    comparison above can fail."""
    model = make_hf_model(seed=7, **GEOMETRIES["ratio3"])
    toks = _tokens(300, PROMPT + DECODE, seed=3)
    ref = hf_logits(model, toks)

    # grouped (HF) V-head order left in the GGUF tensors
    cfg_g, w_g = hf_to_gguf(model, grouped_v=True)
    got = _run(ReferenceModel(cfg_g, w_g, dtype=torch.float64, kv_dtype=None), toks, PROMPT)
    assert _dist(got, ref)[0] > 0.05

    def no_plus_one(cfg, w):
        for k in list(w):
            if k.endswith("attn_norm.weight"):
                w[k] = w[k] - 1.0

    def reversed_conv(cfg, w):
        for k in list(w):
            if k.endswith("ssm_conv1d.weight"):
                w[k] = w[k].flip(-1).contiguous()

    def ssm_a_scaled(cfg, w):
        for k in list(w):
            if k.endswith("ssm_a"):
                w[k] = w[k] * 1.5

    for mutate in (no_plus_one, reversed_conv, ssm_a_scaled):
        assert _perturbed_distance(model, toks, ref, mutate) > 1e-2, mutate.__name__
