"""Launch-configuration sweep of the FP16 split-K decode attention (tightfit/kernels/attn_decode.py).

At 32K cached tokens the FP16 kernel read its 128 MiB per layer at ~2.5 TB/s (bench/RESULTS.md,
session 5/6), 58 % of the copy bandwidth; on the seed-mix 27B that is 0.7 ms of the 8.06 ms step
at 32K. This times rows-per-tile x warps x pipeline stages (and two other chunk sizes) per layer
from a CUDA graph over enough layers that L2 does not help, checks every configuration against
the float64 oracle, and prints a table best first. The winner becomes attn_decode.SPLIT_CFG.

    python3 bench/attn_f16_sweep.py --ctx 8192,32768,131072 --out $OUT
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
    """(SPLIT_CFG overrides, chunk). Session 6 call 4 swept bt x nw x ns at chunk 512 (none beat
    bt=32 nw=4 default stages) and chunk 256/1024: 128 programs of 1024 rows with bt=64 nw=8 ns=3
    were 7 % faster at 32K. nl > 0 keeps that program count at every depth (rows from T)."""
    out = [(dict(bt=32, nw=4, ns=0, nl=0), 512),          # ns=0: Triton's default stages
           (dict(bt=64, nw=8, ns=3, nl=0), 1024)]
    for nl in (16, 32, 48, 64):
        out.append((dict(bt=64, nw=8, ns=3, nl=nl), 512))
    for bt, nw, ns in ((32, 4, 0), (64, 8, 2), (64, 4, 3), (32, 8, 3)):
        out.append((dict(bt=bt, nw=nw, ns=ns, nl=32), 512))
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
            os.environ[A.CFG_ENV] = ";".join(f"{k}={v}" for k, v in cfg.items() if v or k == "nl")
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
    # the best accurate configuration at the executor's chunk (the plan prices the workspace for
    # DEFAULT_CHUNK): lowest mean time relative to the first configuration (today's) over the
    # contexts swept, as a TIGHTFIT_ATTN_F16_CFG value
    keys = ("bt", "nw", "ns", "nl")
    base = {r["T"]: r["time_us"] for r in rows if "error" not in r
            and tuple(r[k] for k in keys) == tuple(configs()[0][0][k] for k in keys)}
    score: dict = {}
    for r in rows:
        if "error" in r or r["chunk"] != A.DEFAULT_CHUNK or r["rel_err"] > 1e-4 or r["T"] not in base:
            continue
        score.setdefault(tuple(r[k] for k in keys), []).append(r["time_us"] / base[r["T"]])
    full = {c: sum(v) / len(v) for c, v in score.items() if len(v) == len(base)}
    if full:
        b = min(full, key=full.get)
        print(f"best at chunk {A.DEFAULT_CHUNK}: {dict(zip(keys, b))}, mean time {full[b]:.3f} of today's")
        (Path(a.out) / "best_cfg.txt").write_text(";".join(f"{k}={v}" for k, v in zip(keys, b)))
    print(f"\n{'T':>7} {'chunk':>5} {'bt':>3} {'nw':>3} {'ns':>3} {'nl':>3} {'us':>8} {'TB/s':>6} "
          f"{'rel err':>9}")
    for r in sorted(rows, key=lambda r: (r["T"], r.get("time_us", 1e9))):
        if "error" in r:
            print(f"{r['T']:>7} {r['chunk']:>5} {r['bt']:>3} {r['nw']:>3} {r['ns']:>3} {r['nl']:>3}  "
                  f"{r['error']}")
            continue
        print(f"{r['T']:>7} {r['chunk']:>5} {r['bt']:>3} {r['nw']:>3} {r['ns']:>3} {r['nl']:>3} "
              f"{r['time_us']:>8.1f} "
              f"{r['TBps']:>6.2f} {r['rel_err']:>9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
