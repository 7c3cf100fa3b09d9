"""A few plain launches of one GEMV implementation for Nsight Compute (no graph, no timing).

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:gemv -c 4 \
        python3 bench/ncu_gemv.py --impl v2n1p --types Q4_K,IQ4_XS --shape 5120,17408

Random valid blocks as bench/gemv.py makes them; each type launches twice (the first is the
compile/warm-up launch, profile the second with ncu's --launch-skip or read both).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gemv import rand_weights, call, planar_impl  # noqa: E402
from tightfit.kernels.gemv import type_id  # noqa: E402
from tightfit.kernels.gemv2_layout import relayout_torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="v2n1p")
    ap.add_argument("--types", default="Q4_K,IQ4_XS")
    ap.add_argument("--shape", default="5120,17408")
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--config", default="")
    a = ap.parse_args()
    n_in, n_out = (int(v) for v in a.shape.split(","))
    cfg = json.loads(a.config) if a.config else None
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in a.types.split(","):
        t = type_id(name)
        w = rand_weights(t, n_out, n_in, gen)
        if planar_impl(a.impl):
            w = relayout_torch(w, t)
        x = torch.randn(a.n, n_in, device="cuda", generator=gen)
        out = torch.empty(a.n, n_out, device="cuda")
        for _ in range(2):
            call(a.impl, x, w, t, n_out, n_in, out, cfg)
        torch.cuda.synchronize()
        print(name, "ok", float(out.abs().mean()))


if __name__ == "__main__":
    main()
