"""`tightfit detokenize`: print the text of token ids.

    tightfit detokenize -m model.gguf 9707 1879       ->  Hello world
    tightfit detokenize -m model.gguf "[9707, 1879]"  (a JSON list, or comma-separated ids, work too)

Control tokens are printed as their text unless `--no-special`. Bytes that are not valid UTF-8 on
their own (ids cut inside a character) print as U+FFFD. An id outside the vocabulary is an error.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from tightfit.commands.tokenize import add_tokenizer_model_arg, load_tokenizer
from tightfit.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("detokenize", help="print the text of token ids")
    add_tokenizer_model_arg(p)
    p.add_argument("ids", nargs="*", help="token ids (space/comma separated or a JSON list)")
    p.add_argument("--stdin", action="store_true", help="read the ids from standard input")
    p.add_argument("--no-special", action="store_true", help="omit control tokens")
    p.add_argument("-n", "--no-newline", action="store_true", help="no newline after the text")
    p.set_defaults(func=main)


def parse_ids(words: list[str]) -> list[int]:
    text = " ".join(words).strip()
    if text.startswith("["):
        try:
            ids = json.loads(text)
        except ValueError:
            raise UserError(f"not a JSON list of ids: {text[:60]!r}") from None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                 for i in ids):
            raise UserError("the JSON list must hold integers only")
        return ids
    out = []
    for w in re.split(r"[\s,]+", text):
        if not w:
            continue
        try:
            out.append(int(w))
        except ValueError:
            raise UserError(f"not a token id: {w!r}") from None
    return out


def main(a: argparse.Namespace) -> int:
    words = list(a.ids)
    if a.stdin:
        words.append(sys.stdin.read())
    ids = parse_ids(words)
    if not ids:
        raise UserError("no token ids given")
    tok = load_tokenizer(a)
    text = tok.decode(ids, special=not a.no_special)
    sys.stdout.write(text if a.no_newline else text + "\n")
    return 0
