"""Offline SASS counts of GEMV v3 (gemv3.py), with gemv2_sass's method: Triton's bundled ptxas
for sm_90a, the launch's specialization (16-byte aligned pointers, 16-divisible n_out and plane
starts), main K loop = the largest backward branch, warp instructions x warps / weights per
iteration (R rows x W lanes x weights per 16-byte chunk). Also reports the global load widths
inside the loop (LDG.E.128 = the 16-byte weight / activation vectors) and whether shared memory
or barriers appear in the loop (a layout conversion Triton inserted).

  python3 -m tightfit.kernels.gemv3_sass                 # default configs, N = 1, 2
  python3 -m tightfit.kernels.gemv3_sass --configs '[{"R":8,"W":32,"num_warps":4}]'
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter

from tightfit.kernels.gemv2_sass import compile_sass, parse, main_loop, classify
from tightfit.kernels.gemv3 import gemv3_kernel, pick_config3, kernel_args, WPC, SIG

# shape name -> (n_in, n_out)
SHAPES = {"5120->17408": (5120, 17408), "17408->5120": (17408, 5120)}


def loads(body) -> Counter:
    """LDG opcodes of a loop body by width suffix (LDG.E.128, LDG.E, LDG.E.U16, ...)."""
    c = Counter()
    for _, op, _ in body:
        if op.startswith("LDG"):
            c[op] += 1
    return c


def case(qtype: int, n: int, n_in: int, n_out: int, cfg: dict | None = None) -> dict:
    nb = n_in // 256
    c = dict(pick_config3(qtype, n, n_out, nb))
    c.update(cfg or {})
    const = dict(kernel_args(qtype, n, nb, c), EMU=False)
    sass, regs, shared = compile_sass(gemv3_kernel, SIG, const, c["num_warps"])
    body = main_loop(parse(sass))
    cls = classify(body)
    wpi = c["R"] * c["W"] * WPC[qtype]
    per_w = {k: v * c["num_warps"] / wpi for k, v in cls.items()}
    smem_loop = sum(1 for _, op, _ in body if re.match(r"(LDS|STS|BAR)", op))
    return {"cfg": c, "counts": dict(cls), "per_weight": per_w, "loads": dict(loads(body)),
            "regs": regs, "shared": shared, "smem_in_loop": smem_loop}


def main():
    from tightfit.kernels.gemv import type_name
    cfgs = [None]
    if "--configs" in sys.argv:
        cfgs = json.loads(sys.argv[sys.argv.index("--configs") + 1])
    types = (23, 12, 13, 14, 11, 8)
    print("| type | shape | N | config | instr/weight | dp4a | ldg | int | prmt | fp | cvt | "
          "regs | loop LDGs | smem in loop |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t in types:
        for sname, (k, m) in SHAPES.items():
            for n in (1, 2):
                for cfg in cfgs:
                    r = case(t, n, k, m, cfg)
                    p = r["per_weight"]
                    f = " | ".join(f"{p.get(x, 0):.4f}" for x in ("total", "dp4a", "ldg", "int",
                                                                  "prmt", "fp", "cvt"))
                    c = r["cfg"]
                    cs = f"R{c['R']}/W{c['W']}/S{c['SPLIT']}/{c['num_warps']}w"
                    ld = ", ".join(f"{v}x {k}" for k, v in sorted(r["loads"].items()))
                    print(f"| {type_name(t)} | {sname} | {n} | {cs} | {f} | {r['regs']} | "
                          f"{ld} | {r['smem_in_loop']} |", flush=True)


if __name__ == "__main__":
    main()
