"""N-gram lookup drafter (llama.cpp's `ngram-map-k` family, spec/landscape.md §2.1).

The index maps every k-gram of the request's history (prompt + generated tokens), for k in
[k_min, k_max], to the tokens that followed it, with a count and the last position each was
seen. A draft takes the longest key that has a continuation (k_max first), drafts its most
frequent continuation (ties: the most recent), and chains: the drafted token is appended to the
key window and the lookup repeats, up to `max_draft` tokens or the first miss. A continuation
needs `min_hits` occurrences before it is drafted (1 = any earlier occurrence).

Appending a token costs O(k_max) dict updates; a proposal costs O(k_max + draft length) lookups.
Deterministic: the draft distribution q is one-hot (verification accepts d with prob p(d)).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class Draft:
    """A proposed continuation. `q[i]` is the drafter's distribution for tokens[i] as
    (ids, probs) arrays, or None when the draft is deterministic (q = one-hot)."""
    tokens: list[int]
    source: str
    match_len: int = 0
    q: list | None = None
    score: list[float] = field(default_factory=list)   # drafter's own confidence per token


class NGramDrafter:
    name = "ngram"

    def __init__(self, k_min: int = 2, k_max: int = 4, max_draft: int = 8, min_hits: int = 1):
        if not 1 <= k_min <= k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got {k_min}, {k_max}")
        self.k_min, self.k_max = int(k_min), int(k_max)
        self.max_draft = int(max_draft)
        self.min_hits = max(1, int(min_hits))
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        # one dict per k: key tuple -> {next token: [count, last position]}
        self.maps: dict[int, dict[tuple, dict[int, list[int]]]] = {
            k: {} for k in range(self.k_min, self.k_max + 1)}

    # ---- index --------------------------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        """Start a request: index the prompt."""
        self.reset()
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens to the history."""
        toks = self.tokens
        for t in tokens:
            t = int(t)
            n = len(toks)
            for k, m in self.maps.items():
                if n >= k:
                    key = tuple(toks[n - k:n])
                    nxt = m.get(key)
                    if nxt is None:
                        m[key] = {t: [1, n]}
                    else:
                        e = nxt.get(t)
                        if e is None:
                            nxt[t] = [1, n]
                        else:
                            e[0] += 1
                            e[1] = n
            toks.append(t)

    # ---- drafting -----------------------------------------------------------------------------
    def _best(self, window: list[int]) -> tuple[int, int, float] | None:
        """(next token, key length, share of the continuation) for the longest matching key."""
        for k in range(min(self.k_max, len(window)), self.k_min - 1, -1):
            nxt = self.maps[k].get(tuple(window[-k:]))
            if not nxt:
                continue
            tok, (cnt, _) = max(nxt.items(), key=lambda kv: (kv[1][0], kv[1][1]))
            if cnt < self.min_hits:
                continue
            total = sum(e[0] for e in nxt.values())
            return tok, k, cnt / total
        return None

    def propose(self, max_k: int | None = None) -> Draft | None:
        """Draft after the current history (whose last token is the one to be verified next)."""
        limit = self.max_draft if max_k is None else min(self.max_draft, max_k)
        if limit <= 0:
            return None
        window = self.tokens[-self.k_max:]
        out: list[int] = []
        score: list[float] = []
        match = 0
        conf = 1.0
        while len(out) < limit:
            hit = self._best(window)
            if hit is None:
                break
            tok, k, share = hit
            if not out:
                match = k
            conf *= share
            out.append(tok)
            score.append(conf)
            window = (window + [tok])[-self.k_max:]
        if not out:
            return None
        return Draft(out, self.name, match_len=match, score=score)
