#!/usr/bin/env python3
"""Registers / spills of every tensor-core skinny-GEMM instantiation tf_mma<M, NT> (gemv_mma.cuh),
compiled offline with nvcc -cubin -Xptxas -v (no GPU needed).

    python3 scripts/gemv_mma_report.py [--arch sm_90] [--nvcc /usr/local/cuda/bin/nvcc]

Exit status 1 when any instantiation spills.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tightfit.kernels.gemv_mma import KERNELS, compile_report  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvcc", default=None)
    a = ap.parse_args()
    rows = compile_report(a.arch, nvcc=a.nvcc)
    by: dict[tuple[str, int], dict[tuple[int, int], dict]] = {}
    for r in rows:
        by.setdefault((r["format"], r["type"]), {})[(r["nt"], r["rt"])] = r
    keys = list(KERNELS)
    print(f"{'format':10s} {'type':>4s} " + " ".join(f"{f'NT={nt} RT={rt}':>14s}" for nt, rt in keys)
          + "   registers, *spill bytes, smem (NT: 8-column B tiles, RT: 16-row tiles per warp)")
    bad = 0
    for (f, t), d in sorted(by.items(), key=lambda kv: kv[0][1]):
        cells = []
        for key in keys:
            r = d.get(key)
            if r is None:
                cells.append(f"{'-':>14s}")
                continue
            sp = r["spill_stores"] + r["spill_loads"]
            bad += sp > 0
            cells.append(f"{r['regs']:>5d}{('*' + str(sp)) if sp else '':>4s} {r['smem']:>4d}")
        print(f"{f:10s} {t:>4d} " + " ".join(cells))
    print(f"{len(rows)} instantiations, {bad} with spills ({a.arch})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
