"""The verify block's recurrent kernels alone at the 27B's shapes (issue 10): the Gated DeltaNet
delta rule over M tokens (block_step.gdn_block) per (value block BV, warps) configuration, the
causal conv (conv_block) and the partial commit's replay (commit_block), each over 48 layers'
worth of distinct state slots (48 x 3.1 MB, past the L2) replayed from one CUDA graph.

  python3 bench/gdn_block.py [--ms 1,5] [--configs 32,4:16,4:16,2:64,4:32,8] [--out DIR]

Checks every configuration against the default one bitwise (same arithmetic, other tiling).
Prints a table last (us per layer); JSON lines in OUT/gdn_block.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench.gemv import graph_time  # noqa: E402
from tightfit.kernels import block_step as BS  # noqa: E402

N_REC, HK, HV, S, KM1 = 48, 16, 48, 128, 3
CONV = 2 * HK * S + HV * S


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,5")
    ap.add_argument("--configs", default="32,4:16,4:16,2:64,4:32,8:8,1")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    ssm = torch.randn(2, N_REC, HV, S, S, device=dev, generator=g) * 0.1
    conv = torch.randn(2, N_REC, KM1, CONV, device=dev, generator=g)
    cw = torch.randn(CONV, KM1 + 1, device=dev, generator=g)
    dtb, ssma = torch.randn(HV, device=dev, generator=g), -torch.rand(HV, device=dev, generator=g)
    status = torch.tensor([0, 0, 100, 0], dtype=torch.int32, device=dev)
    rows, out = [], []
    for M in (int(x) for x in a.ms.split(",")):
        u = torch.randn(N_REC, M, CONV, device=dev, generator=g)
        y = torch.randn(N_REC, M, CONV, device=dev, generator=g)
        al = torch.randn(N_REC, M, HV, device=dev, generator=g)
        be = torch.randn(N_REC, M, HV, device=dev, generator=g)
        rin = torch.zeros(N_REC, max(1, M - 1), HV, 2 * S + 1, device=dev)
        o = torch.empty(N_REC, M, HV, S, device=dev)
        base = None
        for cfg in a.configs.split(":"):
            bv, nw = (int(v) for v in cfg.split(","))

            def gdn():
                for s in range(N_REC):
                    BS.gdn_block(y[s], al[s], be[s], dtb, ssma, ssm, rin[s], o[s], status, s, HK,
                                 1e-6, BV=bv, num_warps=nw)
            ms = graph_time(gdn)
            gdn()
            torch.cuda.synchronize()
            res = (o.clone(), ssm[1].clone())
            same = base is None or (torch.equal(res[0], base[0]) and torch.equal(res[1], base[1]))
            if base is None:
                base = res
            rows.append((f"gdn M={M} BV={bv} w={nw}", ms * 1000 / N_REC, same))
        yy = torch.empty(M, CONV, device=dev)

        def cv():
            for s in range(N_REC):
                BS.conv_block(u[s], conv, cw, yy, status, s)
        rows.append((f"conv M={M}", graph_time(cv) * 1000 / N_REC, True))
        if M > 1:
            for j in sorted({1, M - 1}):
                s0 = status.clone()

                def commit():
                    BS.commit_block(conv, ssm, u, rin, status, j, M)
                    status.copy_(s0)        # stay on bank 0: every replay the same work
                rows.append((f"commit M={M} j={j} (all layers)", graph_time(commit) * 1000, True))
    for r in rows:
        out.append({"what": r[0], "us": round(r[1], 2), "bitwise_default": r[2]})
    if a.out:
        with open(os.path.join(a.out, "gdn_block.jsonl"), "w") as f:
            for r in out:
                f.write(json.dumps(r) + "\n")
    print(f"{'kernel':40s} {'us':>8s}  same")
    for r in rows:
        print(f"{r[0]:40s} {r[1]:8.2f}  {r[2]}")


if __name__ == "__main__":
    main()
