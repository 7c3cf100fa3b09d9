"""`tightfit prune-vocab MODEL OUT`: remove tokens of other scripts (and optionally rare Latin
leaf tokens) from the vocabulary, with their rows of token_embd/output. Text in the kept scripts
tokenizes exactly as before (unless --drop-rare-latin); any text still encodes (byte tokens stay).
The file records `tightfit.vocab.original_ids` (new id -> original id).

    tightfit prune-vocab model.gguf model-zh-en.gguf --keep-scripts Han,Latin,Common
    tightfit prune-vocab model.gguf small.gguf --keep-scripts Han,Latin,Common --drop-rare-latin 15000
"""
from __future__ import annotations

import argparse

from tightfit.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune-vocab", help="drop tokens of other scripts from a model's vocabulary",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="input GGUF")
    p.add_argument("out", help="output GGUF (a new path)")
    p.add_argument("--keep-scripts", default="Han,Latin,Common",
                   help="comma-separated Unicode scripts to keep (default: Han,Latin,Common)")
    p.add_argument("--drop-rare-latin", type=int, default=0, metavar="N",
                   help="also drop the N rarest Latin-script tokens that are merge-graph leaves")
    p.add_argument("--keep-unused", action="store_true", help="keep UNUSED padding rows ([PAD…])")
    p.set_defaults(func=main)


def main(a: argparse.Namespace) -> int:
    from tightfit.tools.prune_vocab import prune_file
    if a.drop_rare_latin < 0:
        raise UserError(f"--drop-rare-latin must be >= 0, got {a.drop_rare_latin}")
    scripts = [s.strip() for s in a.keep_scripts.split(",") if s.strip()]
    rep = prune_file(a.model, a.out, keep_scripts=scripts, drop_rare_latin=a.drop_rare_latin,
                     keep_unused=a.keep_unused)
    for line in rep.lines():
        print(line)
    return 0
