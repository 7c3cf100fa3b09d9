"""Offline SASS instruction counts of the GEMV v2 kernels (no GPU needed).

Compiles a kernel for sm_90a with Triton's bundled ptxas, disassembles it with the bundled
cuobjdump, finds the main K loop (the largest backward-branch range) and counts its warp
instructions by class. Per-weight figures = loop instructions x warps / weights per iteration
(one warp instruction issues for 32 lanes). Issue budget of an H200 at the copy-bandwidth floor:
132 SMs x 4 schedulers x ~1.7 GHz ~ 0.9e12 warp instructions/s against ~7.4e12 weights/s for a
4.25-bit format at 4.28 TB/s, i.e. ~0.12 warp instructions per weight (all of them, loads,
address math and epilogue included).

  python3 -m tightfit.kernels.gemv2_sass            # table for all v2 formats, N=1 and 8
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import triton

SIG_TC = {"w_ptr": "*u8", "b_ptr": "*i8", "xs_ptr": "*fp32", "xsum_ptr": "*fp32",
          "out_ptr": "*fp32", "N": "i32", "n_out": "i32", "NB": "i32", "P0": "i32", "P1": "i32",
          "P2": "i32", "P3": "i32"}
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
CLASSES = [("mma", ("HMMA", "IMMA", "HGMMA", "IGMMA")), ("dp4a", ("IDP",)),
           ("ldg", ("LDG",)), ("cp.async", ("LDGSTS", "LDGDEPBAR", "DEPBAR")),
           ("smem", ("LDS", "STS", "LDSM", "BAR")), ("shfl", ("SHFL",)),
           ("prmt", ("PRMT",)), ("fp", ("FFMA", "FMUL", "FADD", "FSEL", "FMNMX")),
           ("cvt", ("I2F", "F2I", "F2F", "I2FP", "F2FP", "HADD2")),
           ("int", ("LOP3", "SHF", "IADD3", "IMAD", "LEA", "SEL", "ISETP", "IABS", "SGXT",
                    "BMSK", "IMNMX", "MOV", "FLO", "POPC", "BFE", "BFI", "VIADD", "IADD",
                    "ISCADD", "IMUL", "UIADD3"))]


def _bin(tool: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


# integer arguments a real launch sees as multiples of 16 (n_out = 17408 / 5120 / 1024; the
# planar plane starts; 0 for raw blocks); NB = 20 or 68 is not
ALIGNED_INTS = ("n_out", "P0", "P1", "P2", "P3")


def compile_sass(fn, sig: dict, const: dict, num_warps: int, num_stages: int = 3,
                 extra: dict | None = None):
    """(sass text, n_regs or None, shared bytes) of `fn` compiled for sm_90a, with the
    specialization a launch gives: 16-byte aligned pointers (torch allocations) and the
    16-divisible integers of ALIGNED_INTS. extra: more compile options (e.g. maxnreg)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    s = dict(sig)
    for k in const:
        s[k] = "constexpr"
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items()
             if v.startswith("*") or k in ALIGNED_INTS}
    src = ASTSource(fn, s, constexprs=dict(const), attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages, **(extra or {})))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
        path = f.name
    try:
        sass = subprocess.run([_bin("cuobjdump"), "-sass", path], capture_output=True,
                              text=True, check=True).stdout
        res = subprocess.run([_bin("cuobjdump"), "-res-usage", path], capture_output=True,
                             text=True).stdout
    finally:
        os.unlink(path)
    m = re.search(r"REG:(\d+)", res)
    return sass, (int(m.group(1)) if m else None), k.metadata.shared


def parse(sass: str):
    """[(addr, opcode, operands)] of the first function in `sass`."""
    return [(int(a, 16), op, rest) for a, _, op, rest in _LINE.findall(sass)]


