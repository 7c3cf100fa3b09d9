"""Tile sweep of the fused quantized GEMM (tightfit/kernels/gemm_q.py) at prefill sizes: ONE call.

  python3 bench/gemm_sweep.py --out $OUT               # ~2-4 min; --budget caps the timing phase

For every seed-mix format on the shapes it has in the 27B (n_in -> n_out: 5120->17408, 17408->5120,
5120->10240, 5120->6144, 6144->5120, 5120->12288, 5120->1024; 5120->248320 with --head) at
M = --m tokens (default 1024 = the prefill chunk), it times:

* `dequant`: today's large-M path (Triton decode into a bf16 row-chunk scratch + cuBLAS);
* every candidate tile config of the fused kernel (CANDS below; `--cands` JSON replaces them),
  `f_small` being the current small-M tile (BM 64, BN 64/32, 8 warps, 3 stages, old grid order);
* a bf16 cuBLAS matmul of the same shape (x [M, n_in] . W^T, W a dense bf16 [n_out, n_in]): the
  % column is against it.

Timing: bench/gemv.py's graph_time (one CUDA graph of S calls over S weight sets, S x bytes >=
200 MB so W is not served from L2 across calls; median of the replays). Before timing, every (format,
candidate) kernel is compiled in a pool of --workers processes (Triton's disk cache is shared), so
the timing loop does not pay ptxas. Check: on the first shape of each format every fused candidate's
output is compared with the dequant path's (same bf16 W and x, fp32 accumulation): max|diff| /
max|ref| must be < 1e-3 and no NaN; a failing candidate is never chosen.

Output: a table (us, TFLOP/s, % of cuBLAS per format/shape/candidate), the best candidate per
(format, shape class) (gemm_q.shape_class: wide / down / small / head) by summed time over the
class's shapes, with "mode": "fused" when it beats the dequant path, and an estimate of the
trunk-matrix GEMM time of one 1,024-token chunk of the 27B (seed-mix counts, MODEL below) for
dequant / f_small / best. Files: OUT/gemm_sweep.json ("results", "best", "estimate"); apply with
TIGHTFIT_GEMM_CONFIGS=OUT/gemm_sweep.json or copy "best" into gemm_q.CONFIGS.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

NAMES = {"IQ4_XS": 23, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q3_K": 11, "Q8_0": 8, "IQ4_NL": 20,
         "Q2_K": 10, "IQ2_XS": 17, "IQ2_S": 22, "IQ3_S": 21, "IQ3_XXS": 18}
TNAME = {v: k for k, v in NAMES.items()}
GRID = {16, 17, 18, 21, 22}

#: (n_in, n_out) per format: where the format occurs in the seed-mix 27B (shared/bench/seed-mix.md)
PLAN = {23: [(5120, 17408), (5120, 10240), (5120, 6144), (5120, 12288)],
        13: [(17408, 5120), (5120, 17408), (6144, 5120), (5120, 1024)],
        14: [(17408, 5120), (5120, 1024)],
        12: [(5120, 17408)], 11: [(5120, 17408), (17408, 5120)], 17: [(5120, 17408)],
        22: [(5120, 17408)], 21: [(5120, 17408)], 18: [(17408, 5120)],
        20: [(5120, 12288)], 10: [(5120, 12288)], 8: [(5120, 1024)]}
HEAD = (5120, 248320)

#: trunk matrices of the seed-mix 27B: (format, n_in, n_out) -> count (64 blocks, 16 attention)
MODEL = {(23, 5120, 17408): 57 + 29, (17, 5120, 17408): 2, (11, 5120, 17408): 2,
         (22, 5120, 17408): 8, (12, 5120, 17408): 7, (21, 5120, 17408): 2,
         (13, 5120, 17408): 21,
         (13, 17408, 5120): 51, (11, 17408, 5120): 1, (18, 17408, 5120): 4, (14, 17408, 5120): 8,
         (23, 5120, 10240): 48, (23, 5120, 6144): 48, (13, 6144, 5120): 48 + 16,
         (23, 5120, 12288): 14, (20, 5120, 12288): 1, (10, 5120, 12288): 1,
         (14, 5120, 1024): 16 + 2, (13, 5120, 1024): 14}


def _c(bm, bn, w, st, swap, half=0, mfast=1):
    return {"BM": bm, "BN": bn, "num_warps": w, "num_stages": st, "SWAP": swap, "MFAST": mfast,
            "HALF": half}


#: name -> config. Offline SASS (sm_90a, Triton 3.6, IQ4_XS): all compile to HGMMA (wgmma), none
#: spills for IQ4_XS (the grid formats spill in the 255-register ones); shared KB / regs noted:
#: <= ~113 KB and <= 255 regs at 4 warps / <= 128 at 8 give 2 programs per SM (one program's
#: decode overlaps the other's wgmma). h_*: half-block K steps (HALF, IQ4_XS / Q4_K / Q5_K only;
#: skipped for the other formats).
CANDS = {
    "f_small": None,                          # the small-M tile, old grid order  145 KB 128 r
    "m64n64w8s3": _c(64, 64, 8, 3, 0),        # same tile, token tiles fastest
    "m64n64w8s2": _c(64, 64, 8, 2, 0),        #                                   105 KB 128 r
    "m64n64w4s2": _c(64, 64, 4, 2, 0),        #                                   105 KB 187 r
    "m64n64w4s2x": _c(64, 64, 4, 2, 1),       # W = register A operand (swap)      75 KB 166 r
    "m128n64w8s2": _c(128, 64, 8, 2, 0),      # decode reused over 128 tokens     169 KB 185 r
    "m128n64w8s2x": _c(128, 64, 8, 2, 1),     #                                   141 KB 180 r
    "m128n128w8s2": _c(128, 128, 8, 2, 0),    #                                   209 KB 255 r
    "m64n128w8s2": _c(64, 128, 8, 2, 0),      #                                   145 KB 169 r
    "m64n32w4s2": _c(64, 32, 4, 2, 0),        #                                    80 KB
    "m128n32w4s2": _c(128, 32, 4, 2, 0),      #                                   144 KB
    "h_m128n64w8s2": _c(128, 64, 8, 2, 0, 1),     # 2/SM                           85 KB 105 r
    "h_m128n64w4s2": _c(128, 64, 4, 2, 0, 1),     # 2/SM                           85 KB 168 r
    "h_m128n64w4s2x": _c(128, 64, 4, 2, 1, 1),    # 3/SM                           71 KB 168 r
    "h_m64n64w4s3": _c(64, 64, 4, 3, 0, 1),       # 3/SM                           73 KB 128 r
    "h_m128n32w4s2": _c(128, 32, 4, 2, 0, 1),     # 2/SM, more programs (down)     74 KB 137 r
    "h_m64n128w4s3": _c(64, 128, 4, 3, 0, 1),     # 2/SM                           98 KB 182 r
    "h_m128n64w4s3": _c(128, 64, 4, 3, 0, 1),     #                               121 KB 166 r
    "h_m128n128w8s2": _c(128, 128, 8, 2, 0, 1),   #                               105 KB 174 r
    "h_m128n128w8s3": _c(128, 128, 8, 3, 0, 1),   #                               146 KB 176 r
    "h_m256n64w8s2": _c(256, 64, 8, 2, 0, 1),     # decode reused over 256 tokens 149 KB 180 r
    "h_m256n128w8s2": _c(256, 128, 8, 2, 0, 1),   #                               169 KB 255 r
}


def cand_cfg(name, cfg, t):
    if cfg is None:
        from tightfit.kernels.gemm_q import fused_config
        return fused_config(t, 64)
    return dict(cfg)


def applies(cfg, t):
    from tightfit.kernels.gemm_q_decode import HALF_TYPES
    return not (cfg and cfg.get("HALF") and t not in HALF_TYPES)


# ---- compile pool --------------------------------------------------------------------------------
def _compile_one(task):
    t, name, cfg = task
    t0 = time.time()
    try:
        import torch
        from tightfit.kernels.gemm_q import _ROW_BYTES, gemm_q
        n_in, n_out, m = 5120, 256, 1024    # same specialization as the timed calls (M, N %16)
        x = torch.zeros(m, n_in, device="cuda", dtype=torch.bfloat16)
        w = torch.zeros(n_out * n_in // 256 * _ROW_BYTES[t], dtype=torch.uint8, device="cuda")
        gemm_q(x, w, t, n_out, n_in, mode="fused", config=cfg)
        torch.cuda.synchronize()
        return t, name, None, time.time() - t0
    except Exception as e:                 # noqa: BLE001
        return t, name, f"{type(e).__name__}: {str(e)[:300]}", time.time() - t0


def precompile(tasks, workers, deadline):
    import multiprocessing as mp
    errs = {}
    if workers <= 0 or not tasks:
        return errs, 0
    ctx = mp.get_context("spawn")
    done = 0
    pool = ctx.Pool(workers)
    try:
        it = pool.imap_unordered(_compile_one, tasks)
        while done < len(tasks):
            left = deadline - time.time()
            if left <= 0:
                print(f"[compile] deadline: {done}/{len(tasks)} compiled", flush=True)
                break
            try:
                t, name, err, s = it.next(timeout=left)
            except mp.TimeoutError:
                continue
            done += 1
            if err:
                errs[(t, name)] = err
                print(f"[compile] {TNAME[t]} {name}: {err}", flush=True)
    finally:
        pool.terminate()
    return errs, done


# ---- main ----------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default=",".join(TNAME[t] for t in PLAN))
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the whole run")
    ap.add_argument("--compile-frac", type=float, default=0.4,
                    help="share of the budget the compile pool may take")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--cands", default="", help='JSON {"name": cfg, ...} replacing CANDS')
    ap.add_argument("--head", action="store_true", help="also Q6_K 5120->248320")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    T0 = time.time()
    deadline = T0 + a.budget
    os.makedirs(a.out, exist_ok=True)

    import torch
    from gemv import graph_time, rand_weights
    from tightfit.kernels.gemm_q import gemm_q, shape_class

    cands = json.loads(a.cands) if a.cands else CANDS
    fmts = [NAMES[f.strip().upper()] for f in a.formats.split(",") if f.strip()]
    plan = {t: list(PLAN[t]) for t in fmts}
    if a.head and 14 in plan:
        plan[14].append(HEAD)
    M = a.m
    res = {"m": M, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "results": [], "errors": [], "best": {}, "estimate": {}}
    import triton
    res["triton"] = triton.__version__

    def save():
        with open(os.path.join(a.out, "gemm_sweep.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)

    def log(msg):
        print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)

    # 1. compile every (format, candidate) in parallel
    tasks = [(t, n, cand_cfg(n, c, t)) for t in fmts for n, c in cands.items() if applies(c, t)]
    log(f"compiling {len(tasks)} variants on {a.workers} workers")
    cerr, ndone = precompile(tasks, a.workers, T0 + a.budget * a.compile_frac)
    log(f"compiled {ndone}/{len(tasks)}, {len(cerr)} errors")
    for (t, n), e in cerr.items():
        res["errors"].append({"what": f"compile {TNAME[t]} {n}", "error": e})

    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    # 2. cuBLAS bf16 per shape
    cublas = {}
    shapes = sorted({s for t in fmts for s in plan[t]})
    for (k, n) in shapes:
        try:
            xb = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
            wb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            wt = wb.t().contiguous()
            ms = min(graph_time(lambda: torch.mm(xb, wb.t()), a.reps),
                     graph_time(lambda: torch.mm(xb, wt), a.reps))
            cublas[(k, n)] = ms
            log(f"cuBLAS bf16 {M}x{k} . {k}x{n}: {ms * 1e3:.1f} us "
                f"{2 * M * k * n / ms / 1e9:.0f} TFLOP/s")
            xb = wb = wt = None
        except Exception as e:             # noqa: BLE001
            res["errors"].append({"what": f"cublas {k}x{n}", "error": str(e)[:300]})
    torch.cuda.empty_cache()
    res["cublas_us"] = {f"{k}x{n}": v * 1e3 for (k, n), v in cublas.items()}

    # 3. per format and shape: dequant path + candidates
    bad = set()
    timed = {}                                            # (t, k, n, name) -> ms
    stop = False
    for t in fmts:
        for si, (k, n) in enumerate(plan[t]):
            if stop:
                break
            try:
                from tightfit.kernels.gemm_q import _ROW_BYTES
                nbytes = n * k // 256 * _ROW_BYTES[t]
                sets = max(1, min(24, math.ceil(2e8 / nbytes)))
                ws = [rand_weights(t, n, k, gen) for _ in range(sets)]
                x = torch.randn(M, k, device="cuda").to(torch.bfloat16)
                outs = [torch.empty(M, n, device="cuda") for _ in range(sets)]
                ref = None
                flop = 2.0 * M * k * n
                runs = [("dequant", "dequant", None)] + [("fused", nm, cand_cfg(nm, c, t))
                                                        for nm, c in cands.items()
                                                        if applies(c, t)]
                for mode, nm, cfg in runs:
                    if time.time() > deadline:
                        log("budget reached: stopping")
                        stop = True
                        break
                    if (t, nm) in cerr or (t, nm) in bad:
                        continue
                    try:
                        if si == 0:          # check against the dequant path on the first shape
                            o = torch.full((M, n), float("nan"), device="cuda")
                            gemm_q(x, ws[0], t, n, k, out=o, mode=mode, config=cfg)
                            if ref is None:
                                ref = o
                                err = 0.0
                            else:
                                nan = int(torch.isnan(o).sum())
                                err = float((o - ref).abs().max() / ref.abs().max())
                                if nan or not err < 1e-3:
                                    bad.add((t, nm))
                                    res["errors"].append({"what": f"check {TNAME[t]} {nm}",
                                                          "error": f"rel {err:.2e} nan {nan}"})
                                    log(f"CHECK FAIL {TNAME[t]} {nm}: rel {err:.2e} nan {nan}")
                                    continue
                        def f():
                            for w_, o_ in zip(ws, outs):
                                gemm_q(x, w_, t, n, k, out=o_, mode=mode, config=cfg)
                        ms = graph_time(f, a.reps) / sets
                        timed[(t, k, n, nm)] = ms
                        cb = cublas.get((k, n))
                        r = {"type": TNAME[t], "n_in": k, "n_out": n, "cand": nm, "cfg": cfg,
                             "us": ms * 1e3, "tflops": flop / ms / 1e9,
                             "pct_cublas": (100 * cb / ms) if cb else None, "sets": sets}
                        res["results"].append(r)
                        log(f"{TNAME[t]:7s} {k}->{n} {nm:13s} {ms * 1e3:9.1f} us "
                            f"{r['tflops']:6.0f} TFLOP/s"
                            + (f" {r['pct_cublas']:5.1f}% cuBLAS" if cb else ""))
                    except Exception as e:   # noqa: BLE001
                        bad.add((t, nm))
                        res["errors"].append({"what": f"{TNAME[t]} {k}->{n} {nm}",
                                              "error": f"{type(e).__name__}: {str(e)[:300]}",
                                              "tb": traceback.format_exc()[-1500:]})
                        log(f"ERROR {TNAME[t]} {k}->{n} {nm}: {type(e).__name__}: {str(e)[:200]}")
                ws = outs = x = ref = None
                torch.cuda.empty_cache()
            except Exception as e:           # noqa: BLE001
                res["errors"].append({"what": f"{TNAME[t]} {k}->{n}", "error": str(e)[:300]})
            save()

    # 4. best per (format, shape class): min summed time over the class's measured shapes
    best_ms = {}
    for t in fmts:
        classes = {}
        for (k, n) in plan[t]:
            classes.setdefault(shape_class(n, k), []).append((k, n))
        for cls, shs in classes.items():
            tot = {}
            for nm in ["dequant"] + list(cands):
                if (t, nm) in bad or (t, nm) in cerr:
                    continue
                v = [timed.get((t, k, n, nm)) for (k, n) in shs]
                if all(x is not None for x in v):
                    tot[nm] = sum(v)
            fused = {nm: v for nm, v in tot.items() if nm != "dequant"}
            if not fused:
                continue
            nm = min(fused, key=fused.get)
            cfg = cand_cfg(nm, cands[nm], t)
            mode = "fused" if ("dequant" not in tot or fused[nm] < tot["dequant"]) else "dequant"
            res["best"].setdefault(str(t), {})[cls] = {**cfg, "mode": mode, "cand": nm,
                                                      "us": fused[nm] * 1e3,
                                                      "dequant_us": tot.get("dequant", 0) * 1e3}
            for (k, n) in shs:
                best_ms[(t, k, n)] = timed[(t, k, n, nm if mode == "fused" else "dequant")]
    # 5. estimate: trunk GEMMs of one M-token chunk of the 27B
    for label, pick in (("dequant", lambda t, k, n: timed.get((t, k, n, "dequant"))),
                        ("f_small", lambda t, k, n: timed.get((t, k, n, "f_small"))),
                        ("best", lambda t, k, n: best_ms.get((t, k, n)))):
        tot, cov, missing = 0.0, 0, []
        for (t, k, n), cnt in MODEL.items():
            v = pick(t, k, n)
            if v is None:
                missing.append(f"{TNAME[t]} {k}->{n}")
                continue
            tot += cnt * v
            cov += cnt
        res["estimate"][label] = {"ms_per_chunk": tot, "matrices": cov,
                                  "of": sum(MODEL.values()), "missing": missing}
    save()
    report(res, cublas, M)
    return 0


def report(res, cublas, M):
    print()
    for e in res["errors"]:
        print(f"ERROR {e['what']}: {e['error'][:200]}")
    print(f"\n== fused GEMM sweep, M = {M}, {res['device']}, Triton {res['triton']} ==")
    print("| type | shape | cand | us | TFLOP/s | % cuBLAS bf16 |")
    print("|---|---|---|---|---|---|")
    for r in res["results"]:
        pc = f"{r['pct_cublas']:.1f}" if r["pct_cublas"] else "-"
        print(f"| {r['type']} | {r['n_in']}->{r['n_out']} | {r['cand']} | {r['us']:.1f} | "
              f"{r['tflops']:.0f} | {pc} |")
    print("\ncuBLAS bf16: " + ", ".join(f"{k} {v:.1f} us" for k, v in res["cublas_us"].items()))
    print("\n== best per (format, shape class) ==")
    for t, per in res["best"].items():
        for cls, b in per.items():
            print(f"{TNAME[int(t)]:7s} {cls:6s} {b['cand']:13s} mode={b['mode']:7s} "
                  f"{b['us']:.1f} us (dequant {b['dequant_us']:.1f} us)")
    print("\n== estimated trunk GEMM time per chunk of", M, "tokens (27B seed mix) ==")
    for k, v in res["estimate"].items():
        print(f"{k:8s} {v['ms_per_chunk']:.1f} ms over {v['matrices']}/{v['of']} matrices"
              + (f" (missing {v['missing']})" if v["missing"] else ""))


if __name__ == "__main__":
    sys.exit(main())
