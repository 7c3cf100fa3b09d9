"""Ternary GEMV timing (issue 12): T3_256 (tightfit/kernels/gemv_t3.py, float x) vs TQ2_0 and TQ1_0
through the dispatcher tightfit.kernels.gemv (int8-quantized x, quantization launch included, as
bench/gemv.py and llama.cpp time it). TQ1_0 is skipped with a note while the dispatcher lacks it.

Shapes: 5120->17408 and 17408->5120 (in->out), N=1. Each timing replays ONE CUDA graph that runs
the GEMV over S >= 8 rotated weight sets (S x bytes >= --min-bytes, far beyond the 60 MB L2);
median of 20 replays / S. Reported: us/matrix, GB/s (weight bytes / time) and % of the copy
bandwidth measured in the same run (max of a 4 GiB uint8 copy_ and a 1 GiB float32 copy_, both
read+write bytes / time; bench/RESULTS.md records 4.28 TB/s for the first on the H200).

Correctness first, at the real shapes on 256 sampled rows: the same ternary weights as TQ2_0
(codes 0..2, random fp16 scales), repacked losslessly to T3 (tightfit.tools.repack) and, for
TQ1_0, quantized by gguf-py from the same float values; compared with a float64 matmul of the
dequantized weights (T3: float x, bound 1e-4; TQ*: int8 x, bound 2 %).

  python3 bench/ternary_gemv.py --out $OUT [--budget 90] [--t3-block-r 16,32]
  python3 bench/ternary_gemv.py --device cpu      # smoke: TRITON_INTERPRET=1, tiny shapes

Prints a short table last; JSON to OUT/ternary_gemv.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T3_ID, TQ2_ID, TQ1_ID = 3256, 35, 34
BLOCK = {T3_ID: 54, TQ2_ID: 66, TQ1_ID: 54}          # bytes per 256 weights
SCALE_AT = {T3_ID: 52, TQ2_ID: 64, TQ1_ID: 52}       # fp16 d offset inside the block
NAME = {T3_ID: "T3_256", TQ2_ID: "TQ2_0", TQ1_ID: "TQ1_0"}


def graph_time(torch, fn, reps: int = 20) -> float:
    """bench/gemv.py's graph timing (median ms of one replay)."""
    return _gemv_bench().graph_time(fn, reps)


def copy_bw(torch) -> dict[str, float]:
    """Device copy bandwidth as bench/gemv.py measures it (on the stream, not in a graph: a
    captured memcpy node reads ~2.7 TB/s on the H200, bench/NOTES.md)."""
    return {"float32_1GiB": _gemv_bench().copy_bw(torch.float32)}


def _gemv_bench():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gemv as gemv_bench
    return gemv_bench


def ternary_weights(n_out: int, n_in: int, seed: int):
    """(TQ2_0 bytes [n_out, row], T3 bytes [n_out, row], float64 W) of one ternary matrix."""
    import numpy as np
    from tightfit.tools.repack import TQ2_0, _tq2_0_blocks, repack_chunks
    rng = np.random.default_rng(seed)
    nb = n_out * n_in // 256
    codes = rng.integers(0, 3, size=(nb, 256)).astype(np.uint8)
    d = (rng.random(nb) * 0.009 + 0.001).astype(np.float16)
    tq2 = _tq2_0_blocks(codes, d.view(np.uint16))
    t3 = np.concatenate(list(repack_chunks(tq2.reshape(-1), TQ2_0)), axis=0)
    w = ((codes.astype(np.float64) - 1) * d.astype(np.float64)[:, None]).reshape(n_out, n_in)
    return tq2.reshape(n_out, -1), t3.reshape(n_out, -1), w


def dispatcher_has(t: int) -> bool:
    try:
        from tightfit.kernels import gemv as G
        return t in G.QUANT_TYPES
    except Exception:  # noqa: BLE001
        return False


def run_kernel(t: int, w, x, n_out: int, n_in: int, out, block_r: int = 16):
    if t == T3_ID:
        from tightfit.kernels.gemv_t3 import gemv_t3
        return gemv_t3(w, T3_ID, x, block_r=block_r)
    from tightfit.kernels.gemv import gemv
    return gemv(x[None, :], w.reshape(-1), t, n_out, n_in, out=out)


def check(torch, dev: str, n_in: int, n_out: int, rows: int, types: list[int]) -> list[dict]:
    import numpy as np
    sel_rows = min(rows, n_out)
    tq2, t3, w = ternary_weights(sel_rows, n_in, seed=n_in + n_out)
    x = np.random.default_rng(1).standard_normal(n_in).astype(np.float32)
    want = w @ x.astype(np.float64)
    res = []
    for t in types:
        r = {"kind": "check", "type": NAME[t], "n_in": n_in, "n_out": n_out, "rows": sel_rows}
        try:
            if t == TQ1_ID:
                import gguf
                from gguf.quants import quantize as gq
                raw = gq(w.astype(np.float32), gguf.GGMLQuantizationType.TQ1_0).reshape(sel_rows, -1)
            else:
                raw = tq2 if t == TQ2_ID else t3
            wt = torch.from_numpy(np.ascontiguousarray(raw)).to(dev)
            out = torch.empty(1, sel_rows, device=dev)
            y = run_kernel(t, wt, torch.from_numpy(x).to(dev), sel_rows, n_in, out)
            y = y.reshape(-1).float().cpu().numpy().astype(np.float64)
            r["relerr"] = float(np.linalg.norm(y - want) / np.linalg.norm(want))
            r["ok"] = r["relerr"] < (1e-4 if t == T3_ID else 0.02)
        except Exception as e:  # noqa: BLE001
            r.update(ok=False, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc()[-2000:])
        res.append(r)
    return res


