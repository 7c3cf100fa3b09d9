"""Host GEMV cost per batch width (issue 10 on a placed model: the verify block's M = k + 1 rows
through the host rows) and per kernel form: the AVX-512 host GEMV at B = 1, 2, 4, 5, 8
activation rows, kernel calls only, for the vector-epilogue row loop (cpu_gemv_avx512_loop, the
default) and the scalar form (cpu_gemv_avx512.gemv_avx512, TIGHTFIT_CPU_EPILOGUE=scalar).

    python bench/cpu_gemv_batch.py [--rows 17408] [--k 5120] [--copies 12] [--batches 1,2,4,5,8]
                                   [--kernels vector,scalar]

Each call reads a cold copy of the matrix (--copies, as bench/cpu_gemv_avx512.py), at numba's
whole pool. Prints ms per call, GB/s of weight bytes and the time relative to B = 1 per format:
the multi-column block code decodes each block once for up to cpu_gemv_avx512.COLS rows, so
while the host's memory is the limit a 5-row call should cost little more than a 1-row one.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tightfit.kernels import cpu_gemv as G  # noqa: E402
from tightfit.kernels import cpu_gemv_avx512 as A  # noqa: E402
from tightfit.kernels import cpu_gemv_avx512_loop as AV  # noqa: E402
from tightfit.kernels import cpu_gemv_kern as K  # noqa: E402

from cpu_gemv_avx512 import FORMATS  # noqa: E402  (bench/cpu_gemv_avx512.py, same folder)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=17408)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--copies", type=int, default=12)
    ap.add_argument("--batches", default="1,2,4,5,8")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--kernels", default="vector,scalar")
    ap.add_argument("--threads", type=int, default=None, help="default: numba's pool")
    a = ap.parse_args()
    kerns = {"vector": AV.gemv_avx512v, "scalar": A.gemv_avx512}
    if not A.available():
        sys.exit("needs avx512f + avx512bw + avx512vnni on this host")
    import numba
    from cpu_gemv import random_blocks  # bench/cpu_gemv.py (same folder)
    rng = np.random.default_rng(0)
    batches = [int(b) for b in a.batches.split(",")]
    nt = a.threads or numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(nt)
    numba.set_parallel_chunksize(max(16, a.rows // (8 * nt)))
    ssc = G.per_thread(G._POOL, 16, np.int16)
    print(f"M={a.rows} K={a.k}, {nt} threads, {a.copies} cold copies, best of {a.reps}")
    print(f"{'format':8s} {'kernel':7s} " + " ".join(f"{'B=' + str(b):>18s}" for b in batches))
    for name, kn in [(n, k) for n in a.formats.split(",") for k in a.kernels.split(",")]:
        kern = kerns[kn]
        qt, bs, ts, offs = FORMATS[name]
        w0 = random_blocks(rng, a.rows, a.k, bs, ts, offs)
        copies = [w0] + [w0.copy() for _ in range(a.copies - 1)]
        cells, base = [], None
        for B in batches:
            x = rng.standard_normal((B, a.k)).astype(np.float32)
            xq, xd, xs = np.zeros((B, a.k), np.int8), np.zeros((B, a.k // 256), np.float32), \
                np.zeros((B, a.k // 16), np.int32)
            K.quantize_act(x, xq, xd, xs)
            y = np.zeros((B, a.rows), np.float32)
            kern(qt, w0, xq, xd, xs, y, G._F16, ssc)
            best = float("inf")
            for _ in range(a.reps):
                for w in copies:
                    t0 = time.perf_counter()
                    kern(qt, w, xq, xd, xs, y, G._F16, ssc)
                    best = min(best, time.perf_counter() - t0)
            base = base or best
            cells.append(f"{best * 1e3:6.2f}ms {w0.nbytes / best / 1e9:5.1f} x{best / base:4.2f}")
        print(f"{name:8s} {kn:7s} " + " ".join(f"{c:>18s}" for c in cells), flush=True)
        del copies, w0


if __name__ == "__main__":
    main()
