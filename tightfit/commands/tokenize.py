"""`tightfit tokenize`: print the token ids of a text (llama.cpp's `llama-tokenize`, simplified).

    tightfit tokenize -m model.gguf "Hello world"        ->  9707 1879
    tightfit tokenize -m model.gguf --json "Hello"       ->  [9707]
    tightfit tokenize -m model.gguf --pieces "Hello"     ->  9707 'Hello'
    echo text | tightfit tokenize -m model.gguf --stdin

Control tokens written in the text (`<|im_start|>`) are parsed, as `llama-tokenize` does by
default; `--no-parse-special` treats them as plain text. Text is NFC-normalised like Qwen's HF
tokenizer unless `--no-normalize` (llama.cpp does not normalise).
"""
from __future__ import annotations

import argparse
import json
import sys

from tightfit.errors import UserError


def add_tokenizer_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="GGUF file with tokenizer metadata (default: the demo model)")


def load_tokenizer(a: argparse.Namespace, normalize: bool = True):
    from tightfit.tokenizer import from_gguf
    path = a.model
    if not path:
        try:
            from tightfit.model.demo import demo_model_path
        except ImportError:
            raise UserError("no model given (-m MODEL) and the demo model is not available") from None
        path = demo_model_path()
        print(f"tightfit: no -m given; using the demo model {path}", file=sys.stderr)
    return from_gguf(path, normalize=normalize)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenize", help="print the token ids of a text")
    add_tokenizer_model_arg(p)
    p.add_argument("text", nargs="?", help="text to tokenize (or --stdin / -f FILE)")
    p.add_argument("--stdin", action="store_true", help="read the text from standard input")
    p.add_argument("-f", "--file", help="read the text from a file (UTF-8)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.add_argument("--pieces", action="store_true", help="print one 'id piece' pair per line")
    p.add_argument("--no-parse-special", action="store_true",
                   help="treat control-token text like <|im_start|> as plain text")
    p.add_argument("--add-special", action="store_true",
                   help="add BOS/EOS if the vocabulary asks for them (never for Qwen3.5)")
    p.add_argument("--no-normalize", action="store_true", help="skip NFC normalisation (llama.cpp)")
    p.add_argument("--count", action="store_true", help="print only the number of tokens")
    p.set_defaults(func=main)


def _read_text(a: argparse.Namespace) -> str | bytes:
    sources = sum(x is not None and x is not False for x in (a.text, a.file, a.stdin or None))
    if sources != 1:
        raise UserError("give exactly one of: TEXT, --stdin, -f FILE")
    if a.file:
        try:
            with open(a.file, "rb") as f:
                return f.read()                 # bytes: the tokenizer reports bad UTF-8 itself
        except OSError as e:
            raise UserError(f"cannot read {a.file}: {e.strerror or e}") from None
    if a.stdin:
        return sys.stdin.buffer.read()
    return a.text


def main(a: argparse.Namespace) -> int:
    text = _read_text(a)
    tok = load_tokenizer(a, normalize=not a.no_normalize)
    ids = tok.encode(text, add_special=a.add_special, parse_special=not a.no_parse_special)
    if a.count:
        print(len(ids))
    elif a.json:
        print(json.dumps(ids))
    elif a.pieces:
        for i in ids:
            piece = tok.token_to_piece(i)
            shown = piece.decode("utf-8", errors="backslashreplace")
            print(f"{i:>7} {shown!r}")
    else:
        print(" ".join(map(str, ids)))
    return 0
