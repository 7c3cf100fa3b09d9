"""BlockVerifier: speculative decoding on the GPU executor (tightfit.model.executor.GPUModel, run
on the CPU with its torch fallbacks), verifying each draft with one `forward_block` and keeping the
accepted prefix with `Block.commit` (native rollback, nothing re-run).

Oracles: the plain `Engine.generate` loop of the same GPUModel (one-token graph step per token, a
different code path from the batched block forward) for greedy output; the exact target
distribution, enumerated from `Engine.logits` of fresh sequences, for sampled output."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from tightfit.runtime.sampler import GREEDY, SamplingParams, apply_penalties, filtered_distribution
from tightfit.runtime.spec import BlockVerifier, SpecConfig, SpeculativeEngine, make_verifier

N_CTX = 640


@pytest.fixture(scope="module")
def engine():
    from tightfit.api import open_model
    from tightfit.model.demo import demo_model_path
    from tightfit.model.executor import GPUModel
    from tightfit.runtime.engine import Engine
    from tightfit.tokenizer import from_gguf
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    mf = open_model(str(demo_model_path()))
    exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=N_CTX, use_triton=False)
    yield Engine(mf, exe, from_gguf(mf.gguf.metadata), n_ctx=N_CTX,
                 chat_template=mf.gguf.metadata.get("tokenizer.chat_template"))
    torch.set_num_threads(threads)
    mf.close()


def _run(events):
    evs = list(events)
    return evs, evs[-1]


PROMPTS = [
    [100, 200, 300, 100, 200, 300, 100, 200],
    [42] * 20,
    [1500, 3, 1500, 3, 1500, 3, 1500],
    [7, 1000, 250, 13, 99, 2000, 17, 5, 640, 321, 1234, 77],
]


def test_auto_picks_the_block_verifier(engine):
    assert isinstance(make_verifier(engine.model), BlockVerifier)
    assert isinstance(SpeculativeEngine(engine).verifier, BlockVerifier)


def test_greedy_identical_to_plain_gpumodel(engine):
    se = SpeculativeEngine(engine, SpecConfig(drafters=("ngram", "suffix")))
    total_acc = 0
    for p in PROMPTS:
        sa, sb = engine.new_state(), engine.new_state()
        a, la = _run(engine.generate(p, max_tokens=220, sampling=GREEDY, state=sa))
        b, lb = _run(se.generate(p, max_tokens=220, sampling=GREEDY, state=sb))
        assert len(la.tokens) >= 200
        assert lb.tokens == la.tokens
        assert [e.token for e in b] == [e.token for e in a]
        assert "".join(e.text for e in b) == "".join(e.text for e in a)
        assert lb.finish_reason == la.finish_reason
        assert sb.pos == sa.pos
        d = lb.timings.as_dict()
        assert 0 <= d["draft_n_accepted"] <= d["draft_n"]
        assert d["spec_rounds"] + 1 >= len(lb.tokens) - d["draft_n_accepted"]
        total_acc += d["draft_n_accepted"]
        if p in (PROMPTS[0], PROMPTS[1]):
            assert d["draft_n_accepted"] > 20, d            # acceptance is exercised
            assert d["spec_rounds"] < len(lb.tokens)        # several tokens per forward
        # the committed state continues exactly like the plain one
        la2 = engine.model.forward([5], sa, logits="last")
        lb2 = engine.model.forward([5], sb, logits="last")
        torch.testing.assert_close(lb2, la2, rtol=1e-4, atol=1e-4)
    assert total_acc > 100


def test_block_prefill_hidden_rows_give_the_logits(engine):
    """BlockVerifier.prefill(want_hidden) (the executor's prefill_hidden): its hidden rows are
    output_norm(h) (the LM head of them gives the plain logits) and its last row the last logits."""
    ids = list(range(30, 30 + 150))
    ver = BlockVerifier(engine.model, hidden_chunk=64)
    st = engine.new_state()
    last, hidden = ver.prefill(ids, st)
    assert st.pos == len(ids) and hidden.shape == (len(ids), engine.config.n_embd)
    want = engine.logits(ids)
    np.testing.assert_allclose(last, want[-1], rtol=1e-4, atol=1e-4)
    from tightfit.model.weights import dequantize_tensor
    head = dequantize_tensor(engine.file.gguf.tensors["output.weight"], torch.float32)
    lg = torch.nn.functional.linear(hidden.float(), head).numpy()
    np.testing.assert_allclose(lg, want, rtol=2e-3, atol=2e-3)
    # a round without a draft (one token, the executor's step) and a block round: their logits
    # and hidden rows continue the same sequence
    want = engine.logits(ids + [7, 8, 9, 10])
    one = ver.begin([7], st)
    one.commit(1)
    blk = ver.begin([8, 9, 10], st)
    blk.commit(3)
    assert st.pos == len(ids) + 4
    rows = np.stack([one.row(0)] + [blk.row(i) for i in range(3)])
    np.testing.assert_allclose(rows, want[len(ids):], rtol=1e-4, atol=1e-4)
    h = torch.cat([one.hidden.float(), blk.hidden.float()], 0)
    np.testing.assert_allclose(torch.nn.functional.linear(h, head).numpy(), want[len(ids):],
                               rtol=2e-3, atol=2e-3)


def _exact_joint(engine, prompt, params, n):
    out = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for pre, pp in out.items():
            seq = list(prompt) + list(pre)
            row = engine.logits(seq)[-1]
            ids, p = filtered_distribution(apply_penalties(row, seq, params), params)
            for i, q in zip(ids.tolist(), p.tolist()):
                nxt[pre + (i,)] = pp * q
        out = nxt
    return out


def test_sampled_distribution_matches_target(engine):
    params = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    head = PROMPTS[0]
    prompt = head + _run(engine.generate(head, max_tokens=30, sampling=GREEDY))[1].tokens
    n, N = 3, 600
    exact = _exact_joint(engine, prompt, params, n)
    se = SpeculativeEngine(engine, SpecConfig(drafters=("ngram",), adaptive=False))
    base = engine.new_state()
    engine.model.forward(prompt[:-1], base, logits="none")
    snap = base.snapshot(include_kv=True)
    counts: dict = {}
    drafted = accepted = 0
    for i in range(N):
        base.restore(snap)
        _, last = _run(se.generate(prompt, max_tokens=n, sampling=replace(params, seed=2000 + i),
                                   state=base, n_past=len(prompt) - 1))
        key = tuple(last.tokens)
        counts[key] = counts.get(key, 0) + 1
        drafted += last.timings.draft_n
        accepted += last.timings.draft_n_accepted
    assert 0 < accepted < drafted            # both accept and reject branches ran
    keys = sorted(exact)
    assert set(counts) <= set(keys)
    exp = np.array([exact[k] * N for k in keys])
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    rare = exp < 5
    e2 = np.append(exp[~rare], exp[rare].sum())
    o2 = np.append(obs[~rare], obs[rare].sum())
    if e2[-1] == 0:
        e2, o2 = e2[:-1], o2[:-1]
    p = stats.chisquare(o2, e2 / e2.sum() * o2.sum()).pvalue
    assert p > 1e-3, (p, accepted, drafted)


def test_mtp_drafter_on_the_block_verifier_keeps_greedy_output(tmp_path):
    """A model with an MTP block: the head reads the hidden rows of BlockVerifier's prefill and
    blocks; the output stays the plain greedy one (the random head is rarely right, so this checks
    correctness of the hidden-row plumbing, not speed)."""
    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.model.generate import make_model
    from tightfit.runtime.engine import Engine
    from tightfit.tokenizer import from_gguf
    p = tmp_path / "mtp.gguf"
    make_model(p, preset="tiny", qtype="Q8_0", mtp=True, vocab="small:2048", seed=1)
    mf = open_model(p)
    try:
        exe = GPUModel.from_model_file(mf, device="cpu", n_ctx=N_CTX, use_triton=False)
        eng = Engine(mf, exe, from_gguf(mf.gguf.metadata), n_ctx=N_CTX)
        se = SpeculativeEngine(eng, SpecConfig(drafters=("ngram", "mtp")))
        assert se.mtp_head is not None and isinstance(se.verifier, BlockVerifier)
        a = _run(eng.generate(PROMPTS[0], max_tokens=60, sampling=GREEDY))[1]
        b = _run(se.generate(PROMPTS[0], max_tokens=60, sampling=GREEDY))[1]
        assert b.tokens == a.tokens
        assert b.timings.per_drafter.get("mtp", {}).get("draft_n", 0) > 0
    finally:
        mf.close()


def test_block_argmaxes_take_the_first_max_like_numpy():
    from tightfit.model.batch import Block
    from tightfit.runtime.spec.verify import _Round
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [5.0, 5.0, 0.0, 5.0], [-1.0, -4.0, -0.5, -0.5]])
    want = [int(i) for i in np.argmax(x.numpy(), axis=1)]
    assert want == [1, 0, 2]
    assert Block(x, None, lambda n: None).argmaxes() == want
    assert _Round(x.numpy(), None, lambda n: None).argmaxes() == want


def test_plain_greedy_rounds_read_argmaxes_not_rows(engine, monkeypatch):
    """Greedy without penalties never copies a row of logits to the host (Block.row would
    raise) and emits what the plain loop emits; with a repetition penalty the rows are read
    (the penalty depends on the history) and Block.argmaxes is never called."""
    from tightfit.model.batch import Block
    se = SpeculativeEngine(engine, SpecConfig(drafters=("ngram", "suffix")))
    p = PROMPTS[0]

    def no_rows(self, i):
        raise AssertionError("a row was copied in a plain-greedy round")
    with monkeypatch.context() as m:
        m.setattr(Block, "row", no_rows)
        _, lb = _run(se.generate(p, max_tokens=120, sampling=GREEDY, state=engine.new_state()))
    _, la = _run(engine.generate(p, max_tokens=120, sampling=GREEDY, state=engine.new_state()))
    assert lb.tokens == la.tokens and lb.timings.as_dict()["draft_n_accepted"] > 10

    pen = replace(GREEDY, repeat_penalty=1.3)

    def no_argmax(self):
        raise AssertionError("argmaxes used with a penalty")
    with monkeypatch.context() as m:
        m.setattr(Block, "argmaxes", no_argmax)
        _, lb = _run(se.generate(p, max_tokens=120, sampling=pen, state=engine.new_state()))
    _, la = _run(engine.generate(p, max_tokens=120, sampling=pen, state=engine.new_state()))
    assert lb.tokens == la.tokens


def test_drafts_stay_within_the_skinny_gemv_block(engine):
    """max_draft beyond GEMV_MAX_M - 1 is capped there: a longer block leaves the skinny GEMV and
    the verify graph (17 tokens: 252 ms against 21.6 for 9 on the device), and the policy's
    linear cost model then settled on 1-token drafts for the rest of the request."""
    from tightfit.model.batch import GEMV_MAX_M
    se = SpeculativeEngine(engine, SpecConfig(drafters=("synthetic",), max_draft=40,
                                              adaptive=False, force_accept=1.0))
    assert se.verifier.max_draft == GEMV_MAX_M - 1
    sizes = []
    begin = se.verifier.begin
    se.verifier.begin = lambda block, st: sizes.append(len(block)) or begin(block, st)
    list(se.generate([5, 6, 7], max_tokens=40, sampling=GREEDY))
    assert sizes and max(sizes) == GEMV_MAX_M


def test_forced_acceptance_rounds_carry_the_expected_tokens(engine):
    """bench/spec.py's forced 80 % with 4-token drafts: the rounds carry (1 - 0.8^5) / 0.2 = 3.36
    tokens on average (the stratified draws of spec/forced.py), and every round drafts 4."""
    se = SpeculativeEngine(engine, SpecConfig(drafters=("synthetic",), max_draft=4,
                                              adaptive=False, force_accept=0.8))
    _, last = _run(se.generate([5, 6, 7], max_tokens=301, sampling=GREEDY))
    t = last.timings
    per_round = (t.predicted_n - 1) / t.rounds       # the first token comes before any round
    assert 4 * t.draft_rounds - 8 <= t.draft_n <= 4 * t.draft_rounds   # the last few: cut to room
    assert abs(per_round - 3.3616) < 0.05, per_round
    assert abs(t.draft_n_accepted / t.draft_n - 2.3616 / 4) < 0.015
