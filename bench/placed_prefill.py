"""Prefill on a placed model (issue 5): host rows multiplied on the CPU vs streamed to the device
through the host-row ring (TIGHTFIT_PLACED_RING=1), same prompt, same engine.

    python3 bench/placed_prefill.py [--vram 8GiB] [--tokens 512,2048] [--path /tmp/seedmix.gguf]

Prints, per prompt length and mode, seconds, tok/s and the last row's logits against the first
mode's (relative L2: the two paths round differently, the ring's device GEMM in bf16). The CPU
mode runs only for prompts of <= 600 tokens (its cost grows with the rows). On the random 27B any
rounding difference shows as ~10 % of the logits (bench/NOTES.md session 11), so the comparison
tells a wrong path (O(1)) from a rounding one, nothing finer.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from spec import build_model, load  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default=None)
    ap.add_argument("--vram", default="8GiB")
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--n-ctx", type=int, default=4096)
    a = ap.parse_args()
    path = build_model(argparse.Namespace(model=None, seedmix=True, path=a.path, mtp=False, layers=None))
    engine = load(path, "cuda", a.n_ctx, vram=a.vram)
    m = engine.model
    print(f"model {path}, {a.vram}: {len(getattr(m, 'hostw', {}))} matrices with host rows, "
          f"prefill chunk {m.batcher().chunk}", flush=True)
    rng = np.random.default_rng(0)
    print(f"{'tokens':>7s} {'mode':>5s} {'s':>8s} {'tok/s':>8s} {'rel L2 vs first':>16s}")
    for n in [int(t) for t in a.tokens.split(",")]:
        ids = rng.integers(0, m.config.n_vocab, n).tolist()
        first = None
        for mode in ("ring", "cpu"):
            os.environ["TIGHTFIT_PLACED_RING"] = "1" if mode == "ring" else "0"
            if mode == "cpu" and n > 600:
                print(f"{n:7d} {mode:>5s} skipped (the CPU path grows with the rows; see 512)")
                continue
            st = engine.new_state()
            st.reset()
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.no_grad():
                lg = m.forward(ids, st, logits="last")[0].float().cpu().numpy()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            rel = 0.0 if first is None else float(np.linalg.norm(lg - first) / np.linalg.norm(first))
            first = lg if first is None else first
            print(f"{n:7d} {mode:>5s} {dt:8.2f} {n / dt:8.1f} {rel:16.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
