"""Timing of tightfit.kernels.cpu_gemv: GB/s of weight bytes per format on this machine.

    python bench/cpu_gemv.py [--rows 17408] [--k 5120] [--batch 1] [--reps 5]

Random but valid blocks (finite fp16 scales), the ffn_up shape of the 27B by default. GB/s is the
raw matrix bytes divided by the median time of one GEMV; the host-row share of a split plan costs
about host_bytes / (this figure) per token.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tightfit.kernels import cpu_gemv as G

# byte offsets of the fp16 scale fields per type (spec/quant-formats.md §2.3)
SCALES = {"Q8_0": (8, 32, 34, [0]), "Q4_0": (2, 32, 18, [0]), "IQ4_NL": (20, 32, 18, [0]),
          "IQ4_XS": (23, 256, 136, [0]), "Q2_K": (10, 256, 84, [80, 82]),
          "Q3_K": (11, 256, 110, [108]), "Q4_K": (12, 256, 144, [0, 2]),
          "Q5_K": (13, 256, 176, [0, 2]), "Q6_K": (14, 256, 210, [208]),
          "IQ3_XXS (fallback)": (18, 256, 98, [0])}


def random_blocks(rng, M, K, bs, ts, offs):
    raw = rng.integers(0, 256, (M, K // bs * ts), dtype=np.uint8)
    blocks = raw.reshape(M, -1, ts)
    for o in offs:
        blocks[:, :, o:o + 2] = rng.uniform(1e-3, 0.1, blocks.shape[:2]).astype(
            np.float16).view(np.uint8).reshape(M, -1, 2)
    return raw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=17408)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.batch, a.k)).astype(np.float32)
    print(f"cpu_gemv: M={a.rows} K={a.k} batch={a.batch} threads={G.n_threads()}")
    for name, (qt, bs, ts, offs) in SCALES.items():
        rows = a.rows if "fallback" not in name else min(a.rows, 2048)
        w = random_blocks(rng, rows, a.k, bs, ts, offs)
        G.gemv(w[:64], qt, x)  # compile / warm
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            G.gemv(w, qt, x)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        print(f"{name:20s} {w.nbytes / 1e6:9.1f} MB  {t * 1e3:8.2f} ms  {w.nbytes / t / 1e9:6.2f} GB/s")
    # one embedding row of the 27B's Q3_K token_embd (E = 5120)
    w = random_blocks(rng, 4096, a.k, 256, 110, [108])
    G.decode_rows(w, 11, [1])
    t0 = time.perf_counter()
    for i in range(100):
        G.decode_rows(w, 11, [i])
    print(f"Q3_K embedding row decode: {(time.perf_counter() - t0) / 100 * 1e6:.1f} us/row")


if __name__ == "__main__":
    main()
