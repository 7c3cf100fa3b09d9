"""Device benchmark + device correctness of tightfit's GGUF GEMV kernels (v1 and v2).

  python3 bench/gemv.py --out $OUT            # defaults: ONE device call, ~3-5 minutes

Implementations (--impls): v1 (gemv_kernel.py, dp4a), v2 (gemv2.py, int8 tensor cores, raw GGUF
blocks), v2p (v2 on the planar re-layout, gemv2_layout.relayout), v2n1 / v2n1p (v2's dp4a
small-N path, gemv2_small.py, raw / planar; N <= 2 only, other N are skipped), cu (CUDA C++
kernel, gemv_cuda.py, raw blocks, every type it supports, N <= 16; config keys wpr, kern=v2|v2h|v3|v4|auto),
mma (int8 tensor-core skinny GEMM, gemv_mma.py, raw blocks, Q8_0 Q4_K Q5_K Q6_K IQ4_XS IQ2_XS IQ3_XXS IQ3_S IQ2_S; config keys
ctas_per_sm, rt, pipe (0|1: the cp.async-pipelined kernel), nst), e.g.
  python3 bench/gemv.py --out $OUT --impls v1,v2,v2n1,v2n1p --ns 1,2,8
--configs applies to every implementation (keys R, KB, SPLIT, num_warps, U).
(A lanes-along-K variant, "v3", was measured 1.1-2x slower on the FFN shapes and removed: bench/RESULTS.md.)
Correctness: at real shapes, sampled rows vs NumPy dequantization + float64 matmul (both with the
float x, bound 2 %, and with the int8-quantized x the kernel actually sees, bound 1e-4).
Timing: S weight sets (S*bytes >> 60 MB L2) replayed from one CUDA graph, per matrix, activation
quantization included (as llama.cpp's numbers); copy bandwidth measured on the stream in the same
run (float32 and int64 copy_); llama.cpp's number from the CSV (.whl/ or ../shared/bench/).
Every format/shape runs under try/except: a failure is recorded and the run goes on.
Prints a short table last; details (JSON lines) go to OUT/gemv.jsonl.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import traceback  # noqa: E402

from tightfit.kernels.gemv import gemv, gemv_ref, type_id, type_name, MACRO_BYTES  # noqa: E402
from tightfit.kernels.gemv2 import gemv2  # noqa: E402
from tightfit.kernels.gemv2_layout import relayout_torch, V2_TYPES  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act_ref  # noqa: E402
from tightfit.quant.traits import F16_SCALE_OFFSETS, traits  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

SHAPES = {"ffn": [(5120, 17408), (17408, 5120)], "kv": [(5120, 1024)],
          "attn": [(5120, 1024), (5120, 6144), (6144, 5120)],
          "other": [(5120, 10240), (5120, 12288)], "head": [(5120, 248320)],
          "gate": [(5120, 48), (5120, 96)], "down": [(17408, 5120)]}
def rand_weights(t, n_out, n_in, gen):
    offs, bb = F16_SCALE_OFFSETS[t], traits(t).type_size
    nbytes = n_out * n_in // 256 * MACRO_BYTES[t]
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=gen)
    blk = raw.view(-1, bb)
    for o in offs:
        sc = (torch.rand(blk.shape[0], device="cuda", generator=gen) * 0.009 + 0.001).half()
        blk[:, o:o + 2] = sc.view(torch.uint8).view(-1, 2)
    return raw


def graph_time(fn, reps=20):
    """Median ms of one replay of a graph that calls fn() once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def copy_bw(dtype):
    """Device copy of 1 GiB of `dtype` (read + write bytes / time), timed with events on the
    stream, NOT inside a CUDA graph: a captured D2D memcpy becomes a graph memcpy node that
    measured 2.71 TB/s on the H200 against 4.28 TB/s for the same copy launched on the stream
    (bench/NOTES.md), so the graph figure is not the bus limit."""
    nbytes = 1 << 30
    src = torch.ones(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype,
                     device="cuda")
    dst = torch.empty_like(src)
    for _ in range(5):           # clocks ramp up from idle first
        dst.copy_(src)
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(4):
            dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 4)
    ms = float(np.median(ts))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def planar_impl(impl):
    return impl in ("v2p", "v2n1p")


