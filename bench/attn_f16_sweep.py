"""Launch-configuration sweep of the FP16 split-K decode attention (tightfit/kernels/attn_decode.py).

At 32K cached tokens the FP16 kernel read its 128 MiB per layer at ~2.5 TB/s (bench/RESULTS.md,
session 5/6), 58 % of the copy bandwidth; on the seed-mix 27B that is 0.7 ms of the 8.06 ms step
at 32K. This times rows-per-tile x warps x pipeline stages (and two other chunk sizes) per layer
from a CUDA graph over enough layers that L2 does not help, checks every configuration against
the float64 oracle, and prints a table best first. The winner becomes attn_decode.SPLIT_CFG.

    python3 bench/attn_f16_sweep.py --ctx 32768 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from kv_quant import D, H, cache_bytes, graph_ms, make_layer  # noqa: E402
from tightfit.kernels import attn_decode as A  # noqa: E402


def configs() -> list[tuple[dict, int]]:
    out = [(dict(bt=32, nw=4, ns=0), 512)]            # ns=0: Triton's default stages (today's)
    for bt in (32, 64):
        for nw in (4, 8):
            for ns in (2, 3, 4):
                out.append((dict(bt=bt, nw=nw, ns=ns), 512))
    out.append((dict(bt=16, nw=4, ns=3), 512))
    for chunk in (256, 1024):
        out.append((dict(bt=32, nw=4, ns=0), chunk))
        out.append((dict(bt=64, nw=8, ns=3), chunk))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="32768")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # cpu: interpreter check
    l2 = (getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
          if dev.type == "cuda" else 1 << 20)
    rows = []
    for T in [int(t) for t in a.ctx.split(",")]:
        gen = torch.Generator(device=dev).manual_seed(T)
        per = cache_bytes("f16", T)
        S = max(2, min(16, math.ceil(4 * l2 / per)))
        layers = [make_layer("f16", T, gen, dev) for _ in range(S)]
        q = torch.randn(H, D, device=dev, generator=gen) * 0.3
        qg = torch.randn(H, 2 * D, device=dev, generator=gen)
        status = torch.tensor([0, 0, T - 1], dtype=torch.int32, device=dev)
        ref = A.attention_f64(q.double().cpu(), layers[0][0][:T].double().cpu(),
                              layers[0][1][:T].double().cpu(), qg[:, D:].double().cpu())
        for cfg, chunk in configs():
            os.environ[A.CFG_ENV] = ";".join(f"{k}={v}" for k, v in cfg.items() if v)
            nch = -(-T // chunk)
            ws = A.make_workspace(H, D, T, chunk, device=dev)
            out = torch.full((H, D), float("nan"), device=dev)
            r = {"T": T, "chunk": chunk, **cfg, "layers_in_graph": S}
            try:
                A.attn_decode(q, *layers[0], qg, out, status, ws, nch, chunk)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                r["rel_err"] = float((out.double().cpu() - ref).abs().max() / ref.abs().max())
                r["time_us"] = 1e3 * graph_ms([
                    (lambda kc=kc, vc=vc: A.attn_decode(q, kc, vc, qg, out, status, ws, nch, chunk))
                    for kc, vc in layers])
                r["TBps"] = per / (r["time_us"] * 1e-6) / 1e12
            except Exception as e:  # noqa: BLE001 - out of shared memory etc.: recorded, skipped
                r["error"] = f"{type(e).__name__}: {str(e)[:120]}"
            rows.append(r)
            print(json.dumps(r), flush=True)
        os.environ.pop(A.CFG_ENV, None)
        del layers
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "attn_f16_sweep.json").write_text(json.dumps(rows, indent=1))
    # the fastest accurate configuration at the executor's chunk (the plan prices the workspace
    # for DEFAULT_CHUNK), at the largest context swept, as a TIGHTFIT_ATTN_F16_CFG value
    ok = [r for r in rows if "error" not in r and r["chunk"] == A.DEFAULT_CHUNK
          and r["rel_err"] < 1e-4 and r["T"] == max(x["T"] for x in rows)]
    if ok:
        b = min(ok, key=lambda r: r["time_us"])
        (Path(a.out) / "best_cfg.txt").write_text(
            ";".join(f"{k}={b[k]}" for k in ("bt", "nw", "ns") if b[k]))
    print(f"\n{'T':>7} {'chunk':>5} {'bt':>3} {'nw':>3} {'ns':>3} {'us':>8} {'TB/s':>6} {'rel err':>9}")
    for r in sorted(rows, key=lambda r: (r["T"], r.get("time_us", 1e9))):
        if "error" in r:
            print(f"{r['T']:>7} {r['chunk']:>5} {r['bt']:>3} {r['nw']:>3} {r['ns']:>3}  {r['error']}")
            continue
        print(f"{r['T']:>7} {r['chunk']:>5} {r['bt']:>3} {r['nw']:>3} {r['ns']:>3} {r['time_us']:>8.1f} "
              f"{r['TBps']:>6.2f} {r['rel_err']:>9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
