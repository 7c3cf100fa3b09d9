"""The GEMV kernels alone on the device: CUDA GEMV "auto" (gemv_cuda) and, with --mma, the
tensor-core kernel (gemv_mma), activations quantized ONCE outside the timed graph (as in the decode
step, where one fused quantization feeds several matrices; bench/gemv.py's "cu" rows launch one
quantization per matrix), weight sets rotated so L2 does not help.

    python3 bench/gemv_alone.py [--formats Q4_K,Q5_K,Q6_K,IQ4_XS,Q8_0] [--shapes ffn,kv]
        [--ns 1,8] [--mma] [--out DIR]

(Session 5 call 2 ran this script as bench/gemv_tma_ab.py, with a cp.async.bulk-staged kernel as
the second column: 10-40 % slower everywhere, removed; bench/NOTES.md.) Correctness first: every
(format, shape, N, kernel) result on 128 random rows vs the float64 product of the dequantized
weights and the dequantized int8 x (relative error must be < 1e-4), output poisoned with NaN.
Last: a table of µs and % of the copy bandwidth measured in the same run."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv import SHAPES, copy_bw, graph_time, rand_weights  # noqa: E402

from tightfit.kernels.gemv import MACRO_BYTES, gemv_ref, type_id  # noqa: E402
from tightfit.kernels.gemv_cuda import gemv_cuda  # noqa: E402
from tightfit.kernels.quantize_act import quantize_act, quantize_act_ref  # noqa: E402


def run_impl(impl, act, w, t, n_out, out):
    if impl == "auto":
        return gemv_cuda(act, w, t, n_out, out)
    from tightfit.kernels.gemv_mma import gemv_mma
    return gemv_mma(act, w, t, n_out, out)


def name(impl):
    return impl


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="Q4_K,Q5_K,Q6_K,IQ4_XS,Q8_0")
    ap.add_argument("--shapes", default="ffn,kv")
    ap.add_argument("--ns", default="1,8")
    ap.add_argument("--mma", action="store_true", help="also the tensor-core kernel (gemv_mma)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    impls = ["auto"] + (["mma"] if a.mma else [])
    ns = [int(n) for n in a.ns.split(",")]
    shapes = [s for k in a.shapes.split(",") for s in SHAPES[k]]
    gen = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bw(torch.int64)
    rows, bad = [], 0
    for f in a.formats.split(","):
        t = type_id(f)
        for n_in, n_out in shapes:
            # correctness on 128 rows
            w = rand_weights(t, n_out, n_in, gen)
            sel = np.sort(np.random.default_rng(0).choice(n_out, size=128, replace=False))
            rb = n_in // 256 * MACRO_BYTES[t]
            wsel = w.view(n_out, rb)[torch.from_numpy(sel).cuda()].cpu().numpy()
            for n in ns:
                x = torch.randn(n, n_in, device="cuda")
                act = quantize_act(x, 0)
                q, d, _ = quantize_act_ref(x.cpu().numpy())
                ref = gemv_ref((q * d[..., None]).reshape(n, n_in), wsel, t, len(sel), n_in)
                for impl in impls:
                    out = torch.full((n, n_out), float("nan"), device="cuda")
                    y = run_impl(impl, act, w, t, n_out, out).cpu().numpy()[:, sel]
                    e = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
                    ok = bool(np.isfinite(y).all() and e < 1e-4)
                    bad += not ok
                    print(f"CHECK {f:7s} {n_in:6d}->{n_out:6d} N={n} {name(impl):12s} relerr {e:.2e} "
                          f"{'ok' if ok else 'BAD'}", flush=True)
            del w
            # timing: rotated weight sets, one graph
            nbytes = n_out * n_in // 256 * MACRO_BYTES[t]
            sets = max(8, math.ceil(1.5e9 / nbytes))
            ws = [rand_weights(t, n_out, n_in, gen) for _ in range(sets)]
            for n in ns:
                act = quantize_act(torch.randn(n, n_in, device="cuda"), 0)
                outs = [torch.empty(n, n_out, device="cuda") for _ in range(sets)]
                for impl in impls:
                    def fn(impl=impl, ws=ws, outs=outs, act=act):
                        for wi, o in zip(ws, outs):
                            run_impl(impl, act, wi, t, n_out, o)
                    us = graph_time(fn) / sets * 1e3
                    rows.append(dict(type=f, n_in=n_in, n_out=n_out, N=n, impl=name(impl), us=us,
                                     pct=100 * nbytes / (us * 1e-6) / 1e9 / bw))
            del ws
            torch.cuda.empty_cache()
    with open(os.path.join(a.out, "gemv_alone.jsonl"), "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    print(f"copy bandwidth {bw:.0f} GB/s; checks bad: {bad}")
    print("| type | shape | N | " + " | ".join(name(i) for i in impls) + " |")
    print("|---|---|---|" + "---|" * len(impls))
    keys = sorted({(r["type"], r["n_in"], r["n_out"], r["N"]) for r in rows})
    for k in keys:
        cells = []
        for impl in impls:
            r = [r for r in rows if (r["type"], r["n_in"], r["n_out"], r["N"]) == k
                 and r["impl"] == name(impl)][0]
            cells.append(f"{r['us']:.1f} µs {r['pct']:.0f}%")
        print(f"| {k[0]} | {k[1]}→{k[2]} | {k[3]} | " + " | ".join(cells) + " |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
