"""Stop strings on the streamed text, across token boundaries.

Text that could still turn into a stop string is held back until it either completes the stop
(everything from the stop on is dropped) or is proven innocent by the next piece. Generation stops
at the stop string that is completed first (as llama-server does); if several complete at the same
character, the one that starts earliest wins. The result does not depend on how the text is cut
into pieces.
"""
from __future__ import annotations

from typing import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add decoded text; return what can be emitted now."""
        if self.stopped:
            return ""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        first = None   # (end, start, stop) of the earliest-completed stop string
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0 and (first is None or (i + len(s), i) < first[:2]):
                first = (i + len(s), i, s)
        if first is not None:
            self.stopped, self.matched = True, first[2]
            out, self.pending = self.pending[: first[1]], ""
            return out
        hold = self._held_suffix_len()
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """End of generation without a stop: release what was held back."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _held_suffix_len(self) -> int:
        # longest suffix of pending that is a proper prefix of some stop string
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:n]):
                    best = n
                    break
        return best
