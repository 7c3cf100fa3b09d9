"""Timing helpers shared by the bench scripts."""
from __future__ import annotations

import time

import torch


def cuda_time(fn, reps: int = 5, warmup: int = 1) -> float:
    """Seconds of device work per call of `fn`, CUDA events around `reps` calls after `warmup`
    untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(reps):
        fn()
    ev[1].record()
    torch.cuda.synchronize()
    return ev[0].elapsed_time(ev[1]) / 1e3 / reps


def wall_time(fn, reps: int = 5, warmup: int = 1) -> float:
    """Seconds of wall time per call of `fn` (host work included), device synchronized."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps
