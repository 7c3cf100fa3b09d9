"""N-gram and suffix drafters against brute-force scans of the token list (the oracle is a direct
search over the history, not the index under test), and the spec memory plan line against the
llama.cpp measurement in spec/landscape.md §0."""
from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from tightfit.model.config import QWEN35_27B, TINY
from tightfit.runtime.spec import (NGramDrafter, SuffixAutomaton, SuffixCache, SuffixDrafter,
                                   spec_state_breakdown, spec_state_bytes)


def _follow(seq, pat):
    """Counter of the tokens that follow each earlier occurrence of pat in seq."""
    L = len(pat)
    return Counter(seq[j + L] for j in range(len(seq) - L) if seq[j:j + L] == pat)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=70), st.integers(1, 6))
def test_suffix_automaton_counts_match_brute_force(seq, depth):
    sam = SuffixAutomaton(depth)
    sam.extend(seq)
    for L in range(1, depth + 1):
        for i in range(len(seq) - L + 1):
            pat = seq[i:i + L]
            v, l = sam.match(pat)
            assert l == L
            occ = sum(1 for j in range(len(seq) - L + 1) if seq[j:j + L] == pat)
            assert sam.cnt[v] == occ
            assert dict(sam.continuations(v)) == dict(_follow(seq, pat))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=60), st.lists(st.integers(0, 4), max_size=12))
def test_suffix_match_is_longest_occurring_suffix(seq, pattern):
    sam = SuffixAutomaton(8)
    sam.extend(seq)
    v, l = sam.match(pattern)
    pat = pattern[-8:]
    expect = 0
    for L in range(len(pat), 0, -1):
        s = pat[len(pat) - L:]
        if any(seq[j:j + L] == s for j in range(len(seq) - L + 1)):
            expect = L
            break
    assert l == expect


def test_suffix_draft_follows_most_frequent_and_adapts_length():
    # "1 2 3" (preceded by distinct tokens, so it is the longest match) is followed by 4 twice
    # and by 9 once
    seq = [1, 2, 3, 4, 5, 6, 20, 1, 2, 3, 4, 5, 6, 21, 1, 2, 3, 9, 22, 1, 2, 3]
    d = SuffixDrafter(depth=16, max_spec=16, max_spec_factor=1.0, min_token_prob=0.1)
    d.begin(seq)
    dr = d.propose()
    assert dr.match_len == 3
    assert dr.tokens == [4, 5, 6]           # capped at 1.0 x match length
    assert dr.score[0] == pytest.approx(2 / 3)
    d3 = SuffixDrafter(depth=16, max_spec=16, max_spec_factor=0.5, min_token_prob=0.1)
    d3.begin(seq)
    assert d3.propose().tokens == [4]
    # short match -> short draft
    d2 = SuffixDrafter(depth=16, max_spec=16, max_spec_factor=1.0, min_token_prob=0.0)
    d2.begin([7, 8, 5, 6, 1, 2, 3, 4, 11, 12, 13, 5])
    dr2 = d2.propose()
    assert dr2.match_len == 1 and dr2.tokens == [6]


def test_suffix_cache_global_segments_and_eviction():
    cache = SuffixCache(depth=8, max_requests=4, segment_requests=2)
    out = [50 + i for i in range(30)]
    cache.add(out)
    d = SuffixDrafter(cache, depth=8, max_spec=10, max_spec_factor=2.0)
    d.begin([1, 2, 3, 50, 51, 52, 53])      # matches the cached output's start
    dr = d.propose()
    assert dr.tokens == out[4:12]          # 2.0 x the 4-token match
    for i in range(6):                       # push the first request out
        cache.add([900 + i, 901 + i])
    assert cache.n_requests <= 4
    assert d.propose() is None or d.propose().tokens != out[4:12]


def test_ngram_longest_key_most_frequent():
    d = NGramDrafter(k_min=1, k_max=3, max_draft=4)
    hist = [1, 2, 3, 7, 1, 2, 3, 7, 5, 2, 3, 8, 9, 2, 3]
    d.begin(hist)
    dr = d.propose()
    # key (9,2,3)? unseen; (2,3) -> followed by 7,7,8 -> most frequent 7
    assert dr.tokens[0] == Counter(hist[j + 2] for j in range(len(hist) - 2)
                                   if hist[j:j + 2] == [2, 3]).most_common(1)[0][0] == 7
    assert dr.match_len == 2


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=50), st.integers(1, 3), st.integers(1, 4))
def test_ngram_first_token_matches_brute_force(seq, k_min, span):
    k_max = k_min + span - 1
    d = NGramDrafter(k_min, k_max, max_draft=1)
    d.begin(seq)
    dr = d.propose()
    expect = None
    for k in range(min(k_max, len(seq)), k_min - 1, -1):
        c = _follow(seq, seq[-k:])
        if c:
            top = max(c.values())
            # ties: the most recent occurrence
            last = {}
            for j in range(len(seq) - k):
                if seq[j:j + k] == seq[-k:]:
                    last[seq[j + k]] = j
            expect = max((t for t in c if c[t] == top), key=lambda t: last[t])
            break
    assert (dr.tokens[0] if dr else None) == expect


def test_drafters_are_fast():
    import time
    rng = random.Random(0)
    seq = [rng.randrange(5000) for _ in range(4000)] * 2
    d, s = NGramDrafter(), SuffixDrafter(SuffixCache())
    d.begin(seq)
    s.begin(seq)
    t = time.perf_counter()
    for i in range(200):
        d.extend([i])
        s.extend([i])
        d.propose(8)
        s.propose(8)
    per = (time.perf_counter() - t) / 200 * 1000
    assert per < 2.0, f"{per:.3f} ms per round"   # a 27B step is ~20-60 ms


def test_spec_state_bytes_matches_llama_cpp_per_position_cost():
    # landscape §0: +150 MiB per draft position for the 27B (144 MiB SSM + conv rows, fp32)
    one = spec_state_breakdown(QWEN35_27B, 1)["recurrent_positions"]
    assert 144 * 2**20 <= one <= 150.5 * 2**20
    assert spec_state_breakdown(QWEN35_27B, 4)["recurrent_positions"] == 4 * one
    assert spec_state_bytes(TINY, 0) == TINY.n_vocab * 4
    assert spec_state_bytes(TINY, 3, mtp=True, n_ctx=100) > spec_state_bytes(TINY, 3)
