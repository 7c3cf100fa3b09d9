"""Where the verify block's logits leave the one-token step's (issue 10: greedy identity on the device).

    python3 bench/spec_exact.py [--path /tmp/seedmix.gguf] [--positions 24] [--out $OUT]
    python3 bench/spec_exact.py --model tiny.gguf --device cpu      # smoke test

Two states take the same prompt (batched prefill each: the first row of the table compares the two
prefills, i.e. whether the prefill is deterministic). Then, position by position, state A runs the
step (`forward([t])`, the plain decode's graph) and state B the verify block [t, t, t, t, t]
(`forward_block`, the speculative round's graph at M = 5) and commits its first row; both continue
with the step's argmax t. Per position: relative L2 difference of the two logit rows, largest
absolute difference, whether the argmaxes agree, and the step's top-1 / top-2 gap. An argmax flip
where the gap is below the difference is rounding at a near-tie; a flip with a gap far above it
is a real discrepancy between the two paths. The seed-mix model is generated like bench/spec.py's
--seedmix (reused when present). Prints a table; JSON lines to --out/spec_exact.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from spec import PROSE, build_model, load  # noqa: E402


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    top = np.argsort(a)[-2:]
    return dict(rel=float(np.linalg.norm(a - b) / (np.linalg.norm(a) + 1e-30)),
                max_abs=float(np.abs(a - b).max()), argmax_a=int(a.argmax()), argmax_b=int(b.argmax()),
                same=bool(a.argmax() == b.argmax()), gap=float(a[top[1]] - a[top[0]]),
                scale=float(np.abs(a).max()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default=None, help="where the seed-mix model is (generated if absent)")
    ap.add_argument("--model", default=None, help="another GGUF instead of the seed-mix")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--positions", type=int, default=24)
    ap.add_argument("--block", type=int, default=5, help="verify block size M")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--perturb", type=float, default=0.0,
                    help="also: prefill with layer 0's attn_norm scaled by (1 + eps)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    a = ap.parse_args()
    ns = argparse.Namespace(model=a.model, seedmix=True, path=a.path, mtp=False, layers=None)
    path = build_model(ns)
    t0 = time.time()
    engine = load(path, a.device, a.n_ctx)    # on the CPU: the GPU executor's torch fallbacks
    m = engine.model
    print(f"model {path}, executor {type(m).__name__}, loaded in {time.time() - t0:.1f}s", flush=True)
    ids = engine.encode_prompt(PROSE)
    sa, sb = engine.new_state(), engine.new_state()
    sa.reset()
    sb.reset()
    with torch.no_grad():
        la = m.forward(ids, sa, logits="last")[0].float().cpu().numpy()
        lb = m.forward(ids, sb, logits="last")[0].float().cpu().numpy()
    rows = [dict(pos=-1, what="prefill A vs prefill B", **compare(la, lb))]
    if a.perturb:
        # how the model amplifies a rounding-sized change: layer 0's input norm scaled by
        # (1 + eps) before a third prefill (a chaotic random net turns 1e-7 into O(10 %) logits)
        w = m.vec["blk.0.attn_norm.weight"]
        w0 = w.clone()
        with torch.no_grad():
            w.mul_(1.0 + a.perturb)
            sc = engine.new_state()
            sc.reset()
            lc = m.forward(ids, sc, logits="last")[0].float().cpu().numpy()
            w.copy_(w0)
        r = compare(la, lc)
        print(f"perturbation: blk.0.attn_norm.weight x (1 + {a.perturb:g}) -> logits rel. L2 "
              f"{r['rel']:.2e} (argmax {'same' if r['same'] else 'changed'})", flush=True)
        rows.append(dict(pos=-2, what=f"prefill with blk.0.attn_norm x (1 + {a.perturb:g})", **r))
        if a.positions == 0:
            return 0
    t = int(la.argmax())
    for p in range(a.positions):
        with torch.no_grad():
            ls = m.forward([t], sa, logits="last")[0].float().cpu().numpy()
            blk = m.forward_block([t] * a.block, sb)
            lr = np.asarray(blk.row(0), np.float32)
            blk.commit(1)
        rows.append(dict(pos=p, what=f"step vs block row 0 (M = {a.block})", **compare(ls, lr)))
        t = int(ls.argmax())
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "spec_exact.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"{'pos':>4} {'rel L2':>9} {'max |d|':>9} {'|logit|max':>10} {'top1-top2':>9}  same")
    for r in rows:
        print(f"{r['pos']:4d} {r['rel']:9.2e} {r['max_abs']:9.2e} {r['scale']:10.3f} {r['gap']:9.2e}  "
              f"{r['same']}" + ("" if r["same"] else f" ({r['argmax_a']} vs {r['argmax_b']})"))
    pos = [r for r in rows if r["pos"] >= 0]       # step vs block rows only
    flips = [r for r in pos if not r["same"]]
    print(f"argmax flips: {len(flips)} of {len(pos)}; median rel diff "
          f"{np.median([r['rel'] for r in pos]):.2e}; median top1-top2 gap "
          f"{np.median([r['gap'] for r in pos]):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
