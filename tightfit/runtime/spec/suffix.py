"""Suffix decoding (SuffixDecoding, Oliaro et al.; spec/landscape.md §2.3).

Two indexes answer "what followed the longest suffix of the current context, and how often":
a per-request one over the prompt and the tokens generated so far, and a global `SuffixCache`
over earlier requests' tokens (the server feeds it finished conversations; FIFO eviction).

The index is a suffix automaton (equivalent to the paper's suffix tree for these queries: the
state reached by a pattern has as transitions exactly the tokens that followed its occurrences,
and |endpos| of a state is the number of occurrences). Occurrence counts are kept only for
strings of length <= `depth` (the paper's max tree depth): each appended token walks the
suffix-link chain from the state of the last `depth` tokens, so an append is O(depth) however
repetitive the text. Queries use at most the last `depth` tokens as pattern.

Drafting (the paper's greedy expansion, one chain since verification is linear): from the matched
state follow the most frequent continuation; its probability is count(child) / sum(counts of the
siblings); the path score is the product; stop below `min_token_prob`, at a separator, or at
`max_spec_factor * match_len + max_spec_offset` tokens (the adaptive length), capped by
`max_spec`. When the followed string grows past `depth` the oldest tokens are dropped (suffix link),
so drafts can run longer than the depth while their statistics stay conditioned on <= depth
tokens. The best of the per-request and global candidates (sum of path scores = expected number
of accepted tokens under the estimate) is proposed.
"""
from __future__ import annotations

import threading
from typing import Iterable, Sequence

from tightfit.runtime.spec.ngram import Draft


