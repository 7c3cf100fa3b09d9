"""Timing of tightfit.kernels.cpu_gemv: GB/s of weight bytes per format, 1 thread and all threads,
against this machine's host read bandwidth.

    python bench/cpu_gemv.py [--rows 17408] [--k 5120] [--batch 1] [--reps 7] [--bw-gb 2]
                             [--formats Q4_K,Q6_K,TQ2_0,TQ1_0] [--threads N]

Random but valid blocks (finite fp16 scales), the ffn_up shape of the 27B by default (about 100 MB
of Q4_K: far larger than the caches, as host rows are). GB/s is the raw matrix bytes divided by
the best wall time of `reps` GEMVs. "bw" is a numpy sum over a `--bw-gb` GB buffer (best of 3),
i.e. what one process can read from host RAM; "of bw" is the all-thread figure over it. The host
share of a split plan costs about host_bytes / (all-thread GB/s) per token.
TIGHTFIT_CPU_SIMD=0 in the environment times the portable kernels instead of the AVX2 ones (A/B);
a smaller --rows (e.g. 4096: ~11-17 MB, inside a 32 MB L3) times the kernel rather than the RAM.

    python bench/cpu_gemv.py --group [--groups gdn,attn,ffn] [--host-frac 0.5,0.05] [--reps 7]

Grouped host call (issue 5): the matrices of the 27B seed mix that share one x, each with a host
suffix of `host-frac` of its rows (rounded like the planner: split point on 64 rows), computed
(a) one `gemv` call per matrix, one after another (the executor before the grouped call) and
(b) one `Group.gemv` call (x quantized once, all rows in one balanced parallel loop). Wall ms are
medians of `reps` after a warm-up; "saved" = (a) - (b) is the per-call overhead removed, and
"per token" scales it by the groups of one 27B token (48 gdn + 16 attn + 64 ffn).
`--groups tffn` times a ternary 27B's FFN pair instead (two TQ2_0 matrices, 64 per token).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tightfit.kernels import cpu_gemv as G  # noqa: E402

# name: (type id, elements per block, bytes per block, byte offsets of the fp16 scale fields)
FORMATS = {
    "Q8_0": (8, 32, 34, [0]), "Q4_0": (2, 32, 18, [0]), "IQ4_NL": (20, 32, 18, [0]),
    "IQ4_XS": (23, 256, 136, [0]), "Q2_K": (10, 256, 84, [80, 82]), "Q3_K": (11, 256, 110, [108]),
    "Q4_K": (12, 256, 144, [0, 2]), "Q5_K": (13, 256, 176, [0, 2]), "Q6_K": (14, 256, 210, [208]),
    "IQ2_XS": (17, 256, 74, [0]), "IQ2_S": (22, 256, 82, [0]), "IQ3_XXS": (18, 256, 98, [0]),
    "IQ3_S": (21, 256, 110, [0]), "TQ2_0": (35, 256, 66, [64]), "TQ1_0": (34, 256, 54, [52]),
    "IQ2_XXS (fallback)": (16, 256, 66, [0]),
}


def random_blocks(rng, M, K, bs, ts, offs):
    raw = rng.integers(0, 256, (M, K // bs * ts), dtype=np.uint8)
    blocks = raw.reshape(M, -1, ts)
    for o in offs:
        blocks[:, :, o:o + 2] = rng.uniform(1e-3, 0.1, blocks.shape[:2]).astype(
            np.float16).view(np.uint8).reshape(M, -1, 2)
    return raw


def host_read_bw(gb: float) -> float:
    buf = np.ones(int(gb * 1e9) // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best / 1e9


def gbps(w, qt, x, reps) -> float:
    G.gemv(w, qt, x)   # compile / warm
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        G.gemv(w, qt, x)
        best = min(best, time.perf_counter() - t0)
    return w.nbytes / best / 1e9


#: groups of matrices sharing one x in a 27B layer: (name, rows, seed-mix type), K = 5120
GROUPS = {
    "gdn": [("attn_qkv", 10240, "IQ4_XS"), ("attn_gate", 6144, "IQ4_XS")],
    "attn": [("attn_q", 12288, "IQ4_XS"), ("attn_k", 1024, "Q6_K"), ("attn_v", 1024, "Q5_K")],
    "ffn": [("ffn_gate", 17408, "IQ4_XS"), ("ffn_up", 17408, "Q5_K")],
    # a ternary 27B's FFN pair (cpu_gemv_ternary: its own grouped call); not in the default list
    "tffn": [("ffn_gate", 17408, "TQ2_0"), ("ffn_up", 17408, "TQ2_0")],
}
PER_TOKEN = {"gdn": 48, "attn": 16, "ffn": 64, "tffn": 64}


def _median_ms(f, reps: int) -> float:
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3


def group_bench(a) -> None:
    rng = np.random.default_rng(0)
    nt = G.set_threads(a.threads)
    x = rng.standard_normal((a.batch, 5120)).astype(np.float32)
    print(f"grouped host call: K=5120 batch={a.batch} threads={nt} "
          f"(SIMD types: {sorted(G.SIMD)}); median wall ms of {a.reps}")
    print(f"{'group':6s} {'frac':>5s} {'MB':>7s} {'sequential':>11s} {'grouped':>8s} {'saved':>7s}"
          f" {'seq GB/s':>9s} {'grp GB/s':>9s}")
    for frac in (float(f) for f in a.host_frac.split(",")):
        tot = 0.0
        for g in a.groups.split(","):
            mats = []
            for _name, M, fmt in GROUPS[g]:
                qt, bs, ts, offs = FORMATS[fmt]
                host = min(M, M - (M - int(np.ceil(frac * M))) // 64 * 64)
                mats.append((random_blocks(rng, host, 5120, bs, ts, offs), qt))
            grp = G.Group(mats)
            mb = sum(w.nbytes for w, _ in mats) / 1e6
            outs = [np.empty((a.batch, w.shape[0]), np.float32) for w, _ in mats]
            y = np.empty((a.batch, grp.n_out), np.float32)

            def seq():
                for (w, qt), o in zip(mats, outs):
                    G.gemv(w, qt, x, out=o)

            t_seq = _median_ms(seq, a.reps)
            t_grp = _median_ms(lambda: grp.gemv(x, out=y), a.reps)
            tot += PER_TOKEN[g] * (t_seq - t_grp)
            print(f"{g:6s} {frac:5.2f} {mb:7.1f} {t_seq:11.3f} {t_grp:8.3f} {t_seq - t_grp:7.3f}"
                  f" {mb / t_seq:9.2f} {mb / t_grp:9.2f}")
            del mats, grp
        print(f"  host-frac {frac:g}: saved per 27B token ~ {tot:.1f} ms "
              f"({'+'.join(f'{PER_TOKEN[g]}x{g}' for g in a.groups.split(','))})")
    # the fixed cost of one parallel gemv call (16 rows: next to no work)
    w = random_blocks(rng, 16, 5120, 256, 136, [0])
    import numba
    print(f"fixed cost of one gemv call (16 IQ4_XS rows): "
          f"{_median_ms(lambda: G.gemv(w, 23, x), 50) * 1e3:.1f} us; numba threading layer "
          f"{numba.threading_layer()} (NUMBA_THREADING_LAYER=workqueue|omp|tbb to compare)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", action="store_true", help="grouped vs sequential host calls")
    ap.add_argument("--groups", default="gdn,attn,ffn")
    ap.add_argument("--host-frac", default="0.5,0.05")
    ap.add_argument("--rows", type=int, default=17408)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--bw-gb", type=float, default=2.0)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--threads", type=int, default=None, help="'all threads' count (default: pool)")
    a = ap.parse_args()
    if a.group:
        group_bench(a)
        return
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.batch, a.k)).astype(np.float32)
    nt = G.set_threads(a.threads)
    bw = host_read_bw(a.bw_gb)
    print(f"cpu_gemv: M={a.rows} K={a.k} batch={a.batch}; host read bw (numpy sum, "
          f"{a.bw_gb:g} GB) {bw:.1f} GB/s")
    print(f"{'format':20s} {'MB':>8s} {'1 thread':>9s} {f'{nt} thr':>9s} {'of bw':>7s} {'scaling':>8s}"
          "   GB/s (scaling = all threads / 1 thread: near 1 on many cores = contention)")
    for name in a.formats.split(","):
        qt, bs, ts, offs = FORMATS[name]
        rows = a.rows if "fallback" not in name else min(a.rows, 2048)
        w = random_blocks(rng, rows, a.k, bs, ts, offs)
        G.set_threads(1)
        one = gbps(w, qt, x, max(3, a.reps // 2))
        G.set_threads(nt)
        alln = gbps(w, qt, x, a.reps)
        print(f"{name:20s} {w.nbytes / 1e6:8.1f} {one:9.2f} {alln:9.2f} {alln / bw:7.0%} "
              f"{alln / one:7.1f}x")
        del w
    # one embedding row of the 27B's Q3_K token_embd (E = 5120)
    w = random_blocks(rng, 4096, a.k, 256, 110, [108])
    G.decode_rows(w, 11, [1])
    t0 = time.perf_counter()
    for i in range(100):
        G.decode_rows(w, 11, [i])
    print(f"Q3_K embedding row decode: {(time.perf_counter() - t0) / 100 * 1e6:.1f} us/row")


if __name__ == "__main__":
    main()
