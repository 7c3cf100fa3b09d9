"""Per-round choice of drafter and draft length by expected committed tokens per millisecond
(the Strata / frostyautumnleaf policy, spec/landscape.md §2.2).

Acceptance model: each drafted token is accepted with probability a given the previous ones, so
a k-token draft commits E(k) = 1 + a + a^2 + ... + a^k tokens (the 1 is the correction or bonus
token). `a` is estimated per (drafter, match-length bucket) from decayed counts of successes and
trials (a rejection is one trial without success; an accepted token one trial with). Drafts that
were not verified are still scored against the emitted tokens ("shadow" evaluation; free for the
cheap drafters, whose drafts exist anyway).

Cost model: verify_ms(n) for a block of n rows is an EMA per n, extended to unseen n by a
least-squares line over the seen ones; draft_ms per drafter is an EMA of the drafter's own time
(per call plus per token). A draft is cut to the prefix length k maximising E(k) / (draft_ms +
verify_ms(k+1)), and the round takes the candidate with the best ratio, which may be "no draft"
(1 / verify_ms(1)).
"""
from __future__ import annotations

from dataclasses import dataclass, field

BUCKETS = (1, 2, 4, 8, 16)        # match-length bucket lower bounds


def bucket(match_len: int) -> int:
    b = 0
    for i, lo in enumerate(BUCKETS):
        if match_len >= lo:
            b = i
    return b


@dataclass
class _Rate:
    succ: float = 0.0
    trials: float = 0.0

    def add(self, s: float, t: float, decay: float) -> None:
        self.succ = self.succ * decay + s
        self.trials = self.trials * decay + t

    def value(self, prior: float, prior_weight: float = 2.0) -> float:
        return (self.succ + prior * prior_weight) / (self.trials + prior_weight)


@dataclass
class DrafterStats:
    rates: dict[int, _Rate] = field(default_factory=dict)
    draft_ms: float | None = None       # per call
    draft_ms_tok: float | None = None   # per drafted token (model drafters)
    rounds: int = 0
    last_round: int = -1


def expected_tokens(a: float, k: int) -> float:
    return 1.0 + sum(a ** i for i in range(1, k + 1))


class Policy:
    def __init__(self, prior: float = 0.6, decay: float = 0.97, ema: float = 0.2,
                 explore_every: int = 16, adaptive: bool = True):
        self.prior = prior
        self.decay = decay
        self.ema = ema
        self.explore_every = explore_every
        self.adaptive = adaptive
        self.stats: dict[str, DrafterStats] = {}
        self.verify_ms: dict[int, float] = {}
        self.round = 0

    def _st(self, name: str) -> DrafterStats:
        return self.stats.setdefault(name, DrafterStats())

    # ---- estimates ----------------------------------------------------------------------------
    def accept_rate(self, name: str, match_len: int = 0) -> float:
        st = self._st(name)
        r = st.rates.get(bucket(match_len))
        if r is None:   # fall back to the drafter's pooled rate
            pooled = _Rate(sum(x.succ for x in st.rates.values()), sum(x.trials for x in st.rates.values()))
            return pooled.value(self.prior)
        return r.value(self.prior)

    def verify_cost(self, n: int) -> float:
        t = self.verify_ms
        if n in t:
            return t[n]
        if not t:
            return float(n)                     # unit cost per row until measured
        if len(t) == 1:
            (n0, c0), = t.items()
            return c0 * (1.0 + 0.5 * (n - n0) / max(n0, 1))
        xs, ys = list(t.keys()), list(t.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
        return max(1e-3, my + max(b, 0.0) * (n - mx))

    def draft_cost(self, name: str, k: int) -> float:
        st = self._st(name)
        return (st.draft_ms or 0.0) + (st.draft_ms_tok or 0.0) * k

    def best_length(self, name: str, k_max: int, match_len: int = 0) -> tuple[int, float]:
        """(k, expected tokens per ms) of the best prefix length 0..k_max of a draft."""
        a = self.accept_rate(name, match_len)
        best_k, best = 0, 1.0 / self.verify_cost(1)
        for k in range(1, k_max + 1):
            r = expected_tokens(a, k) / (self.draft_cost(name, k) + self.verify_cost(k + 1))
            if r > best:
                best_k, best = k, r
        return best_k, best

    def choose(self, candidates: dict[str, tuple[int, int]]) -> tuple[str | None, int]:
        """candidates: name -> (max tokens it can draft, match length). Returns (name, k) or
        (None, 0) for a plain step."""
        self.round += 1
        if not candidates:
            return None, 0
        if not self.adaptive:
            name = max(candidates, key=lambda n: candidates[n][0])
            return name, candidates[name][0]
        best_name, best_k, best = None, 0, 1.0 / self.verify_cost(1)
        for name, (k_max, match) in candidates.items():
            k, r = self.best_length(name, k_max, match)
            if k and r > best:
                best_name, best_k, best = name, k, r
        # exploration: a drafter not verified for a while gets a short round
        for name, (k_max, _) in candidates.items():
            st = self._st(name)
            if name != best_name and k_max and self.round - st.last_round > self.explore_every:
                return name, min(k_max, max(1, best_k or 1))
        return best_name, best_k

    # ---- updates -----------------------------------------------------------------------------
    def record_verify(self, n_rows: int, ms: float) -> None:
        old = self.verify_ms.get(n_rows)
        self.verify_ms[n_rows] = ms if old is None else old + self.ema * (ms - old)

    def record_draft(self, name: str, ms: float, n_tokens: int, per_token: bool = False) -> None:
        st = self._st(name)
        if per_token and n_tokens:
            v = ms / n_tokens
            st.draft_ms_tok = v if st.draft_ms_tok is None else st.draft_ms_tok + self.ema * (v - st.draft_ms_tok)
        else:
            st.draft_ms = ms if st.draft_ms is None else st.draft_ms + self.ema * (ms - st.draft_ms)

    def record_accept(self, name: str, match_len: int, n_drafted: int, n_accepted: int,
                      censored: bool = False, verified: bool = True) -> None:
        """n_accepted of n_drafted tokens matched; `censored`: the comparison ran out of emitted
        tokens before a mismatch (no rejection observed)."""
        if n_drafted <= 0:
            return
        st = self._st(name)
        rejected = 0 if (censored or n_accepted >= n_drafted) else 1
        st.rates.setdefault(bucket(match_len), _Rate()).add(n_accepted, n_accepted + rejected, self.decay)
        if verified:
            st.rounds += 1
            st.last_round = self.round