def main_loop(ins):
    """Instructions of the largest backward-branch loop body."""
    best = []
    for i, (addr, op, rest) in enumerate(ins):
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", rest)
            if m and int(m.group(1), 16) < addr:
                tgt = int(m.group(1), 16)
                body = [x for x in ins if tgt <= x[0] <= addr]
                if len(body) > len(best):
                    best = body
    return best


def classify(body) -> Counter:
    c = Counter()
    for _, op, _ in body:
        base = op.split(".")[0]
        for name, prefixes in CLASSES:
            if base.startswith(prefixes):
                c[name] += 1
                break
        else:
            c["other"] += 1
    c["total"] = len(body)
    return c


def count(fn, sig, const, num_warps, weights_per_iter, num_stages=3) -> dict:
    sass, regs, shared = compile_sass(fn, sig, const, num_warps, num_stages)
    c = classify(main_loop(parse(sass)))
    per_w = {k: v * num_warps / weights_per_iter for k, v in c.items()}
    return {"counts": dict(c), "per_weight": per_w, "regs": regs, "shared": shared,
            "all": len(parse(sass))}


def tc_case(qtype: int, n: int, n_out: int = 17408, nb: int = 20, planar: bool = False):
    """Arguments of `count` for the tensor-core kernel as gemv2_prepared launches it."""
    from tightfit.kernels.gemv2 import gemv2_kernel, pick_config2
    from tightfit.kernels.gemv2_act import geometry
    from tightfit.kernels.gemv2_layout import GROUP
    geo = geometry(GROUP[qtype], n)
    cfg = pick_config2(qtype, n, n_out, nb)
    const = dict(FMT=qtype, PLANAR=planar, NP=geo["NP"], S=geo["S"], GPD=geo["GPD"],
                 KDOT=geo["KDOT"], R=cfg["R"], KB=cfg["KB"], SPLIT=cfg["SPLIT"], EMU=False)
    return gemv2_kernel, SIG_TC, const, cfg["num_warps"], cfg["R"] * cfg["KB"] * 256


def small_case(qtype: int, n: int, n_out: int = 17408, nb: int = 20, planar: bool = False):
    """Arguments of `count` for the dp4a small-N kernel (gemv2_small)."""
    from tightfit.kernels.gemv2_small import gemv2s_kernel, pick_config_small, SIG
    cfg = pick_config_small(qtype, n, n_out, nb)
    const = dict(FMT=qtype, PLANAR=planar, NC=n, R=cfg["R"], KB=cfg["KB"],
                 SPLIT=cfg["SPLIT"], EMU=False, U=cfg.get("U", 1))
    return gemv2s_kernel, SIG, const, cfg["num_warps"], cfg["R"] * cfg["KB"] * 256 * const["U"]


def table(types=(23, 12, 13, 14, 11, 8), ns=(1, 2, 8), planar=False, which=("tc", "small")):
    rows = []
    for t in types:
        for n in ns:
            for w in which:
                if (w == "small") != (n <= 2) and n != 1:
                    continue
                fn, sig, const, warps, wpi = (tc_case if w == "tc" else small_case)(
                    t, n, planar=planar)
                r = count(fn, sig, const, warps, wpi)
                rows.append((t, n, w, r))
    return rows


if __name__ == "__main__":
    from tightfit.kernels.gemv import type_name
    planar = "--planar" in sys.argv
    which = tuple(a for a in ("tc", "small") if f"--no-{a}" not in sys.argv)
    print("| type | N | kernel | warp instr/weight | mma | dp4a | ldg | smem | int | fp | cvt | "
          "prmt | shfl | other | regs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t, n, w, r in table(planar=planar, which=which):
        p = r["per_weight"]
        f = [f"{p.get(k, 0):.4f}" for k in ("total", "mma", "dp4a", "ldg", "smem", "int",
                                            "fp", "cvt", "prmt", "shfl", "other")]
        print(f"| {type_name(t)} | {n} | {w} | " + " | ".join(f) + f" | {r['regs']} |",
              flush=True)
