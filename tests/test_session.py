"""Session and its hybrid prompt cache, on the real tiny demo model (random weights, real vocab,
the Qwen3.5 chat template). The oracle for every cached run is a cold `Engine.generate` of the
same prompt on a fresh state (an independent path: no snapshot, no restore, one prefill); the
expected cache positions come from the tokenizer and the template, not from the Session."""
from __future__ import annotations

import pytest

from tightfit.errors import UserError
from tightfit.runtime.sampler import GREEDY, SamplingParams
from tightfit.runtime.session import PromptCache, Session
from _demo import demo_engine  # noqa: E402

N_CTX = 384


@pytest.fixture(scope="module")
def engine():
    yield from demo_engine(N_CTX)


def _run(events):
    evs = list(events)
    return evs[-1].tokens, evs[-1], "".join(e.text for e in evs)


def _cold(engine, ids, **kw):
    return _run(engine.generate(list(ids), **kw))


def _ids(engine, text):
    return engine.tokenizer.encode(text, add_special=True, parse_special=True)


CONV = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three colours of the rainbow."}]


def test_turn2_prefills_only_new_tokens_and_matches_cold(engine):
    s = Session(engine)
    toks1, last1, text1 = _run(s.chat(CONV, max_tokens=8, sampling=GREEDY))
    assert last1.timings.cache_n == 0
    p1 = engine.render_chat(CONV)
    assert last1.timings.prompt_n == len(_ids(engine, p1))
    assert toks1 == _cold(engine, _ids(engine, p1), max_tokens=8)[0]

    conv2 = CONV + [{"role": "assistant", "content": text1},
                    {"role": "user", "content": "And two more?"}]
    toks2, last2, _ = _run(s.chat(conv2, max_tokens=8, sampling=GREEDY))
    ids2 = _ids(engine, engine.render_chat(conv2))
    # the template drops the old generation prompt, so turn 2 reuses turn 1's conversation up to
    # the end of its last message; only what turn 2 adds is prefilled
    turn1_msgs = _ids(engine, engine.render_chat(CONV, add_generation_prompt=False))
    assert ids2[:len(turn1_msgs)] == turn1_msgs
    assert last2.timings.cache_n == len(turn1_msgs)
    assert last2.timings.prompt_n == len(ids2) - len(turn1_msgs)
    assert toks2 == _cold(engine, ids2, max_tokens=8)[0]

    # turn 3 reuses turn 2's boundary, which is longer than turn 1's
    conv3 = conv2 + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "ok"}]
    _, last3, _ = _run(s.chat(conv3, max_tokens=2, sampling=GREEDY))
    turn2_msgs = _ids(engine, engine.render_chat(conv2, add_generation_prompt=False))
    assert last3.timings.cache_n == len(turn2_msgs)


def test_same_prompt_again_prefills_one_token_and_seeded_samples_match(engine):
    s = Session(engine)
    prompt = "The quick brown fox jumps over the lazy dog"
    ids = _ids(engine, prompt)
    samp = SamplingParams(temperature=0.9, seed=1234)
    a = _run(s.complete(prompt, max_tokens=6, sampling=samp))
    b = _run(s.complete(prompt, max_tokens=6, sampling=samp))
    assert a[1].timings.cache_n == 0 and b[1].timings.cache_n == len(ids) - 1
    assert b[1].timings.prompt_n == 1
    cold = _cold(engine, ids, max_tokens=6, sampling=samp)
    assert a[0] == b[0] == cold[0]


def test_continuing_a_completion_reuses_the_end_of_generation(engine):
    s = Session(engine)
    ids = _ids(engine, "Once upon a time")
    toks, last, _ = _run(s.complete(ids, max_tokens=5, sampling=GREEDY))
    assert last.finish_reason == "length"
    # the state holds the prompt and all generated tokens but the last (never fed back)
    cont = ids + toks + _ids(engine, " there")
    toks2, last2, _ = _run(s.complete(cont, max_tokens=4, sampling=GREEDY))
    assert last2.timings.cache_n == len(ids) + len(toks) - 1
    assert toks2 == _cold(engine, cont, max_tokens=4)[0]