def skip(impl, t, n):
    """Implementations that do not run this type / column count."""
    if impl == "cu":
        from tightfit.kernels import gemv_cuda
        return not gemv_cuda.supported(t)
    if impl == "mma":
        from tightfit.kernels import gemv_mma
        return not gemv_mma.supported(t)
    if impl == "mmh":
        from tightfit.kernels import gemv_mmh
        return not gemv_mmh.supported(t) or n > gemv_mmh.MAX_N
    return (impl != "v1" and t not in V2_TYPES) or (impl.startswith("v2n1") and n > 2)


def call(impl, x, w, t, n_out, n_in, out, cfg=None):
    """One GEMV by implementation name; w is planar for v2p / v2n1p."""
    if impl == "v1":
        os.environ["TIGHTFIT_GEMV"] = "v1"
        try:
            return gemv(x, w, t, n_out, n_in, out=out, config=cfg)
        finally:
            os.environ["TIGHTFIT_GEMV"] = "v2"
    if impl == "cu":                # activation quantization inside, as for the others
        from tightfit.kernels.gemv_cuda import gemv_cuda
        from tightfit.kernels.quantize_act import quantize_act
        cu_cfg = {k: cfg[k] for k in ("wpr", "kern") if cfg and k in cfg} or None
        return gemv_cuda(quantize_act(x, 0), w, t, n_out, out, config=cu_cfg)
    if impl == "mma":               # tensor-core skinny GEMM (gemv_mma.py); config ctas_per_sm, rt, pipe, nst
        from tightfit.kernels.gemv_mma import gemv_mma
        from tightfit.kernels.quantize_act import quantize_act
        mma_cfg = {k: cfg[k] for k in ("ctas_per_sm", "rt", "pipe", "nst", "fill") if cfg and k in cfg} or None
        return gemv_mma(quantize_act(x, 0), w, t, n_out, out, config=mma_cfg)
    if impl == "mmh":               # bf16 byte-table GEMV (gemv_mmh.py, IQ4_XS); config rt, kind
        from tightfit.kernels.gemv_mmh import gemv_mmh, xpack
        kind = (cfg or {}).get("kind")
        xk = xpack(x) if kind == "foldp" else x     # (packed per call: a separate small kernel)
        return gemv_mmh(xk, w, t, n_out, out, rt=(cfg or {}).get("rt"), kind=kind)
    if impl.startswith("v2n1"):
        cfg = {**(cfg or {}), "PATH": "dp4a"}
    elif impl in ("v2", "v2p"):
        cfg = {**(cfg or {}), "PATH": "tc"}
    else:
        raise ValueError(f"unknown implementation {impl!r}")
    return gemv2(x, w, t, n_out, n_in, out=out, planar=planar_impl(impl), config=cfg)


def find_csv(arg):
    for p in ([arg] if arg else []) + [os.path.join(REPO, ".whl", "llama-cpp-h200-gemv.csv"),
                                       os.path.join(REPO, "..", "shared", "bench",
                                                    "llama-cpp-h200-gemv.csv")]:
        if p and os.path.exists(p):
            return p
    return None


def load_llama(path):
    out = {}
    if not os.path.exists(path):
        return out
    for row in csv.reader(open(path)):
        if len(row) >= 9 and row[0] == "std_run" and row[7]:
            k, m = row[2][1:].split("xM")
            out[(row[1].upper(), int(k), int(m), int(row[3]))] = float(row[7])
    return out


