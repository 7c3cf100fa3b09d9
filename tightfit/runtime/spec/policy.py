"""Per-round choice of drafter and draft length by expected committed tokens per millisecond
(the Strata / frostyautumnleaf policy, spec/landscape.md §2.2), every cost measured online.

Acceptance model: each drafted token is accepted with probability a given the previous ones, so
a k-token draft commits E(k) = 1 + a + a^2 + ... + a^k tokens (the 1 is the correction or bonus
token). `a` is estimated per (drafter, match-length bucket) from decayed counts of successes and
trials (a rejection is one trial without success; an accepted token one trial with), starting
from the prior `prior` with weight 2. Drafts that were not verified are still scored against the
emitted tokens ("shadow" evaluation; free for the cheap drafters, whose drafts exist anyway).

Cost model: `round_ms[k]` is the wall time the decode loop measured (with `clock`) for a round
that verified a k-token draft, k = 0 being the plain step: the whole round as the loop sees it
(the cheap drafters' proposals, which run every round whatever the choice, the k+1-row verify
forward, the acceptor's work on the rows, the commit, the bookkeeping), less the time of a model
drafter that proposes only when chosen (MTP), which is kept per drafter (per drafted token) and
added to its options. It is kept per draft length and shared by the drafters (the verify forward
does not depend on who drafted). The estimate of a length is the (lower) median of its last
`window` samples: one outlier (a GC pause, a preempted host thread) moves nothing, where an EMA
would keep a rarely chosen length looking expensive (or the plain step, so the policy drafts at
0 % acceptance) until its next sample. A length sampled once is trusted only up to what the
lengths sampled more than once predict (its one sample may be the first block of a new size,
with JIT), so it is chosen again and the median of two drops an outlier. An unmeasured length is
interpolated between measured ones, or extrapolated with the least-squares slope of the measured
points. Priors, used only until two lengths are measured: one measured point extrapolates with
`prior_row` (relative cost of one more row; small on purpose, a memory-bound verify row is cheap,
so the first rounds try long drafts and measure them); nothing measured: 1 unit + prior_row per
row.

Choice: value(no draft) = 1 / round_ms[0], value(d, k) = E(a_d, k) / (draft_ms(d, k) +
round_ms[k]); the round takes the best, which may be the plain step.

Probes: a drafter whose acceptance nothing observed for `gap` rounds (no verified round, no
shadow score: the MTP head, or any drafter under forced acceptance, where shadow scores mean
nothing) gets one round of `probe_k` tokens; its gap doubles after each probe (min_gap ..
max_gap) and returns to min_gap when it wins a round or a probe is fully accepted. The plain
step, if never chosen, is run every min_gap rounds until it has two samples, and again when its
last sample is older than max_gap rounds, so round_ms[0] is a measurement. At 0 % acceptance the
policy so settles on the plain step after a few rounds and then spends about log2(n) probe rounds
of probe_k tokens in n (tests/test_spec_policy_cost.py: < 2 % modelled overhead in 200 rounds
when a 4-token verify costs 2.1 plain steps, 0.2 % in 3000).

Exploration where rows may be dear (session 12: on a model with compute-bound host rows every
verified row costs about a plain step, so drafting cannot pay even at full acceptance): the first
verify block is probe_k tokens whatever the priors say, the plain step is measured right after
it, probes sample lengths probe_k and probe_k + 1 twice each (a length's first round in a process
carries one-time costs), the cost per row is fitted on draft lengths only (the plain step runs
another path), and where those measurements say no acceptance could beat the plain step
(`hopeless`) a due probe is skipped and the drafter's gap set to max_gap.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

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
class _Cost:
    samples: list[float]            # the last `window` ones
    n: int = 1                      # samples ever
    round: int = 0                  # policy round of the last sample

    @property
    def ms(self) -> float:
        xs = sorted(self.samples)
        return xs[(len(xs) - 1) // 2]


@dataclass
class DrafterStats:
    rates: dict[int, _Rate] = field(default_factory=dict)
    draft_ms: float | None = None       # per call (model drafters proposing on demand)
    draft_ms_tok: float | None = None   # per drafted token (model drafters)
    rounds: int = 0                     # verified rounds
    last_round: int = -1                # round of the last verified draft
    last_obs: int = 0                   # round of the last acceptance observation (any)
    gap: int = 4                        # rounds without observation before a probe


def expected_tokens(a: float, k: int) -> float:
    return 1.0 + sum(a ** i for i in range(1, k + 1))


class Policy:
    def __init__(self, prior: float = 0.6, decay: float = 0.97, ema: float = 0.2,
                 adaptive: bool = True, prior_row: float = 0.05, probe_k: int = 1,
                 min_gap: int = 4, max_gap: int = 256, window: int = 7,
                 single_steps: float = 8.0, clock: Callable[[], float] = time.perf_counter):
        self.prior = prior
        self.decay = decay
        self.ema = ema
        self.adaptive = adaptive
        self.prior_row = prior_row
        self.probe_k = max(1, int(probe_k))
        self.min_gap, self.max_gap = int(min_gap), int(max_gap)
        self.window = max(1, int(window))
        # a length sampled once is trusted when that round cost at most this many plain steps:
        # one-time work (a graph capture: 15-350 steps on the device) is far above it, and the
        # decode loop keeps rounds that captured a graph out of the samples anyway
        # (model.onetime); a placed model's genuine rounds (4-5 steps) are below
        self.single_steps = float(single_steps)
        self.clock = clock              # seconds; the decode loop times its rounds with it
        self.stats: dict[str, DrafterStats] = {}
        self.round_ms: dict[int, _Cost] = {}
        self.round = 0
        self.probes = 0

    def _st(self, name: str) -> DrafterStats:
        st = self.stats.get(name)
        if st is None:
            st = self.stats[name] = DrafterStats(last_obs=self.round, gap=self.min_gap)
        return st

    # ---- estimates ----------------------------------------------------------------------------
    def accept_rate(self, name: str, match_len: int = 0) -> float:
        st = self._st(name)
        r = st.rates.get(bucket(match_len))
        if r is None:   # fall back to the drafter's pooled rate
            pooled = _Rate(sum(x.succ for x in st.rates.values()), sum(x.trials for x in st.rates.values()))
            return pooled.value(self.prior)
        return r.value(self.prior)

    def _slope(self, t: dict[int, _Cost]) -> float:
        """ms per extra verified row: the least-squares slope of the measured draft lengths
        (k >= 1) when two or more are measured. The plain step is left out: it runs another path
        (one-token graph) than the verify block, whose fixed cost would read as a steep slope
        (the CPU demo model: plain 8 ms, a 2-row block 27 ms, a 5-row one ~30 ms). Fewer: the
        prior `prior_row` relative to the one point there is."""
        pts = {x: v for x, v in t.items() if x > 0}
        if len(pts) >= 2:
            xs = list(pts)
            ys = [pts[x].ms for x in xs]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            return max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
        k0, c = next(iter(pts.items())) if pts else max(t.items())
        return self.prior_row * c.ms / (1.0 + self.prior_row * k0)

    def round_cost(self, k: int) -> float:
        """Estimated ms of a round verifying a k-token draft (k = 0: the plain step)."""
        t = self.round_ms
        c = t.get(k)
        if c is None:
            return self._predict(k, t)
        if c.n == 1:
            # one sample above what the lengths sampled more than once predict may be an outlier
            # (e.g. the first block of a size: JIT): stay optimistic, so that the length is chosen
            # again and the median of two samples drops it
            others = {x: v for x, v in t.items() if x != k and v.n >= 2}
            if len(others) >= 2:
                return min(c.ms, self._predict(k, others))
        return c.ms

    def _predict(self, k: int, t: dict[int, _Cost]) -> float:
        if not t:
            return 1.0 + self.prior_row * k
        lo = max((x for x in t if x < k), default=None)
        hi = min((x for x in t if x > k), default=None)
        if lo is not None and hi is not None:
            return t[lo].ms + (k - lo) / (hi - lo) * (t[hi].ms - t[lo].ms)
        base = lo if lo is not None else hi
        return max(1e-6, t[base].ms + self._slope(t) * (k - base))

    def _trusted(self, k: int) -> bool:
        """Length k's samples say what it costs: two or more, or one that is no outlier."""
        c, plain = self.round_ms.get(k), self.round_ms.get(0)
        if c is None:
            return False
        return c.n >= 2 or (plain is not None and c.ms <= self.single_steps * plain.ms)

    def hopeless(self, k_max: int) -> bool:
        """True when the measured round costs say that even a draft accepted in full, at any
        length 1..k_max, commits fewer tokens per ms than the plain step: (k + 1) / cost(k) <=
        1 / round_cost(0), cost(k) the least-squares line through the draft lengths measured
        at least twice (their lower medians: the first round of a length in a process carries
        one-time costs, ~150 ms on the H200 in session 12) or once at no more than
        `single_steps` plain steps, draft time left out (an upper bound). Needs the plain step
        and two such lengths. E.g. a model with host rows, whose
        host kernels are compute-bound so that every verified row costs about a plain step
        (session 12: rounds of 2-5 rows 3.9-4.8 plain steps at 8 GiB): probing it costs several
        steps each time for nothing."""
        pts = {k: c.ms for k, c in self.round_ms.items() if k > 0 and self._trusted(k)}
        if self.round_ms.get(0) is None or len(pts) < 2:
            return False
        xs = list(pts)
        mx, my = sum(xs) / len(xs), sum(pts.values()) / len(xs)
        slope = sum((x - mx) * (pts[x] - my) for x in xs) / sum((x - mx) ** 2 for x in xs)
        plain = 1.0 / self.round_cost(0)
        return all((k + 1) / max(1e-9, my + slope * (k - mx)) <= plain
                   for k in range(1, k_max + 1))

    def _probe_len(self, k_max: int) -> int:
        """probe_k, or probe_k + 1 once probe_k's cost is trusted and its is not: two trusted
        lengths give `hopeless` its cost per row."""
        for k in (self.probe_k, self.probe_k + 1):
            if k <= k_max and not self._trusted(k):
                return k
        return min(k_max, self.probe_k)

    def draft_cost(self, name: str, k: int) -> float:
        st = self._st(name)
        return (st.draft_ms or 0.0) + (st.draft_ms_tok or 0.0) * k

    def best_length(self, name: str, k_max: int, match_len: int = 0) -> tuple[int, float]:
        """(k, expected tokens per ms) of the best prefix length 0..k_max of a draft."""
        a = self.accept_rate(name, match_len)
        best_k, best = 0, 1.0 / self.round_cost(0)
        for k in range(1, k_max + 1):
            r = expected_tokens(a, k) / (self.draft_cost(name, k) + self.round_cost(k))
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
        best_name, best_k, best = None, 0, 1.0 / self.round_cost(0)
        for name, (k_max, match) in candidates.items():
            k, r = self.best_length(name, k_max, match)
            if k and r > best:
                best_name, best_k, best = name, k, r
        if best_k and not any(x > 0 for x in self.round_ms):
            # no verify block measured yet: the first is probe_k tokens, not the priors' longest
            # (where rows cost about a plain step each, a first 4-token round would cost ~14)
            best_k = min(best_k, self.probe_k)
        elif best_k and 0 not in self.round_ms:
            self.probes += 1                # a block measured, the plain step not: measure it
            return None, 0                  # before a second block is chosen on priors
        if best_name is not None:
            self._st(best_name).gap = self.min_gap
            plain = self.round_ms.get(0)
            since = self.round - (plain.round if plain is not None else 0)
            if since > (self.min_gap if plain is None or plain.n < 2 else self.max_gap):
                self.probes += 1
                return None, 0              # measure the plain step (see the module doc)
        due = [(self.round - self._st(n).last_obs - self._st(n).gap, n)
               for n, (k_max, _) in candidates.items()
               if n != best_name and k_max and self.round - self._st(n).last_obs >= self._st(n).gap]
        for n in [n for _, n in due if self.hopeless(candidates[n][0])]:
            st = self._st(n)                # no acceptance could pay: look again only rarely
            st.gap, st.last_obs = self.max_gap, self.round
        due = [(late, n) for late, n in due if self._st(n).last_obs != self.round]
        if due:
            _, name = max(due)
            st = self._st(name)
            st.gap = min(2 * st.gap, self.max_gap)
            st.last_obs = self.round        # not probed again before the new gap even if the
            self.probes += 1                # round is cut short (stop string, length limit)
            return name, self._probe_len(candidates[name][0])
        return best_name, best_k

    # ---- updates -----------------------------------------------------------------------------
    def record_round(self, k: int, ms: float) -> None:
        """Wall ms of a round that verified a k-token draft (k = 0: a plain step)."""
        c = self.round_ms.get(k)
        if c is None:
            self.round_ms[k] = _Cost([ms], 1, self.round)
        else:
            c.samples = (c.samples + [ms])[-self.window:]
            c.n += 1
            c.round = self.round

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
        st.last_obs = self.round
        if verified:
            st.rounds += 1
            st.last_round = self.round
            if n_accepted >= n_drafted:     # a fully accepted draft: look again soon
                st.gap = self.min_gap
