"""Programmatic dependent launch, A/B on the whole decode step (device): one load of the seed-mix
27B (generated like bench/e2e.py when --path is missing), then per depth and per TIGHTFIT_PDL
value a fresh state (so the step graphs are captured under that setting), the same KV contents,
the same start token: greedy tokens must be identical and the last logits within fp32 noise;
tok/s of the host loop (step + argmax read back per token, as bench/e2e.py's "tok/s") and of the
device-fed greedy loop.

    TIGHTFIT_DEVICE_EMBED=1 python3 bench/pdl_ab.py [--depths 0,32768] [--tokens 64] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

LLAMA = {0: 87.8, 8192: 85.9, 32768: 82.4}     # ../shared/bench/llama-cpp-h200-e2e.md


def prep(st, depth: int) -> None:
    st.reset()
    if depth:
        g = torch.Generator(device="cuda").manual_seed(depth)
        for i in range(st.k.shape[0]):
            st.k[i, :depth].normal_(generator=g)
            st.v[i, :depth].normal_(generator=g)
        st._set_pos(depth)


def run(exe, ctx: int, depth: int, n: int, pdl: str) -> dict:
    os.environ["TIGHTFIT_PDL"] = pdl
    st = exe.new_state(ctx)
    prep(st, depth)
    exe.greedy(5, st, 4)                          # captures the feed graph under this setting
    prep(st, depth)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    toks = exe.greedy(5, st, n)
    torch.cuda.synchronize()
    dev_tps = n / (time.perf_counter() - t0)
    logits = exe.logits.float().clone()
    prep(st, depth)                               # host loop: argmax read back every token
    tok = 5
    exe.step_token(tok, st, head=True)
    tok = int(torch.argmax(exe.logits[0]))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        exe.step_token(tok, st, head=True)
        tok = int(torch.argmax(exe.logits[0]))
    host_tps = n / (time.perf_counter() - t0)
    st.sync()
    del st
    torch.cuda.empty_cache()
    return {"depth": depth, "pdl": pdl, "tokens": toks, "device_fed_tok_s": dev_tps,
            "host_loop_tok_s": host_tps, "logits": logits}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--ctx", type=int, default=33408)
    ap.add_argument("--depths", default="0,32768")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.model.generate import make_model
    if not Path(a.path).exists():
        t0 = time.time()
        try:
            make_model(a.path, preset="qwen3.8-27b-seedmix")
        except Exception:  # noqa: BLE001 - the real vocabulary needs an extra package
            make_model(a.path, preset="qwen3.8-27b-seedmix", vocab="small:248320")
        print(f"generated in {time.time() - t0:.0f}s", flush=True)
    t0 = time.time()
    exe = GPUModel.from_model_file(open_model(a.path), device="cuda", n_ctx=a.ctx, lazy_check=True)
    torch.cuda.synchronize()
    print(f"loaded in {time.time() - t0:.1f}s", flush=True)
    rows, bad = [], 0
    for depth in [int(d) for d in a.depths.split(",")]:
        r0 = run(exe, a.ctx, depth, a.tokens, "0")
        r1 = run(exe, a.ctx, depth, a.tokens, "1")
        same = r0["tokens"] == r1["tokens"]
        d = float((r0["logits"] - r1["logits"]).abs().max())
        scale = float(r0["logits"].abs().max())
        ok = same and d <= 1e-3 * max(scale, 1.0)
        bad += not ok
        for r in (r0, r1):
            r.pop("logits")
            rows.append({**r, "same_tokens": same, "max_logit_diff": d, "ok": ok})
        print(f"depth {depth}: PDL 0 {r0['host_loop_tok_s']:.1f} tok/s (device-fed "
              f"{r0['device_fed_tok_s']:.1f}); PDL 1 {r1['host_loop_tok_s']:.1f} "
              f"(device-fed {r1['device_fed_tok_s']:.1f}); same tokens {same}, "
              f"max |dlogit| {d:.2e} of {scale:.2f}", flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "pdl_ab.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    print("| depth | PDL | tok/s host loop | tok/s device-fed | × llama.cpp (host loop) | same tokens |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ll = LLAMA.get(r["depth"])
        x = f"{r['host_loop_tok_s'] / ll:.2f}" if ll else "–"
        print(f"| {r['depth']} | {r['pdl']} | {r['host_loop_tok_s']:.1f} | "
              f"{r['device_fed_tok_s']:.1f} | {x} | {r['same_tokens']} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
