"""Device benchmark of decode attention on the quantized KV cache (issue 11), for the lead to run.

    python3 bench/kv_quant.py --ctx 8192,32768,131072 --types f16,q8_0,tq4,tq3,q8_0+tq3 --out $OUT

One 27B attention block (24 query heads, 4 KV heads, head_dim 256), one decode token at T cached
positions. f16 runs tightfit/kernels/attn_decode.py; the others attn_decode_q.py (q rotation,
attention, un-rotation + gate: 3-4 launches). Split-K (chunk 512) above 1024 tokens, like the
executor. Per (type, T): median time from CUDA graphs replaying the step over S independent
layer caches (S chosen so the caches exceed 4x the L2, i.e. the time includes reading the cache
from HBM), the effective cache bandwidth, the quantize-on-write time of one token (torch path),
and the max error against float64 on the same quantized bytes (first layer only, T <= 32K).
JSON lines go to OUT/kv_quant.jsonl, a table to stdout.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tightfit.kernels import attn_decode as A  # noqa: E402
from tightfit.kernels import attn_decode_q as AQ  # noqa: E402
from tightfit.kvquant.formats import get_format, split_kv_type  # noqa: E402
from tightfit.kvquant.reference import alloc_cache, attention_quant_f64, quantize, write_rows  # noqa: E402

H, HKV, D = 24, 4, 256
CHUNK = 512


def cache_bytes(kv_type: str, T: int) -> int:
    if kv_type == "f16":
        return 2 * T * HKV * D * 2
    kn, vn = split_kv_type(kv_type)
    return T * HKV * (get_format(kn).row_bytes(D) + get_format(vn).row_bytes(D))


def make_layer(kv_type: str, T: int, gen: torch.Generator, dev):
    k = torch.randn(T, HKV, D, generator=gen, device=dev)
    k[..., 3] = k[..., 3] * 12 + 6
    v = torch.randn(T, HKV, D, generator=gen, device=dev)
    if kv_type == "f16":
        return k.half(), v.half()
    kn, vn = split_kv_type(kv_type)
    kc, vc = alloc_cache(T, HKV, D, kn, dev), alloc_cache(T, HKV, D, vn, dev)
    for s in range(0, T, 8192):
        write_rows(kc, vc, s, k[s:s + 8192], v[s:s + 8192], kv_type)
    return kc, vc


def bench_one(kv_type: str, T: int, dev, l2: int) -> dict:
    gen = torch.Generator(device=dev).manual_seed(T)
    per = cache_bytes(kv_type, T)
    S = max(1, min(16, math.ceil(4 * l2 / per)))
    layers = [make_layer(kv_type, T, gen, dev) for _ in range(S)]
    q = torch.randn(H, D, device=dev, generator=gen) * 0.3
    qg = torch.randn(H, 2 * D, device=dev, generator=gen)
    out = torch.zeros(H, D, device=dev)
    status = torch.tensor([0, 0, T - 1], dtype=torch.int32, device=dev)
    nch = -(-T // CHUNK) if T > AQ.SINGLE_PASS_MAX else 1
    if kv_type == "f16":
        ws = A.make_workspace(H, D, T, CHUNK, device=dev) if nch > 1 else None
        step = lambda kc, vc: A.attn_decode(q, kc, vc, qg, out, status, ws, nch, CHUNK)  # noqa: E731
    else:
        ws = AQ.make_workspace(kv_type, H, D, max(T, AQ.SINGLE_PASS_MAX + 1), CHUNK, device=dev)
        step = lambda kc, vc: AQ.attn_decode_q(q, kc, vc, qg, out, status, ws, nch, CHUNK)  # noqa: E731
    err = None
    if kv_type != "f16" and T <= 32768:
        step(*layers[0])
        torch.cuda.synchronize()
        ref = attention_quant_f64(q, layers[0][0], layers[0][1], T, kv_type, gate=qg[:, D:])
        err = float((out.double().cpu() - ref).abs().max() / ref.abs().max())
    for kc, vc in layers:                       # warm-up / compile
        step(kc, vc)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for kc, vc in layers:
            step(kc, vc)
    times = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / S)
    t_ms = sorted(times)[len(times) // 2]
    w_ms = None
    if kv_type != "f16":
        kn, vn = split_kv_type(kv_type)
        row = torch.randn(1, HKV, D, device=dev)
        for _ in range(3):
            quantize(row, kn), quantize(row, vn)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            quantize(row, kn), quantize(row, vn)
        torch.cuda.synchronize()
        w_ms = (time.perf_counter() - t0) / 20 * 1e3
    return {"kv_type": kv_type, "T": T, "layers_in_graph": S, "cache_bytes": per,
            "time_ms": t_ms, "GBps": per / (t_ms * 1e-3) / 1e9, "max_rel_err_vs_f64": err,
            "write_one_token_ms": w_ms, "n_chunks": nch}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="8192,32768,131072")
    ap.add_argument("--types", default="f16,q8_0,tq4,tq3,tq3_128,q8_0+tq3,tq4+tq3")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    dev = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    with open(os.path.join(a.out, "kv_quant.jsonl"), "w") as f:
        for T in [int(x) for x in a.ctx.split(",")]:
            for t in a.types.split(","):
                try:
                    r = bench_one(t, T, dev, l2)
                except Exception as e:          # keep the other rows
                    r = {"kv_type": t, "T": T, "error": f"{type(e).__name__}: {e}"}
                rows.append(r)
                f.write(json.dumps(r) + "\n")
                f.flush()
                print(json.dumps(r), flush=True)
                torch.cuda.empty_cache()
    print(f"\n{'type':>10} {'T':>7} {'MiB':>8} {'ms':>8} {'GB/s':>7} {'vs f16':>7} {'err':>8} {'write ms':>8}")
    base = {r["T"]: r["time_ms"] for r in rows if r.get("kv_type") == "f16" and "time_ms" in r}
    for r in rows:
        if "error" in r:
            print(f"{r['kv_type']:>10} {r['T']:>7} {r['error']}")
            continue
        rel = r["time_ms"] / base[r["T"]] if r["T"] in base else float("nan")
        err = "" if r["max_rel_err_vs_f64"] is None else f"{r['max_rel_err_vs_f64']:.1e}"
        wr = "" if r["write_one_token_ms"] is None else f"{r['write_one_token_ms']:.3f}"
        print(f"{r['kv_type']:>10} {r['T']:>7} {r['cache_bytes'] / 2**20:>8.1f} {r['time_ms']:>8.4f} "
              f"{r['GBps']:>7.0f} {rel:>7.2f} {err:>8} {wr:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