class SuffixAutomaton:
    """Online suffix automaton over int tokens with depth-limited occurrence counts."""

    def __init__(self, depth: int = 24):
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self.depth = int(depth)
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.len: list[int] = [0]
        self.cnt: list[int] = [0]
        self.last = 0
        self.w, self.wl = 0, 0     # state and length of the text's suffix of length min(depth+1, n)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def _new(self, length: int, nxt: dict, link: int, cnt: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.len.append(length)
        self.cnt.append(cnt)
        return len(self.len) - 1

    def append(self, c: int) -> None:
        nxt, link, ln, cnt = self.next, self.link, self.len, self.cnt
        cur = self._new(ln[self.last] + 1, {}, -1, 0)
        p = self.last
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = nxt[p][c]
            if ln[p] + 1 == ln[q]:
                link[cur] = q
            else:
                clone = self._new(ln[p] + 1, dict(nxt[q]), link[q], cnt[q])
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
                link[q] = link[cur] = clone
                if self.w == q and self.wl <= ln[clone]:
                    self.w = clone      # the tracked suffix moved to the shorter half
        self.last = cur
        # the state of the last min(depth+1, n+1) tokens: one transition, then drop old tokens
        # (counts are kept to depth+1 so that a depth-long match has exact continuation counts)
        w, wl = nxt[self.w][c], self.wl + 1
        if wl > self.depth + 1:
            wl = self.depth + 1
            while ln[link[w]] >= wl:
                w = link[w]
        self.w, self.wl = w, wl
        # one more end position for every state holding a suffix of length <= depth
        v = w
        while v != -1:
            cnt[v] += 1
            v = link[v]
        self.n += 1

    def extend(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.append(int(t))

    # ---- queries --------------------------------------------------------------------------------
    def _shorten(self, v: int, length: int) -> tuple[int, int]:
        if length > self.depth:
            length = self.depth
            while self.len[self.link[v]] >= length:
                v = self.link[v]
        return v, length

    def match(self, pattern: Sequence[int]) -> tuple[int, int]:
        """(state, length) of the longest suffix of `pattern` that occurs in the text."""
        nxt, link, ln = self.next, self.link, self.len
        v, l = 0, 0
        for c in pattern:
            while v and c not in nxt[v]:
                v = link[v]
                l = ln[v]
            if c in nxt[v]:
                v = nxt[v][c]
                l += 1
            else:
                v, l = 0, 0
        return self._shorten(v, l)

    def continuations(self, v: int) -> list[tuple[int, int]]:
        """(token, count) of what followed the strings of state v (separators excluded)."""
        return [(c, self.cnt[u]) for c, u in self.next[v].items()]

    def speculate(self, pattern: Sequence[int], max_spec: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1,
                  min_match: int = 1) -> Draft | None:
        pattern = list(pattern)[-self.depth:]
        v, l = self.match(pattern)
        nxt, link, ln, cnt = self.next, self.link, self.len, self.cnt
        # the longest matched suffix that has a continuation (in a per-request index the full
        # pattern also occurs at the very end, where nothing follows yet)
        while v and not nxt[v]:
            v = link[v]
            l = ln[v]
        if l < min_match or not nxt[v]:
            return None
        cap = min(int(max_spec), int(max_spec_factor * l + max_spec_offset))
        match = l
        out: list[int] = []
        score: list[float] = []
        s = 1.0
        while len(out) < cap and nxt[v]:
            total = 0
            best_c, best_u, best_n = None, -1, -1
            for c, u in nxt[v].items():
                k = cnt[u]
                total += k
                if k > best_n or (k == best_n and u > best_u):
                    best_c, best_u, best_n = c, u, k
            if best_c is None or best_c < 0 or total <= 0:
                break
            s *= best_n / total
            if s < min_token_prob:
                break
            out.append(best_c)
            score.append(s)
            v, l = self._shorten(best_u, l + 1)
        if not out:
            return None
        return Draft(out, "suffix", match_len=match, score=score)


class SuffixCache:
    """Global cross-request index (thread-safe). Requests are stored in segments of
    `segment_requests` sequences; when more than `max_requests` are held the oldest whole segment
    is dropped (a suffix automaton cannot delete, so eviction is per segment)."""

    def __init__(self, depth: int = 24, max_requests: int = 10000, segment_requests: int | None = None,
                 max_tokens: int | None = 50_000_000):
        self.depth = int(depth)
        self.max_requests = int(max_requests)
        self.segment_requests = int(segment_requests or max(1, self.max_requests // 8))
        self.max_tokens = max_tokens
        self._segments: list[tuple[SuffixAutomaton, list[int]]] = []   # (automaton, [n requests])
        self._sep = 0
        self._lock = threading.Lock()

    @property
    def n_requests(self) -> int:
        return sum(n[0] for _, n in self._segments)

    @property
    def n_tokens(self) -> int:
        return sum(len(a) for a, _ in self._segments)

    def add(self, tokens: Sequence[int]) -> None:
        """Add one finished sequence (e.g. a response, or a whole conversation)."""
        toks = [int(t) for t in tokens]
        if not toks:
            return
        with self._lock:
            if not self._segments or self._segments[-1][1][0] >= self.segment_requests:
                self._segments.append((SuffixAutomaton(self.depth), [0]))
            sam, n = self._segments[-1]
            sam.extend(toks)
            self._sep -= 1
            sam.append(self._sep)            # a unique separator: no match crosses sequences
            n[0] += 1
            while len(self._segments) > 1 and (
                    self.n_requests > self.max_requests
                    or (self.max_tokens is not None and self.n_tokens > self.max_tokens)):
                self._segments.pop(0)

    def clear(self) -> None:
        with self._lock:
            self._segments.clear()

    def speculate(self, pattern: Sequence[int], **kw) -> Draft | None:
        best = None
        with self._lock:
            for sam, _ in self._segments:
                d = sam.speculate(pattern, **kw)
                if d is not None and (best is None or sum(d.score) > sum(best.score)):
                    best = d
        return best


class SuffixDrafter:
    """Per-request suffix automaton + an optional global SuffixCache."""
    name = "suffix"

    def __init__(self, cache: SuffixCache | None = None, depth: int = 24, max_spec: int = 16,
                 max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                 min_token_prob: float = 0.1, min_match: int = 1):
        self.cache = cache
        self.depth = int(depth)
        self.kw = dict(max_spec_factor=max_spec_factor, max_spec_offset=max_spec_offset,
                       min_token_prob=min_token_prob, min_match=min_match)
        self.max_spec = int(max_spec)
        self.reset()

    def reset(self) -> None:
        self.local = SuffixAutomaton(self.depth)
        self.tokens: list[int] = []

    def begin(self, prompt: Sequence[int]) -> None:
        self.reset()
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.local.append(int(t))
            self.tokens.append(int(t))

    def propose(self, max_k: int | None = None) -> Draft | None:
        cap = self.max_spec if max_k is None else min(self.max_spec, max_k)
        if cap <= 0:
            return None
        pattern = self.tokens[-self.depth:]
        best = self.local.speculate(pattern, cap, **self.kw)
        if self.cache is not None:
            g = self.cache.speculate(pattern, max_spec=cap, **self.kw)
            if g is not None and (best is None or sum(g.score) > sum(best.score)):
                best = g
        if best is None:
            return None
        best.source = self.name
        return best
