"""AVX2 `gemv_simd` vs AVX-512 VNNI `gemv_avx512` (tightfit.kernels.cpu_gemv_avx512), kernel calls
only (x quantized once beforehand), GB/s of weight bytes at 1 thread and at --threads, B = 1.

    python bench/cpu_gemv_avx512.py [--rows 17408] [--k 5120] [--reps 9] [--threads N]
                                    [--formats IQ4_XS,Q4_K,Q5_K,Q6_K] [--prefetch 0,1024,2048]

--copies N: N independent copies of each matrix, one per call in turn, so that no call finds its
rows in the last-level cache (session 9: one 47-73 MB matrix timed alone reached 95 GB/s on the
device host's 16 threads, above the host read bandwidth the planner measures there, 86 GB/s).
--prefetch: the AVX-512 kernel once per software-prefetch distance (bytes ahead of the block being
read; 0 = none; tightfit's default is cpu_gemv_avx512.PREFETCH, TIGHTFIT_CPU_PREFETCH); "L1:L2"
adds a farther prefetch into L2 (prefetcht1; TIGHTFIT_CPU_PREFETCH_L2), e.g. 2048,2048:8192.

Random valid blocks as bench/cpu_gemv.py makes them. The two kernels are timed interleaved (best
of --reps each), with cpu_gemv's dynamic row chunks (~8 per thread). Both outputs are compared
(max relative difference: the same integers; fp32 within rounding). A smaller --rows (e.g.
2048: ~6-9 MB, cache-resident) times the kernels rather than the RAM.
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
from tightfit.kernels import cpu_gemv_kern as K  # noqa: E402

FORMATS = {"IQ4_XS": (23, 256, 136, [0]), "Q4_K": (12, 256, 144, [0, 2]),
           "Q5_K": (13, 256, 176, [0, 2]), "Q6_K": (14, 256, 210, [208])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=17408)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None, help="default: numba's pool")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--copies", type=int, default=1,
                    help="copies of each matrix called in turn (defeats the last-level cache)")
    ap.add_argument("--prefetch", default=f"{A.PREFETCH}:{A.PREFETCH_L2}",
                    help="comma list of prefetch distances in bytes, one AVX-512 column each")
    a = ap.parse_args()
    if not (A.available() and K.HAVE_AVX2):
        sys.exit("needs AVX2 and avx512f + avx512bw + avx512vnni on this host")
    import numba
    from cpu_gemv import random_blocks  # bench/cpu_gemv.py (same folder)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, a.k)).astype(np.float32)
    xq, xd, xs = np.zeros((1, a.k), np.int8), np.zeros((1, a.k // 256), np.float32), \
        np.zeros((1, a.k // 16), np.int32)
    K.quantize_act(x, xq, xd, xs)
    ssc = G.per_thread(G._POOL, 16, np.int16)
    nt_all = a.threads or numba.config.NUMBA_NUM_THREADS
    pfs = [tuple(int(p) for p in (v + ":0").split(":")[:2]) for v in a.prefetch.split(",")]
    print(f"M={a.rows} K={a.k} B=1, best of {a.reps}; GB/s of weight bytes (kernel call only)")
    cols = [f"{nt}t {k}" for nt in (1, nt_all)
            for k in ["AVX2"] + [f"pf{p}" + (f":{q}" if q else "") for p, q in pfs]]
    print(f"{'format':8s} {'MB':>7s} " + " ".join(f"{c:>9s}" for c in cols) + f" {'max rel diff':>13s}")
    for name in a.formats.split(","):
        qt, bs, ts, offs = FORMATS[name]
        w0 = random_blocks(rng, a.rows, a.k, bs, ts, offs)
        copies = [w0] + [w0.copy() for _ in range(a.copies - 1)]
        turn = [0]

        def nxt():                       # the next copy (each kernel call reads a cold one)
            turn[0] = (turn[0] + 1) % len(copies)
            return copies[turn[0]]
        kerns = [lambda y: K.gemv_simd(qt, nxt(), xq, xd, xs, y, G._F16, ssc)] + [
            (lambda y, p=p: A.gemv_avx512(qt, nxt(), xq, xd, xs, y, G._F16, ssc,
                                          np.int64(A.prefetch_arg(*p))))
            for p in pfs]
        w = w0
        ys = [np.zeros((1, a.rows), np.float32) for _ in kerns]
        res = []
        for nt in (1, nt_all):
            numba.set_num_threads(nt)
            prev = numba.set_parallel_chunksize(max(16, a.rows // (8 * nt)))
            best = [float("inf")] * len(kerns)
            for k, y in zip(kerns, ys):
                k(y)
            for _ in range(a.reps):            # interleaved: drifts of the host hit all alike
                for _c in range(len(copies)):  # every copy once per rep
                    for i, (k, y) in enumerate(zip(kerns, ys)):
                        t0 = time.perf_counter()
                        k(y)
                        best[i] = min(best[i], time.perf_counter() - t0)
            numba.set_parallel_chunksize(prev)
            res += [w.nbytes / b / 1e9 for b in best]
        diff = max(float(np.max(np.abs(ys[0] - y) / (np.abs(ys[0]).max() + 1e-30))) for y in ys[1:])
        print(f"{name:8s} {w.nbytes / 1e6:7.1f} " + " ".join(f"{r:9.2f}" for r in res)
              + f" {diff:13.1e}")
        del w, w0, copies


if __name__ == "__main__":
    main()