def check(t, n_in, n_out, ns, gen, impls, rows=128):
    w = rand_weights(t, n_out, n_in, gen)
    sel = np.sort(np.random.default_rng(0).choice(n_out, size=min(rows, n_out), replace=False))
    rb = n_in // 256 * MACRO_BYTES[t]
    wsel = w.view(n_out, rb)[torch.from_numpy(sel).cuda()].cpu().numpy()
    res = []
    for impl in impls:
        if impl not in ("v1", "cu", "mma") and t not in V2_TYPES:
            continue
        wi = relayout_torch(w, t) if planar_impl(impl) else w
        for n in ns:
            if skip(impl, t, n):
                continue
            x = torch.randn(n, n_in, device="cuda")
            out = torch.full((n, n_out), float("nan"), device="cuda")
            y = call(impl, x, wi, t, n_out, n_in, out).cpu().numpy()
            nan = int(np.isnan(y).sum())
            xn = x.cpu().numpy()
            ref = gemv_ref(xn, wsel, t, len(sel), n_in)
            q, d, _ = quantize_act_ref(xn)
            refq = gemv_ref((q * d[..., None]).reshape(n, n_in), wsel, t, len(sel), n_in)
            ys = y[:, sel]
            e = float(np.linalg.norm(ys - ref) / np.linalg.norm(ref))
            eq = float(np.linalg.norm(ys - refq) / np.linalg.norm(refq))
            ok = nan == 0 and e < 0.02 and eq < 1e-4
            res.append(dict(kind="check", impl=impl, type=type_name(t), n_in=n_in, n_out=n_out,
                            N=n, relerr=e, relerr_qx=eq, nan=nan, ok=ok))
        del wi
    return res


def timeit(t, n_in, n_out, ns, gen, impls, cfg=None, min_bytes=1.5e9):
    nbytes = n_out * n_in // 256 * MACRO_BYTES[t]
    sets = max(8, math.ceil(min_bytes / nbytes))
    ws = [rand_weights(t, n_out, n_in, gen) for _ in range(sets)]
    res = []
    relaid = False
    for impl in sorted(impls, key=planar_impl):     # planar ones last: they re-lay ws out
        if impl not in ("v1", "cu", "mma") and t not in V2_TYPES:
            continue
        if planar_impl(impl) and not relaid:
            ws = [relayout_torch(w, t) for w in ws]
            relaid = True
        for n in ns:
            if skip(impl, t, n):
                continue
            x = torch.randn(n, n_in, device="cuda")
            outs = [torch.empty(n, n_out, device="cuda") for _ in range(sets)]

            def f():
                for w, o in zip(ws, outs):
                    call(impl, x, w, t, n_out, n_in, o, cfg)
            ms = graph_time(f) / sets
            res.append(dict(kind="time", impl=impl, type=type_name(t), n_in=n_in, n_out=n_out,
                            N=n, us=ms * 1e3, GBps=nbytes / (ms * 1e-3) / 1e9, sets=sets, cfg=cfg))
    del ws
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="IQ4_XS,Q5_K,Q6_K,Q4_K,Q3_K,Q8_0")
    ap.add_argument("--impls", default="v1,v2,v2p")
    ap.add_argument("--check-shapes", default="ffn,kv")
    ap.add_argument("--check-ns", default="1,8")
    ap.add_argument("--time-formats", default="")
    ap.add_argument("--shapes", default="ffn,kv")
    ap.add_argument("--ns", default="1,8")
    ap.add_argument("--configs", default="", help="JSON list of config dicts to sweep")
    ap.add_argument("--budget", type=float, default=270.0, help="seconds; timing stops after")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "gemv.jsonl"), "a")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    impls = [i for i in a.impls.split(",") if i]
    results = []

    def emit(r):
        log.write(json.dumps(r) + "\n")
        log.flush()
        print(json.dumps(r), flush=True)
        results.append(r)

    def guarded(what, fn):
        try:
            for r in fn():
                r["wall_s"] = round(time.time() - t_start, 1)
                yield r
        except Exception as e:      # record and go on with the next format/shape
            emit(dict(kind="error", what=what, error=f"{type(e).__name__}: {str(e)[:800]}",
                      tb=traceback.format_exc()[-2000:]))
            torch.cuda.empty_cache()

    bw = {}
    for name, dt in (("float32", torch.float32), ("int64", torch.int64)):
        for r in guarded(f"copy {name}", lambda: [dict(kind="copy", dtype=name, GBps=copy_bw(dt),
                                                        device=torch.cuda.get_device_name())]):
            bw[name] = r["GBps"]
            emit(r)
    bwm = max(bw.values()) if bw else 4300.0
    csvp = find_csv(a.csv)
    llama = load_llama(csvp) if csvp else {}
    emit(dict(kind="info", csv=csvp, llama_rows=len(llama), impls=impls))
    fmts = [type_id(f) for f in a.formats.split(",") if f]
    cshapes = [s for k in a.check_shapes.split(",") if k for s in SHAPES[k]]
    cns = [int(v) for v in a.check_ns.split(",")]
    for t in fmts:
        for (k, m) in cshapes:
            if time.time() - t_start > a.budget * 0.35:
                break
            for r in guarded(f"check {type_name(t)} {k}x{m}",
                             lambda: check(t, k, m, cns, gen, impls)):
                emit(r)
    tf = [type_id(f) for f in (a.time_formats or a.formats).split(",") if f]
    shapes = [s for k in a.shapes.split(",") if k for s in SHAPES[k]]
    cfgs = json.loads(a.configs) if a.configs else [None]
    ns = [int(v) for v in a.ns.split(",")]
    for t in tf:
        for (k, m) in shapes:
            if (k, m) == (5120, 248320) and t != 14:
                continue
            for cfg in cfgs:
                if time.time() - t_start > a.budget:
                    break
                for r in guarded(f"time {type_name(t)} {k}x{m} {cfg}",
                                 lambda: timeit(t, k, m, ns, gen, impls, cfg)):
                    r["pct_copy"] = 100 * r["GBps"] / bwm
                    ll = llama.get((r["type"], k, m, r["N"]))
                    r["llama_us"] = ll
                    r["x_llama"] = (ll / r["us"]) if ll else None
                    emit(r)
    report(results, bw, bwm, time.time() - t_start)


