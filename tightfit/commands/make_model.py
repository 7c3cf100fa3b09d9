"""`tightfit make-model OUT`: write a synthetic qwen35 GGUF with random weights.

Examples:
  tightfit make-model tiny.gguf                                 # tiny geometry, F32, small vocab
  tightfit make-model q4k.gguf --preset small --qtype Q4_K --f32-twin q4k.f32.gguf
  tightfit make-model bench.gguf --preset qwen3.8-27b-seedmix --mtp   # the 16 GB benchmark file
  tightfit make-model slice.gguf --preset qwen3.8-27b-seedmix --layers 4
  tightfit make-model copy.gguf --preset qwen3.8-27b-seedmix --copycat   # continues text by copying
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from tightfit.errors import UserError


def register(subparsers: Any) -> None:
    from tightfit.model import presets

    p = subparsers.add_parser(
        "make-model", help="write a synthetic qwen35 GGUF (random weights) for tests and benchmarks",
        description="Write a synthetic qwen35 GGUF with random but sane weights. Same arguments give "
                    "the same bytes.", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--preset", default="tiny", choices=sorted(presets.GEOMETRIES),
                   help="geometry (default tiny); qwen3.8-27b-seedmix defaults to --mix seedmix --vocab real")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--qtype", help="one GGML type for every matrix (vectors stay F32), e.g. Q4_K")
    g.add_argument("--mix", choices=sorted(presets.MIXES), help="a per-tensor quant recipe")
    p.add_argument("--vocab", default=None, help="small:N (first N-3 tokens of the Qwen vocab + 3 "
                   "control tokens) or real (248,320 rows); default small:1000, real for the 27B presets")
    p.add_argument("--mtp", action="store_true", help="add the MTP (nextn) block after the trunk")
    p.add_argument("--tied", action="store_true", help="no output.weight (LM head tied to token_embd)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--layers", type=int, default=None, help="trunk layers (slice the preset's geometry)")
    p.add_argument("--f32-twin", default=None, metavar="PATH",
                   help="also write the exact F32 dequantization of every tensor to PATH")
    p.add_argument("-j", "--processes", type=int, default=None, help="worker processes (default: CPUs)")
    p.add_argument("--copycat", action="store_true",
                   help="instead of random weights, a hand-built circuit that continues text by "
                        "copying from its context (same tensors and types; speculative decoding "
                        "benchmarks: the real drafters need text that repeats)")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from tightfit.model.generate import make_model, plan_model

    if a.seed < 0:
        raise UserError("--seed must be >= 0")
    kw = dict(seed=a.seed, qtype=a.qtype, mix=a.mix, vocab=a.vocab, mtp=a.mtp, tied=a.tied, layers=a.layers)
    plan = plan_model(a.preset, **kw)    # validates everything before any file is touched
    if a.copycat:
        from tightfit.model.copycat import Layout, make_copycat
        if a.mtp or a.tied or a.f32_twin:
            raise UserError("--copycat takes none of --mtp, --tied, --f32-twin")
        Layout(plan.cfg)                 # fits this geometry, or a clear error
        t0 = time.time()
        make_copycat(a.out, a.preset, seed=a.seed, qtype=a.qtype, mix=a.mix, vocab=a.vocab,
                     layers=a.layers)
        print(f"wrote {a.out}: copying model, {plan.cfg.n_layer} layers, E={plan.cfg.n_embd}, "
              f"n_vocab={plan.cfg.n_vocab}, {len(plan.tensors)} tensors "
              f"({sum(t.nbytes for t in plan.tensors) / 1e6:.1f} MB, mostly zero blocks) "
              f"in {time.time() - t0:.1f} s")
        return 0
    total = sum(t.nbytes for t in plan.tensors)
    t0 = time.time()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), transient=False) as prog:
        task = prog.add_task(f"writing {a.out}", total=total)
        make_model(a.out, a.preset, f32_twin_path=a.f32_twin, processes=a.processes,
                   progress=lambda done, _tot: prog.update(task, completed=done), **kw)
    cfg = plan.cfg
    kinds = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(plan.type_bytes().items(), key=lambda x: -x[1]))
    print(f"wrote {a.out}: {cfg.n_layer} layers{' + MTP' if cfg.nextn_layers else ''}, E={cfg.n_embd}, "
          f"n_vocab={cfg.n_vocab}, {len(plan.tensors)} tensors, {total / 1e6:.1f} MB of tensor data "
          f"({kinds}) in {time.time() - t0:.1f} s")
    if a.f32_twin:
        print(f"wrote {a.f32_twin}: exact F32 twin")
    return 0
