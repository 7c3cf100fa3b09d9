#!/usr/bin/env python3
"""Registers / spills of every CUDA GEMV instantiation (nvcc -cubin -Xptxas -v, offline, no GPU).

    python3 scripts/cuda_gemv_report.py [--arch sm_90] [--main-only] [--kern auto|v2|v2h|v3|v4]

"auto" (the default kernel choice) reports each module it launches: v2h and v3.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tightfit.kernels.gemv_cuda import _kern, compile_report, module_kerns  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--main-only", action="store_true", help="leave out gemv_fmt_lowbit.cuh")
    ap.add_argument("--kern", default=None, help="kernel variant (default: TIGHTFIT_CU_GEMV or auto)")
    ap.add_argument("--formats", default="", help="comma list of struct names, e.g. F_Q4_K,F_Q6_K")
    a = ap.parse_args()
    bad = 0
    for kern in module_kerns(_kern({"kern": a.kern} if a.kern else None)):
        bad += report(a, kern)
    return 1 if bad else 0


def report(a, kern: str) -> int:
    rows = compile_report(a.arch, lowbit=False if a.main_only else None, kern=kern)
    if a.formats:
        keep = set(a.formats.split(","))
        rows = [r for r in rows if r["format"] in keep]
    by = {}
    for r in rows:
        by.setdefault((r["format"], r["type"]), {})[r["nc"]] = r
    ncs = sorted({r["nc"] for r in rows})
    print(f"{'format':10s} {'type':>4s} " + " ".join(f"{'NC=' + str(n):>8s}" for n in ncs)
          + f"   (registers, *spills)  kern={kern}")
    bad = 0
    for (f, t), d in sorted(by.items(), key=lambda kv: kv[0][1]):
        cells = []
        for n in ncs:
            r = d.get(n)
            if r is None:
                cells.append(f"{'-':>8s}")
                continue
            sp = r["spill_stores"] + r["spill_loads"]
            bad += sp > 0
            cells.append(f"{r['regs']:>5d}{'*' + str(sp) if sp else '':>3s}")
        print(f"{f:10s} {t:>4d} " + " ".join(cells))
    print(f"{len(rows)} instantiations, {bad} with spills")
    return bad


if __name__ == "__main__":
    sys.exit(main())
