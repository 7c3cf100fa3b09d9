"""Forced acceptance for benchmarks: each drafted token is accepted with probability r.

The speculative benchmark (bench/spec.py, issue 10) separates the mechanism's cost from the
drafter's quality by accepting every drafted token with a fixed probability r, independently,
whatever the target says (llama.cpp's --spec-synth-*). A round that drafts n tokens then keeps
L of them, L truncated-geometric: P(L = j) = r^j (1 - r) for j < n, P(L = n) = r^n, and emits
L + 1 tokens (the target's token at the first rejection, or the bonus token). At r = 0.8, n = 4
that is (1 - r^5) / (1 - r) = 3.36 tokens per round in expectation (policy.expected_tokens).

Drawing every token with an independent uniform made the measured rounds carry 3.11 tokens over
512 tokens with numpy seed 0 (seeds 1-3 gave 3.28-3.48): ~160 rounds leave a standard error of
~0.13 tokens per round, 4 % of the speedup, and the fixed seed made the same unlucky draw every
run. Here one uniform per round picks L by the inverse of its distribution function, and the
uniforms are a Weyl sequence (u_m = frac(u_0 + m * (sqrt(5) - 1) / 2)): the fraction of rounds
with each L tracks its probability within O(log m / m) instead of O(1 / sqrt(m)), so a benchmark's
tokens per round is the distribution's, not one sample's. The sequence is deterministic; rounds
of a benchmark are exchangeable (each costs what its draft length costs), so its correlation
between consecutive rounds changes nothing the benchmark measures.

"80 % acceptance" has two readings, and benchmarks report both (bench/spec.py --force-as):
  - per token (r above, Leviathan et al.'s alpha, llama.cpp's --spec-synth-len geometry): each
    drafted token survives with probability r given the ones before it survived; r = 0.8, k = 4
    accepts 2.36 of 4 drafted tokens, a llama-server "draft acceptance rate" of 0.59;
  - per drafted token on average (llama-server's draft_n_accepted / draft_n, the rate its logs
    and /metrics print): a = 0.8 at k = 4 accepts 3.2 tokens per round. `rate_for_acceptance`
    gives the per-token r whose geometric lengths have that mean (r = 0.912 for a = 0.8, k = 4),
    so the draws stay the same truncated geometric, only its parameter differs.
"""
from __future__ import annotations

import math

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


class ForcedAcceptance:
    """Accepted lengths for forced-acceptance rounds, one low-discrepancy uniform per round."""

    def __init__(self, r: float, u0: float = 0.5):
        if not 0.0 <= r <= 1.0 or math.isnan(r):
            raise ValueError(f"forced acceptance rate must be in [0, 1], got {r}")
        self.r = float(r)
        self._u = float(u0) % 1.0

    def _next_u(self) -> float:
        u = self._u
        self._u = (self._u + GOLDEN) % 1.0
        return u

    def accepted(self, n: int) -> int:
        """How many of a round's n drafted tokens are accepted (0..n)."""
        if n <= 0:
            return 0
        u = self._next_u()
        # L >= j with probability r^j: the largest j <= n with u < r^j (u < r^0 = 1 always)
        j, p = 0, 1.0
        while j < n:
            p *= self.r
            if not u < p:
                break
            j += 1
        return j


def acceptance_of_rate(r: float, k: int) -> float:
    """llama-server's draft acceptance rate (accepted / drafted) when each of k drafted tokens
    survives with probability r given its predecessors: E[L] / k = (r + r^2 + ... + r^k) / k."""
    from tightfit.runtime.spec.policy import expected_tokens
    if k <= 0:
        raise ValueError(f"draft length must be >= 1, got {k}")
    return (expected_tokens(r, k) - 1.0) / k


def rate_for_acceptance(a: float, k: int) -> float:
    """The per-token rate r whose k-token rounds accept a fraction a of the drafted tokens on
    average (the inverse of acceptance_of_rate; it is increasing in r, so bisection is exact to
    the float's last bits after 60 halvings)."""
    if not 0.0 <= a <= 1.0 or math.isnan(a):
        raise ValueError(f"draft acceptance rate must be in [0, 1], got {a}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if acceptance_of_rate(mid, k) < a:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