def report(results, bw, bwm, wall):
    times = [r for r in results if r["kind"] == "time"]
    t1 = {(r["impl"], r["type"], r["n_in"], r["n_out"]): r["us"] for r in times if r["N"] == 1}
    v1 = {(r["type"], r["n_in"], r["n_out"], r["N"]): r["us"] for r in times if r["impl"] == "v1"}
    print()
    for r in results:
        if r["kind"] == "error":
            print(f"ERROR {r['what']}: {r['error'][:300]}")
    print("CHECK impl type n_in n_out N relerr relerr_qx ok")
    for r in results:
        if r["kind"] == "check":
            print(f"C {r['impl']:5s} {r['type']:7s} {r['n_in']:6d} {r['n_out']:6d} {r['N']:2d} "
                  f"{r['relerr']:.2e} {r['relerr_qx']:.1e} {r['ok']}")
    bad = [r for r in results if r["kind"] == "check" and not r["ok"]]
    print(f"checks: {sum(r['kind'] == 'check' for r in results) - len(bad)} ok, {len(bad)} bad")
    copies = ", ".join(f"{k} {v:.0f} GB/s" for k, v in bw.items())
    print(f"copy bandwidth: {copies}; % columns use {bwm:.0f} GB/s; wall {wall:.0f}s")
    print("| impl | type | shape (in→out) | N | µs | GB/s | % copy | × llama.cpp | × v1 | t(N)/t(1) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(times, key=lambda r: (r["type"], r["n_in"], r["n_out"], r["N"], r["impl"])):
        xl = f"{r['x_llama']:.2f}" if r.get("x_llama") else "–"
        b1 = t1.get((r["impl"], r["type"], r["n_in"], r["n_out"]))
        rt = f"{r['us'] / b1:.2f}" if b1 else "–"
        u1 = v1.get((r["type"], r["n_in"], r["n_out"], r["N"]))
        xv = f"{u1 / r['us']:.2f}" if u1 else "–"
        print(f"| {r['impl']:5s} | {r['type']} | {r['n_in']}→{r['n_out']} | {r['N']} | {r['us']:.1f} | "
              f"{r['GBps']:.0f} | {r['pct_copy']:.0f} | {xl} | {xv} | {rt} |"
              + (f" cfg {r['cfg']}" if r.get("cfg") else ""))


if __name__ == "__main__":
    main()