def test_unrelated_prompt_after_cached_one_is_correct(engine):
    s = Session(engine)
    a = _ids(engine, "alpha beta gamma delta")
    b = _ids(engine, "zeta eta theta")
    _run(s.complete(a, max_tokens=3, sampling=GREEDY))
    toks, last, _ = _run(s.complete(b, max_tokens=5, sampling=GREEDY))
    assert last.timings.cache_n == 0
    assert toks == _cold(engine, b, max_tokens=5)[0]


def test_should_stop_and_early_close_leave_the_session_usable(engine):
    s = Session(engine)
    ids = _ids(engine, "Count with me: one two three")
    calls = {"n": 0}

    def stop_after_three():
        calls["n"] += 1
        return calls["n"] > 3

    toks, last, _ = _run(s.complete(ids, max_tokens=50, sampling=GREEDY, should_stop=stop_after_three))
    assert last.finish_reason == "cancelled" and len(toks) == 3
    g = s.complete(ids, max_tokens=50, sampling=GREEDY)
    next(g)
    g.close()                               # a consumer that walks away mid-generation
    toks2, last2, _ = _run(s.complete(ids, max_tokens=6, sampling=GREEDY))
    assert toks2 == _cold(engine, ids, max_tokens=6)[0]
    assert last2.timings.cache_n == len(ids) - 1


def test_context_limits_are_refused_before_work(engine):
    s = Session(engine)
    with pytest.raises(UserError, match="context"):
        list(s.complete(list(range(10, 10 + N_CTX)), max_tokens=1))
    with pytest.raises(UserError, match="max_tokens"):
        s.check_request(10, N_CTX)
    with pytest.raises(UserError):
        list(s.complete([], max_tokens=1))
    with pytest.raises(UserError, match="vocabulary"):
        list(s.complete([10**7], max_tokens=1))
    assert s.state is None                  # nothing ran


def test_prompt_cache_lru_by_bytes(engine):
    s = Session(engine)
    ids = _ids(engine, "a b c d e f g h")
    _run(s.complete(ids, max_tokens=2, sampling=GREEDY))
    snap = s.state.snapshot(include_kv=True)
    size = snap.nbytes()
    cache = PromptCache(budget_bytes=2 * size + size // 2)     # room for two snapshots
    assert cache.put([1, 2], snap) and cache.put([1, 2, 3], snap)
    assert cache.lookup([1, 2, 3, 4], 3)[0] == 3               # longest prefix wins
    assert cache.lookup([1, 2, 3, 4], 2)[0] == 2               # ... within the allowed length
    assert cache.lookup([1, 2, 3, 4], 2)[0] == 2               # [1, 2] is now most recent
    assert cache.put([7], snap)                                 # evicts [1, 2, 3], the LRU
    assert set(cache.keys()) == {(1, 2), (7,)} and cache.nbytes == 2 * size
    assert not PromptCache(budget_bytes=size - 1).put([1], snap)   # too big alone: not stored
    assert cache.lookup([9, 9], 2) == (0, None)


def test_session_cache_respects_its_budget(engine):
    ids = _ids(engine, "one two three four five six seven")
    probe = Session(engine)
    _run(probe.complete(ids, max_tokens=1, sampling=GREEDY))
    one = probe.state.snapshot(include_kv=True).nbytes()
    s = Session(engine, cache_bytes=one + one // 2)   # holds one snapshot of this size
    for i in range(3):
        _run(s.complete(ids + _ids(engine, f" {i}"), max_tokens=2, sampling=GREEDY))
        assert s.cache.nbytes <= s.cache.budget and len(s.cache) <= 2
    off = Session(engine, cache_bytes=0)
    _run(off.complete(ids, max_tokens=2, sampling=GREEDY))
    assert len(off.cache) == 0
    toks, last, _ = _run(off.complete(ids, max_tokens=2, sampling=GREEDY))
    assert last.timings.cache_n == 0 and toks == _cold(engine, ids, max_tokens=2)[0]
