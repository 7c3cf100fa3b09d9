"""Sampler vs transformers' logits processors (an outside implementation of the same filters)."""
import numpy as np
import pytest
import torch

from tightfit.errors import UserError
from tightfit.runtime.sampler import Sampler, SamplingParams, apply_penalties, filtered_distribution

tf = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
    TopKLogitsWarper, TopPLogitsWarper)


def hf_probs(logits, history, top_k, top_p, min_p, rep, temp):
    scores = torch.tensor(logits, dtype=torch.float64)[None]
    ids = torch.tensor([history], dtype=torch.long)
    if rep != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(rep)(ids, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    if min_p > 0:
        scores = MinPLogitsWarper(min_p)(ids, scores)
    # llama.cpp applies temperature after the filters; so do we: compare filters at T=1,
    # then temperature on the survivors.
    scores = TemperatureLogitsWarper(temp)(ids, scores)
    return torch.softmax(scores, -1)[0].numpy()


@pytest.mark.parametrize("seed", range(12))
def test_filters_match_transformers(seed):
    rng = np.random.default_rng(seed)
    V = int(rng.integers(50, 3000))
    logits = (rng.standard_normal(V) * rng.uniform(0.5, 4)).astype(np.float32)
    history = [int(t) for t in rng.integers(0, V, size=int(rng.integers(0, 40)))]
    top_k = int(rng.choice([0, 1, 5, 40, V + 3]))
    top_p = float(rng.choice([1.0, 0.9, 0.5, 0.1]))
    min_p = float(rng.choice([0.0, 0.05, 0.2]))
    rep = float(rng.choice([1.0, 1.1, 1.5]))
    p = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p,
                       repeat_penalty=rep, repeat_last_n=-1)
    x = apply_penalties(logits, history, p)
    ids, probs = filtered_distribution(x, p)
    ours = np.zeros(V)
    ours[ids] = probs
    ref = hf_probs(logits, history, top_k, top_p, min_p, rep, 1.0)
    np.testing.assert_allclose(ours, ref, atol=1e-6)


def test_temperature_applies_after_filters():
    rng = np.random.default_rng(7)
    logits = rng.standard_normal(500).astype(np.float32) * 3
    p = SamplingParams(temperature=0.5, top_k=20, top_p=1.0, min_p=0.0)
    ids, probs = filtered_distribution(logits, p)
    ours = np.zeros(500)
    ours[ids] = probs
    ref = hf_probs(logits, [], 20, 1.0, 0.0, 1.0, 0.5)
    np.testing.assert_allclose(ours, ref, atol=1e-6)


def test_openai_presence_frequency_formula():
    logits = np.zeros(10, dtype=np.float32)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repeat_last_n=-1)
    out = apply_penalties(logits, [3, 3, 3, 7], p)
    # OpenAI: mu[j] - c[j]*freq - (c[j] > 0)*presence
    assert out[3] == pytest.approx(-3 * 0.25 - 0.5)
    assert out[7] == pytest.approx(-0.25 - 0.5)
    assert out[0] == 0.0


def test_repeat_window_only_counts_recent_tokens():
    logits = np.full(10, 2.0, dtype=np.float32)
    p = SamplingParams(repeat_penalty=2.0, repeat_last_n=2)
    out = apply_penalties(logits, [1, 2, 3], p)
    assert out[1] == 2.0 and out[2] == 1.0 and out[3] == 1.0


def test_greedy_and_seed_reproducibility():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((50, 300)).astype(np.float32)
    g = Sampler(SamplingParams(temperature=0))
    assert [g(r) for r in rows] == [int(np.argmax(r)) for r in rows]
    a = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42))
    b = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42))
    assert [a(r) for r in rows] == [b(r) for r in rows]


def test_draws_follow_the_distribution():
    # chi-square against the softmax at T=1 over a small vocabulary
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.125], dtype=np.float64)).astype(np.float32)
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1))
    n = 20000
    counts = np.bincount([s(logits) for _ in range(n)], minlength=4)
    expected = np.array([0.5, 0.25, 0.125, 0.125]) * n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 16.27  # p = 0.001 at 3 degrees of freedom


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=1.5), dict(min_p=-0.1),
                                 dict(repeat_penalty=0), dict(presence_penalty=3)])
def test_bad_params_are_user_errors(bad):
    with pytest.raises(UserError):
        SamplingParams(**bad).validate()
