"""`tightfit repack MODEL OUT`: store ternary Q2_0/TQ2_0 tensors in tightfit's base-3 T3 types
(5 trits per byte, lossless; tightfit/tools/repack.py documents the format). `--unpack` restores
the original file byte for byte. A repacked file is tightfit-only: llama.cpp cannot read it.

    tightfit repack bonsai-27b-q2_0.gguf bonsai-27b-t3.gguf
    tightfit repack --unpack bonsai-27b-t3.gguf bonsai-27b-q2_0.gguf
"""
from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repack", help="lossless base-3 repacking of ternary tensors (tightfit-only file)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="input GGUF")
    p.add_argument("out", help="output GGUF (a new path)")
    p.add_argument("--unpack", action="store_true", help="restore a repacked file to its original types")
    p.add_argument("-v", "--verbose", action="store_true", help="list every tensor")
    p.set_defaults(func=main)


def main(a: argparse.Namespace) -> int:
    from tightfit.tools.repack import repack_file, unpack_file
    rep = unpack_file(a.model, a.out) if a.unpack else repack_file(a.model, a.out)
    lines = rep.lines()
    for line in lines if a.verbose else lines[-1:]:
        print(line)
    if not a.unpack and not rep.tensors:
        print("tightfit repack: note: no ternary Q2_0/TQ2_0 tensor found; the copy is unchanged",
              file=sys.stderr)
    return 0
