"""Device check + timing of the bf16 byte-table GEMV (gemv_mmh, IQ4_XS) against the kernels it
would replace: the dp4a CUDA GEMV (gemv_cuda, the decode step's N = 1 kernel) and the int8
tensor-core GEMV (gemv_mma, the verify block's N >= 4 kernel on wide matrices).

  python3 bench/mmh.py --out $OUT [--shapes 5120x17408,17408x5120] [--ns 1,2,3,4,5,8]

Correctness: sampled rows against gemv_mmh_ref (tightfit.quant's dequantization, float64, x
rounded to bf16), with normal (1e-3..1e-2) and fp16-subnormal (3e-6..5e-5) block scales.
Timing: S weight sets (S * bytes > 1.5 GB, far past the 60 MB L2) replayed from one CUDA graph, µs
per matrix; gemv_cuda / gemv_mma get pre-quantized activations (in the model the quantization is
fused into the producer), gemv_mmh "table" reads fp32 x, "foldp" x packed by xpack (in the model
the norm writes it). Copy bandwidth measured in the same run.
Prints a table last; JSON lines in OUT/mmh.jsonl.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench.gemv import copy_bw, graph_time  # noqa: E402
from tightfit.kernels import gemv_mmh  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act  # noqa: E402

IQ4_XS, BB = 23, 136
RTS = (1, 2)          # row tiles per warp, both timed at N = 1 and 5


def rand_iq4(n_out: int, n_in: int, gen, lo: float, hi: float) -> torch.Tensor:
    raw = torch.randint(0, 256, (n_out * n_in // 256 * BB,), dtype=torch.uint8, device="cuda",
                        generator=gen)
    blk = raw.view(-1, BB)
    d = (torch.rand(blk.shape[0], device="cuda", generator=gen) * (hi - lo) + lo).half()
    blk[:, 0:2] = d.view(torch.uint8).view(-1, 2)
    return raw


def check(n_in, n_out, ns, gen, rows=96):
    res = []
    for lo, hi, tag in ((1e-3, 1e-2, "normal"), (3e-6, 5e-5, "subnormal")):
        w = rand_iq4(n_out, n_in, gen, lo, hi)
        pick = np.unique(np.concatenate([np.arange(16), np.random.default_rng(0).integers(
            0, n_out, rows), [n_out - 1]]))
        wr = w.view(n_out, -1)[torch.as_tensor(pick, device="cuda")].cpu().numpy()
        for n in ns:
          for kw in ({"rt": 1}, {"rt": 2}, {"rt": 1, "kind": "foldp"}, {"rt": 2, "kind": "foldp"}):
            x = torch.randn(n, n_in, device="cuda")
            xk = gemv_mmh.xpack(x) if kw.get("kind") == "foldp" else x
            out = torch.empty(n, n_out, device="cuda")
            y = gemv_mmh.gemv_mmh(xk, w, IQ4_XS, n_out, out, **kw).cpu().numpy()[:, pick]
            ref = gemv_mmh.gemv_mmh_ref(x.cpu().numpy(), wr, len(pick), kw.get("kind", "table"))
            rel = float(np.abs(y - ref).max() / (np.abs(ref).max() + 1e-30))
            y2 = gemv_mmh.gemv_mmh(xk, w, IQ4_XS, n_out, torch.empty_like(out), **kw).cpu().numpy()[:, pick]
            res.append(dict(kind="check", n_in=n_in, n_out=n_out, N=n, scales=tag + str(kw), relerr=rel,
                            repeat_equal=bool((y == y2).all()), ok=rel < 1e-5 and bool((y == y2).all())))
    return res


def timeit(n_in, n_out, ns, gen, min_bytes=1.5e9):
    from tightfit.kernels.gemv_cuda import gemv_cuda
    from tightfit.kernels.gemv_mma import gemv_mma
    nbytes = n_out * n_in // 256 * BB
    sets = max(8, math.ceil(min_bytes / nbytes))
    ws = [rand_iq4(n_out, n_in, gen, 1e-3, 1e-2) for _ in range(sets)]
    res = []
    for n in ns:
        x = torch.randn(n, n_in, device="cuda")
        qa = quantize_act(x, 0)
        outs = [torch.empty(n, n_out, device="cuda") for _ in range(sets)]
        impls = {"mmh": lambda w, o: gemv_mmh.gemv_mmh(x, w, IQ4_XS, n_out, o),
                 "cu": lambda w, o: gemv_cuda(qa, w, IQ4_XS, n_out, o),
                 "mma": lambda w, o: gemv_mma(qa, w, IQ4_XS, n_out, o)}
        if n in (1, 5):
            for rt in RTS:
                impls[f"mmh_rt{rt}"] = (lambda rt: lambda w, o: gemv_mmh.gemv_mmh(
                    x, w, IQ4_XS, n_out, o, rt=rt, kind="table"))(rt)
        xp = gemv_mmh.xpack(x)
        for rt in RTS:
            impls[f"foldp_rt{rt}"] = (lambda rt: lambda w, o: gemv_mmh.gemv_mmh(
                xp, w, IQ4_XS, n_out, o, rt=rt, kind="foldp"))(rt)
        for name, fn in impls.items():
            if name == "mma" and n not in (1, 5, 8):
                continue
            try:
                def f():
                    for w, o in zip(ws, outs):
                        fn(w, o)
                ms = graph_time(f) / sets
                res.append(dict(kind="time", impl=name, n_in=n_in, n_out=n_out, N=n, us=ms * 1e3,
                                GBps=nbytes / (ms * 1e-3) / 1e9, sets=sets))
            except Exception as e:  # noqa: BLE001
                res.append(dict(kind="error", impl=name, N=n, err=repr(e)[:300]))
    ws.clear()
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="5120x17408,17408x5120,5120x12288,5120x10240,5120x6144,"
                                        "6144x5120,5120x1024")
    ap.add_argument("--ns", default="1,2,3,4,5,8")
    ap.add_argument("--check-ns", default="1,3,5,8")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s]
    ns = [int(v) for v in a.ns.split(",")]
    cns = [int(v) for v in a.check_ns.split(",") if v]
    results = []
    bw = copy_bw(torch.float32)
    results.append(dict(kind="bw", GBps=bw))
    for k, m in shapes:
        for what, fn in (("check", lambda: check(k, m, cns, gen)), ("time", lambda: timeit(k, m, ns, gen))):
            try:
                results += fn()
            except Exception:  # noqa: BLE001
                results.append(dict(kind="error", what=what, n_in=k, n_out=m, err=traceback.format_exc()[-800:]))
    with open(os.path.join(a.out, "mmh.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print(f"copy bandwidth {bw:.0f} GB/s")
    for r in results:
        if r["kind"] == "check":
            print(f"CHECK {r['n_in']}->{r['n_out']} N={r['N']} {r['scales']:20s} rel {r['relerr']:.2e} "
                  f"repeat {r['repeat_equal']} {'ok' if r['ok'] else 'FAIL'}")
        elif r["kind"] == "error":
            print("ERROR", r)
    t = {(r["impl"], r["n_in"], r["n_out"], r["N"]): r["us"] for r in results if r["kind"] == "time"}
    print("| shape | N | mmh µs | % copy | cu µs | mma µs | mmh / cu(N=1) |")
    for k, m in shapes:
        c1 = t.get(("cu", k, m, 1))
        for n in ns:
            u = t.get(("mmh", k, m, n))
            if u is None:
                continue
            gbs = m * k // 256 * BB / (u * 1e-6) / 1e9
            cu, mm = t.get(("cu", k, m, n)), t.get(("mma", k, m, n))
            print(f"| {k}→{m} | {n} | {u:.1f} | {100 * gbs / bw:.0f} % | "
                  f"{'' if cu is None else f'{cu:.1f}'} | {'' if mm is None else f'{mm:.1f}'} | "
                  f"{'' if c1 is None else f'{u / c1:.2f}'} |")
    names = [f"mmh_rt{rt}" for rt in RTS] + [f"foldp_rt{rt}" for rt in RTS]
    print("| shape | N | " + " | ".join(names) + " | cu N=1 |")
    for k, m in shapes:
        for n in ns:
            v = [t.get((nm, k, m, n)) for nm in names]
            c1 = t.get(("cu", k, m, 1))
            print(f"| {k}→{m} | {n} | " + " | ".join("" if u is None else f"{u:.1f}" for u in v)
                  + f" | {'' if c1 is None else f'{c1:.1f}'} |")

if __name__ == "__main__":
    main()
