"""Token sampling from one row of logits, in llama.cpp's default order:
penalties -> top-k -> top-p -> min-p -> temperature -> draw.

Greedy (temperature <= 0) is an argmax of the penalised logits. Everything is NumPy on the host:
the vocabulary row is at most 248,320 floats, and the filters work on a partition of the top
candidates so a step costs well under a millisecond.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from tightfit.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40              # <= 0: off
    top_p: float = 0.95          # >= 1: off
    min_p: float = 0.05          # <= 0: off
    repeat_penalty: float = 1.0  # 1: off (llama.cpp semantics: divide positive logits, multiply negative)
    repeat_last_n: int = 64      # penalty window; -1 = whole history, 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def validate(self) -> "SamplingParams":
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 <= self.top_p <= 1:
            raise UserError(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise UserError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise UserError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0 or not -2.0 <= self.frequency_penalty <= 2.0:
            raise UserError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if self.repeat_last_n < -1:
            raise UserError(f"repeat_last_n must be >= -1, got {self.repeat_last_n}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalized(self) -> bool:
        """Whether apply_penalties can change a row (then a token depends on the history)."""
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or
                                            self.presence_penalty != 0.0 or
                                            self.frequency_penalty != 0.0)


GREEDY = SamplingParams(temperature=0.0)


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """Repetition (multiplicative, llama.cpp/CTRL style) and OpenAI presence/frequency penalties
    over the last `repeat_last_n` tokens. Returns a new array only when something changes."""
    if not p.penalized or not history:
        return logits
    window = history if p.repeat_last_n == -1 else history[-p.repeat_last_n:]
    counts = Counter(int(t) for t in window)
    ids = np.fromiter(counts.keys(), dtype=np.int64)
    cnt = np.fromiter(counts.values(), dtype=np.float32)
    out = logits.astype(np.float32, copy=True)
    v = out[ids]
    if p.repeat_penalty != 1.0:
        v = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
    v = v - cnt * p.frequency_penalty - (cnt > 0) * p.presence_penalty
    out[ids] = v
    return out


def filtered_distribution(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Candidate ids and their probabilities after top-k, top-p, min-p and temperature
    (in that order, as llama.cpp's default chain). Penalties must already be applied."""
    x = np.asarray(logits, dtype=np.float32)
    n = x.shape[0]
    k = p.top_k if 0 < p.top_k < n else n
    if k < n:
        ids = np.argpartition(-x, k - 1)[:k]
    else:
        ids = np.arange(n)
    vals = x[ids].astype(np.float64)
    order = np.argsort(-vals, kind="stable")
    ids, vals = ids[order], vals[order]
    # top-p and min-p act on the probabilities at temperature 1, like llama.cpp
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    keep = len(ids)
    if p.top_p < 1.0:
        cum = np.cumsum(probs)
        # smallest prefix whose mass reaches top_p (at least one token)
        keep = min(keep, int(np.searchsorted(cum, p.top_p, side="left")) + 1)
    if p.min_p > 0.0:
        keep = min(keep, max(1, int(np.count_nonzero(probs[:keep] >= p.min_p * probs[0]))))
    ids, vals = ids[:keep], vals[:keep]
    t = p.temperature if p.temperature > 0 else 1.0
    w = np.exp((vals - vals[0]) / t)
    return ids, w / w.sum()


class Sampler:
    """Stateful sampler: owns the RNG so that a seed reproduces a whole generation."""

    def __init__(self, params: SamplingParams = SamplingParams()):
        self.params = params.validate()
        self.rng = np.random.default_rng(params.seed)

    def with_params(self, **changes) -> "Sampler":
        return Sampler(replace(self.params, **changes))

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        x = np.asarray(logits)
        if x.ndim != 1:
            raise ValueError("sampler expects one row of logits")
        x = apply_penalties(x, history, self.params)
        if self.params.greedy:
            return int(np.argmax(x))
        ids, probs = filtered_distribution(x, self.params)
        return int(ids[self.rng.choice(len(ids), p=probs)])

