"""Host cost of a speculative round, without the model (issue 10): is the loop's Python a lever?

On the device a forced round (r = 0.8, k = 4) costs ~0.56 ms more than its verify block (session 20,
`round_wall` against `bench/verify_profile.py`): the argmax copy, the commit launches, the graph
launch, and the loop's own bookkeeping (drafting, acceptance, detokenizing, stop strings, events,
the policy). This script measures the last part alone: `SpeculativeEngine`'s loop on the demo
model with its verifier replaced by a stub whose rounds cost nothing (every argmax one fixed token,
commit a no-op), so the time per round is the loop's Python and nothing else. Runs on the CPU.

  python3 bench/spec_host.py [--tokens 3000] [--reps 3] [--profile]

Prints microseconds per round (best of --reps) for the fixed policy (adaptive=False) and the
adaptive one; --profile adds cProfile's top entries for the adaptive run.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from tightfit.runtime.sampler import GREEDY
from tightfit.runtime.spec import SpecConfig, SpeculativeEngine

PROMPT = list(range(40, 90))


class _FreeRound:
    """A verify round that costs nothing: every row's argmax is the same token."""
    hidden = None

    def __init__(self, n: int):
        self.n_rows = n

    def argmaxes(self) -> list[int]:
        return [7] * self.n_rows

    def row(self, i: int):
        raise AssertionError("greedy rounds read argmaxes only")

    def commit(self, n: int) -> None:
        pass


class FreeVerifier:
    """The engine's verifier for prefill; rounds from _FreeRound (counted)."""

    def __init__(self, inner):
        self.inner, self.rounds = inner, 0

    def begin(self, tokens, state) -> _FreeRound:
        self.rounds += 1
        return _FreeRound(len(tokens))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def per_round_us(se: SpeculativeEngine, tokens: int, reps: int) -> tuple[float, int]:
    """Best-of-reps microseconds per round of one generation (the prompt's prefill excluded)."""
    best, rounds = float("inf"), 0
    for _ in range(reps):
        se.verifier.rounds = 0
        t = None
        for ev in se.generate(PROMPT, max_tokens=tokens, sampling=GREEDY):
            if t is None:                       # the first event follows the prefill
                t = time.perf_counter()
        dt = time.perf_counter() - t
        rounds = se.verifier.rounds
        best = min(best, dt / rounds * 1e6)
    return best, rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    import torch
    from tightfit.model.demo import demo_model_path
    from tightfit.runtime.loader import load_engine
    torch.set_num_threads(1)
    eng = load_engine(str(demo_model_path()), n_ctx=a.tokens + len(PROMPT) + 16)
    print("| policy | rounds | tokens per round | host us per round |\n|---|---|---|---|")
    for adaptive in (False, True):
        se = SpeculativeEngine(eng, SpecConfig(drafters=("synthetic",), max_draft=4,
                                               adaptive=adaptive, force_accept=0.8))
        se.verifier = FreeVerifier(se.verifier)
        us, rounds = per_round_us(se, a.tokens, a.reps)
        print(f"| {'adaptive' if adaptive else 'fixed'} | {rounds} | {a.tokens / rounds:.2f} | "
              f"{us:.1f} |")
        if a.profile and adaptive:
            pr = cProfile.Profile()
            pr.enable()
            list(se.generate(PROMPT, max_tokens=a.tokens, sampling=GREEDY))
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
