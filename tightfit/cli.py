"""`tightfit` command line. Each subcommand lives in tightfit/commands/<name>.py and exposes
`register(subparsers)`; it sets `func` on its parser. User errors (tightfit.errors.UserError and
its subclasses, e.g. GGUFError) print one line and exit non-zero; they never show a traceback."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# Order shown in --help. A module missing here is simply skipped (lets features land one by one).
COMMANDS = ["run", "chat", "serve", "inspect", "plan", "make_model", "tokenize", "detokenize",
            "repack", "prune_vocab"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tightfit", description="Run qwen35 GGUF models on one small GPU.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"tightfit.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"tightfit.commands.{name}":
                continue
            raise
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from tightfit.errors import UserError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        rc = args.func(args)
    except UserError as e:
        print(f"tightfit {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tightfit ... | head`: the reader left; not an error
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
