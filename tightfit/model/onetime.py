"""A process-wide count of one-time work: CUDA graph captures (each includes its warm-up pass,
where kernels compile on first use).

Why: a timing that spans such work measures it, not the steady state. The speculative loop's
policy compares round costs per draft length; a round that captured the verify graph of a new
block size (or a step graph of a new attention mode) took 100-250 ms instead of ~15 (issue 10,
session 13: the copycat's first probe at a new size made drafting look hopeless for the rest of
the request). Timers read `count()` before and after and drop samples across which it changed.
"""
from __future__ import annotations

import threading

_lock = threading.Lock()
_value = 0


def note() -> None:
    """One piece of one-time work happened (call it where a graph is captured)."""
    global _value
    with _lock:
        _value += 1


def count() -> int:
    return _value


__all__ = ["count", "note"]
