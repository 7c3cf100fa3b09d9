"""Verification: (1) speculative rejection sampling reproduces the target distribution on toy
targets (chi-square against the exact distribution); (2) the native per-position rollback leaves
exactly the state a plain ReferenceModel.forward over the kept tokens leaves (the oracle is the
model's own forward on a fresh state, a separate code path)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from tightfit.runtime.sampler import Sampler, SamplingParams, apply_penalties, filtered_distribution
from tightfit.runtime.spec.verify import Acceptor, NativeVerifier, ReplayVerifier


def _exact(row, hist, params):
    ids, p = filtered_distribution(apply_penalties(row, hist, params), params)
    return dict(zip(ids.tolist(), p.tolist()))


def _chi2(counts: dict, probs: dict, n: int) -> float:
    keys = sorted(set(probs) | set(counts))
    exp = np.array([probs.get(k, 0.0) * n for k in keys])
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    assert obs[exp == 0].sum() == 0, "a token outside the target's support was emitted"
    m = exp > 0
    return stats.chisquare(obs[m], exp[m] / exp[m].sum() * obs[m].sum()).pvalue


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1),
    SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.02, seed=2, repeat_penalty=1.4),
])
@pytest.mark.parametrize("drafter", ["onehot", "stochastic"])
def test_two_position_rejection_sampling_matches_target(params, drafter):
    """Target over V=8 with a 2-token draft; the emitted first two tokens must follow the target
    joint p(a) p(b|a), whether the drafts are accepted or rejected."""
    V, N = 8, 12000
    g = np.random.default_rng(7)
    row0 = g.normal(size=V).astype(np.float32) * 1.5
    rows1 = {a: g.normal(size=V).astype(np.float32) * 1.5 for a in range(V)}   # row after a
    hist = [3, 3, 1]
    acc = Acceptor(Sampler(params))
    qg = np.random.default_rng(11)
    q0 = qg.dirichlet(np.ones(V))
    q1 = qg.dirichlet(np.ones(V))
    counts: dict = {}
    n_acc = 0
    top = sorted(_exact(row0, hist, params).items(), key=lambda kv: -kv[1])
    fixed = [top[min(1, len(top) - 1)][0], top[0][0]]       # a likely but not certain draft
    for _ in range(N):
        if drafter == "onehot":
            d = fixed
            qs = [None, None]
        else:
            d = [int(qg.choice(V, p=q0)), int(qg.choice(V, p=q1))]
            qs = [(np.arange(V), q0), (np.arange(V), q1)]
        t0, ok0 = acc.step(row0, hist, d[0], qs[0])
        if ok0:
            n_acc += 1
            t1, _ = acc.step(rows1[t0], hist + [t0], d[1], qs[1])
        else:
            t1 = acc.target(rows1[t0], hist + [t0])
        counts[(t0, t1)] = counts.get((t0, t1), 0) + 1
    p0 = _exact(row0, hist, params)
    joint = {(a, b): pa * pb for a, pa in p0.items()
             for b, pb in _exact(rows1[a], hist + [a], params).items()}
    assert 0 < n_acc < N          # both the accept and the reject branch ran
    assert _chi2(counts, joint, N) > 1e-3


def test_greedy_acceptance_is_argmax_of_penalised_logits():
    params = SamplingParams(temperature=0.0, repeat_penalty=2.0)
    row = np.array([0.0, 5.0, 4.0, -1.0], dtype=np.float32)
    acc = Acceptor(Sampler(params))
    # token 1 is in the history: 5/2 = 2.5 < 4 -> the target is 2
    assert acc.step(row, [1], 1) == (2, False)
    assert acc.step(row, [0], 1) == (1, True)


# ---- native rollback --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ref_model():
    from tightfit.model.demo import demo_model_path
    from tightfit.model.reference import ReferenceModel
    torch.set_num_threads(1)
    return ReferenceModel.from_model_file(str(demo_model_path()))


def _state_tensors(st):
    snap = st.snapshot(include_kv=True)
    return snap.conv + snap.ssm + [t for kv in snap.kv for t in kv]


@pytest.mark.parametrize("verifier", [NativeVerifier, ReplayVerifier])
@pytest.mark.parametrize("keep", [1, 2, 4, 5])
def test_partial_commit_equals_plain_forward_of_kept_tokens(ref_model, verifier, keep):
    m = ref_model
    prompt = [11, 500, 73, 1024, 9, 300, 301, 302]
    block = [77, 1500, 42, 42, 7]
    ver = verifier(m)
    st = m.new_state(64)
    ver.prefill(prompt, st)
    rnd = ver.begin(block, st)
    if verifier is NativeVerifier:
        assert st.pos == len(prompt)                   # nothing committed before commit()
    rnd.commit(keep)
    assert st.pos == len(prompt) + keep
    # oracle: the plain forward of prompt + kept tokens on a fresh state
    ref = m.new_state(64)
    m.forward(prompt, ref, logits="none")
    m.forward(block[:keep], ref, logits="none")
    for a, b in zip(_state_tensors(st), _state_tensors(ref)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # and the next step continues identically
    nxt = [1234, 5]
    la = m.forward(nxt, st, logits="all")
    lb = m.forward(nxt, ref, logits="all")
    torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4)


def test_native_block_logits_and_hidden_match_reference(ref_model):
    m = ref_model
    prompt, block = [5, 6, 7, 8, 9], [100, 200, 300, 400]
    ver = NativeVerifier(m)
    st = m.new_state(64)
    last, hidden = ver.prefill(prompt, st)
    ref = m.new_state(64)
    want = m.forward(prompt + block, ref, logits="all").numpy()
    np.testing.assert_allclose(last, want[len(prompt) - 1], rtol=1e-4, atol=1e-4)
    rnd = ver.begin(block, st)
    np.testing.assert_allclose(rnd.logits, want[len(prompt):], rtol=1e-4, atol=1e-4)
    # hidden rows are output_norm(h): the LM head of them gives the logits
    lg = torch.nn.functional.linear(rnd.hidden, m.weights[m._head].float())
    np.testing.assert_allclose(lg.numpy(), want[len(prompt):], rtol=1e-4, atol=1e-4)
    assert hidden.shape == (len(prompt), m.config.n_embd)
