"""Offline register / occupancy report of the GEMV v2 small-N kernel (gemv2s_kernel), no GPU.

Compiles gemv2s_kernel for sm_90 with the running interpreter's Triton (run it under the
device's Triton 3.6: /tmp/tri36/bin/python) and the specialization a real launch gives
(gemv2_sass.compile_sass: 16-byte aligned pointers, 16-divisible n_out / plane starts), and
reports registers per thread, spills (LDL/STL in the SASS, LOCAL bytes), shared memory, and the
theoretical blocks/SM and warps/SM on an H200 (65,536 registers/SM allocated per warp in units
of 256, 64 warps/SM, 32 blocks/SM, 228 KB shared memory with 1 KB reserved per block).
Also: the lanes x warps layout of the weight-tile load (threadsPerWarp / warpsPerCTA of the
first 5- or 6-D tt.load; the intended layout has all lanes on the R and KB dims), and
shared-memory instructions / BAR inside the main K loop (a layout conversion there).

  PYTHONPATH=. /tmp/tri36/bin/python -m tightfit.kernels.gemv_regs              # table, defaults
  PYTHONPATH=. /tmp/tri36/bin/python -m tightfit.kernels.gemv_regs --fmt 13 --n 1 \\
      --configs '[{"R":64,"KB":2,"num_warps":4}]' [--planar]
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import triton

REGS_PER_SM = 65536
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED = 1024            # per block (CUDA runtime reservation on sm_8x/9x)
FMTS = {23: "IQ4_XS", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 11: "Q3_K", 8: "Q8_0"}


def occupancy(regs: int, num_warps: int, shared: int) -> dict:
    """Theoretical blocks and warps per SM of sm_90 for a kernel of `regs` registers/thread."""
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = REGS_PER_SM // (per_warp * num_warps)
    by_warps = WARPS_PER_SM // num_warps
    by_smem = SMEM_PER_SM // (shared + SMEM_RESERVED) if shared else BLOCKS_PER_SM
    blocks = min(by_regs, by_warps, by_smem, BLOCKS_PER_SM)
    return {"blocks": blocks, "warps": blocks * num_warps, "by_regs": by_regs,
            "occ": blocks * num_warps / WARPS_PER_SM}


def _ttgir_layout(ttgir: str) -> str:
    """threadsPerWarp/warpsPerCTA of the layout of the first >= 5-D load (the weight tile)."""
    for m in re.finditer(r"tt\.load %\S+ : tensor<((?:\d+x){4,})!tt\.ptr<\w+>, #(\w+)>", ttgir):
        name = m.group(2)
        d = re.search(rf"^#{name} = (.*)$", ttgir, re.M)
        if not d:
            return name
        s = d.group(1)
        t = re.search(r"threadsPerWarp = \[([^\]]*)\]", s)
        w = re.search(r"warpsPerCTA = \[([^\]]*)\]", s)
        if t and w:
            return f"lanes[{t.group(1).replace(' ', '')}] warps[{w.group(1).replace(' ', '')}]"
        return "linear"
    return "?"


def report(fmt: int, n: int, cfg: dict, planar: bool = False) -> dict:
    """Compile gemv2s_kernel for one (FMT, PLANAR, NC, config) and count."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from tightfit.kernels import gemv2_sass as S
    from tightfit.kernels.gemv2_small import gemv2s_kernel, SIG
    const = dict(FMT=fmt, PLANAR=bool(planar), NC=n, R=cfg["R"], KB=cfg["KB"],
                 SPLIT=cfg.get("SPLIT", 1), EMU=False, U=cfg.get("U", 1))
    nw, ns = cfg.get("num_warps", 4), cfg.get("num_stages", 3)
    extra = {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}
    sass, regs, shared = S.compile_sass(gemv2s_kernel, SIG, const, nw, ns, extra)
    # the TTGIR of the same (cached) compile
    s = dict(SIG)
    for k in const:
        s[k] = "constexpr"
    attrs = {(gemv2s_kernel.arg_names.index(k),): [["tt.divisibility", 16]]
             for k, v in SIG.items() if v.startswith("*") or k in S.ALIGNED_INTS}
    k = triton.compile(ASTSource(gemv2s_kernel, s, constexprs=dict(const), attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=nw, num_stages=ns, **extra))
    ins = S.parse(sass)
    loop = S.main_loop(ins)
    spill = sum(1 for _, op, _ in ins if op.startswith(("LDL", "STL")))
    smem_loop = sum(1 for _, op, _ in loop if op.split(".")[0] in ("LDS", "STS", "BAR"))
    occ = occupancy(regs or 0, nw, shared)
    return {"fmt": FMTS.get(fmt, fmt), "N": n, "planar": planar, "cfg": cfg, "regs": regs,
            "spill_ins": spill, "shared": shared, "smem_in_loop": smem_loop,
            "loop_ins": len(loop), "layout": _ttgir_layout(k.asm["ttgir"]), **occ}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", type=int, action="append")
    ap.add_argument("--n", type=int, action="append")
    ap.add_argument("--planar", action="store_true")
    ap.add_argument("--configs", default=None, help="JSON list of configs (default: "
                    "pick_config_small's at 5120->17408)")
    a = ap.parse_args(argv)
    from tightfit.kernels.gemv2_small import pick_config_small
    fmts = a.fmt or [23, 12, 13, 14, 11, 8]
    ns = a.n or [1, 2]
    print(f"Triton {triton.__version__}")
    print("| type | N | config | regs | spill | smem | smem in loop | blocks/SM | warps/SM | "
          "loop ins | weight-tile layout |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t in fmts:
        for n in ns:
            cfgs = json.loads(a.configs) if a.configs else [pick_config_small(t, n, 17408, 20)]
            for c in cfgs:
                c = {k: v for k, v in c.items() if v is not None}
                c.setdefault("num_warps", 4)
                c.setdefault("R", 64)
                c.setdefault("KB", 2)
                r = report(t, n, c, a.planar)
                cs = "/".join(f"{k}{v}" for k, v in c.items())
                print(f"| {r['fmt']} | {n} | {cs} | {r['regs']} | {r['spill_ins']} | "
                      f"{r['shared']} | {r['smem_in_loop']} | {r['blocks']} | {r['warps']} | "
                      f"{r['loop_ins']} | {r['layout']} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