def timeit(torch, t: int, n_in: int, n_out: int, min_bytes: float, block_r: int) -> dict:
    nb = n_out * n_in // 256
    nbytes = nb * BLOCK[t]
    sets = max(8, math.ceil(min_bytes / nbytes))
    gen = torch.Generator(device="cuda").manual_seed(n_in * 7 + t)
    ws = []
    for _ in range(sets):
        raw = torch.randint(0, 243, (nbytes,), dtype=torch.uint8, device="cuda", generator=gen)
        blk = raw.view(nb, BLOCK[t])
        if t == TQ2_ID:           # keep codes ternary (no code 3): clear bit 1 where both set
            q = blk[:, :64]
            blk[:, :64] = q & ~((q & 0xAA) & ((q & 0x55) << 1))
        sc = (torch.rand(nb, device="cuda", generator=gen) * 0.009 + 0.001).half()
        o = SCALE_AT[t]
        blk[:, o:o + 2] = sc.view(torch.uint8).view(-1, 2)
        ws.append(raw.view(n_out, -1))
    x = torch.randn(n_in, device="cuda")
    outs = [torch.empty(1, n_out, device="cuda") for _ in range(sets)]

    def f():
        for w, o in zip(ws, outs):
            run_kernel(t, w, x, n_out, n_in, o, block_r)
    graph_time(torch, f, 3)
    ms = graph_time(torch, f) / sets
    ws.clear()
    torch.cuda.empty_cache()
    return {"kind": "time", "type": NAME[t], "n_in": n_in, "n_out": n_out, "N": 1, "sets": sets,
            "bytes": nbytes, "us": ms * 1e3, "GBps": nbytes / (ms * 1e-3) / 1e9,
            "block_r": block_r if t == T3_ID else None}


def main() -> int:
    ap = argparse.ArgumentParser(description="T3 vs TQ2_0/TQ1_0 GEMV timing (issue 12)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default="5120x17408,17408x5120", help="in x out, comma separated")
    ap.add_argument("--types", default="T3_256,TQ2_0,TQ1_0")
    ap.add_argument("--t3-block-r", default="16,32")
    ap.add_argument("--min-bytes", type=float, default=1.5e9)
    ap.add_argument("--check-rows", type=int, default=256)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds; later timings are skipped")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    cpu = not args.device.startswith("cuda")
    if cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    t_end = time.time() + args.budget
    ids = {v: k for k, v in NAME.items()}
    types = [ids[x.upper()] for x in args.types.split(",")]
    res: dict = {"device": args.device, "results": [], "skipped": []}
    for t in list(types):
        if t != T3_ID and not dispatcher_has(t):
            res["skipped"].append(f"{NAME[t]}: not in tightfit.kernels.gemv (QUANT_TYPES) yet")
            types.remove(t)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if cpu:
        shapes = [(512, 24)]
    if not cpu:
        res["copy_GBps"] = copy_bw(torch)
        res["copy_ref_GBps"] = max(res["copy_GBps"].values())
        print(f"copy bandwidth {res['copy_GBps']}", flush=True)
    dev = "cpu" if cpu else "cuda"
    for n_in, n_out in shapes:
        res["results"] += check(torch, dev, n_in, n_out, args.check_rows, types)
    for r in res["results"]:
        print(json.dumps({k: v for k, v in r.items() if k != "tb"}), flush=True)
    if not cpu:
        for n_in, n_out in shapes:
            for t in types:
                for br in ([int(b) for b in args.t3_block_r.split(",")] if t == T3_ID else [16]):
                    if time.time() > t_end:
                        res["skipped"].append(f"{NAME[t]} {n_in}->{n_out} R={br}: budget")
                        continue
                    try:
                        r = timeit(torch, t, n_in, n_out, args.min_bytes, br)
                        r["pct_copy"] = 100 * r["GBps"] / res["copy_ref_GBps"]
                    except Exception as e:  # noqa: BLE001
                        r = {"kind": "time", "type": NAME[t], "n_in": n_in, "n_out": n_out,
                             "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-2000:]}
                    res["results"].append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "tb"}), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ternary_gemv.json").write_text(json.dumps(res, indent=1, default=str))
    print("\n== ternary GEMV, N=1 ==")
    for s in res["skipped"]:
        print(f"skipped: {s}")
    print(f"{'type':>7} {'shape':>12} {'R':>3} {'ok':>5} {'relerr':>9} {'us':>8} {'GB/s':>7} {'% copy':>6}")
    checks = {(r["type"], r["n_in"], r["n_out"]): r for r in res["results"] if r["kind"] == "check"}
    rows = [r for r in res["results"] if r["kind"] == "time"] or list(checks.values())
    for r in rows:
        c = checks.get((r["type"], r["n_in"], r["n_out"]), {})
        print(f"{r['type']:>7} {str(r['n_in']) + '->' + str(r['n_out']):>12} {str(r.get('block_r') or '-'):>3} "
              f"{str(c.get('ok', '-')):>5} {c.get('relerr', float('nan')):>9.2e} "
              f"{r.get('us', float('nan')):>8.1f} {r.get('GBps', float('nan')):>7.0f} "
              f"{r.get('pct_copy', float('nan')):>6.1f}" + (f"  {r['error'][:80]}" if "error" in r else ""))
    if not cpu:
        print(f"copy reference {res['copy_ref_GBps']:.0f} GB/s ({res['copy_GBps']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
