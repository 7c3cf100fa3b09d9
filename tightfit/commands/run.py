"""`tightfit run`: complete a prompt, streaming to stdout, speeds on stderr at the end (and with
`--spec` the speculative counters: rounds, drafted and accepted tokens per drafter)."""
from __future__ import annotations

import argparse
import sys

from tightfit.commands.common import (add_model_args, add_sampling_args, add_spec_args, load_from_args,
                                      sampling_from_args, spec_drafters, spec_load_kwargs, spec_summary,
                                      wrap_speculative)
from tightfit.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="generate text from a prompt")
    add_model_args(p)
    p.add_argument("-p", "--prompt", default=None, help="prompt text")
    p.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    p.add_argument("--prompt-ids", default=None, help="the prompt as token ids ('1 2 3' or '1,2,3'), e.g. to replay another engine's input")
    p.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate (default 64; -1 = until the context is full)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")
    p.add_argument("--show-ids", action="store_true", help="print the generated token ids at the end")
    add_sampling_args(p)
    add_spec_args(p)
    p.set_defaults(func=main)


def main(a: argparse.Namespace) -> int:
    if a.prompt_ids is not None:
        try:
            prompt = [int(t) for t in a.prompt_ids.replace(",", " ").split()]
        except ValueError:
            raise UserError(f"--prompt-ids: expected integers, got {a.prompt_ids!r}") from None
    elif a.file:
        try:
            with open(a.file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as e:
            raise UserError(f"cannot read prompt file: {e}") from e
    else:
        prompt = a.prompt if a.prompt is not None else "Hello"
    if len(prompt) == 0:
        raise UserError("the prompt is empty")
    sampling = sampling_from_args(a)
    drafters = spec_drafters(a)
    eng = load_from_args(a, **spec_load_kwargs(a, drafters))
    if a.ignore_eos:      # on the engine itself: a speculative wrapper's loop reads its tokenizer
        eng.tokenizer = _NoEos(eng.tokenizer)
    eng = wrap_speculative(eng, a, drafters)
    max_tokens = None if a.n_predict < 0 else a.n_predict
    last = None
    sys.stdout.write(prompt if isinstance(prompt, str) else eng.tokenizer.decode(prompt))
    for ev in eng.generate(prompt, max_tokens=max_tokens, sampling=sampling, stop=a.stop):
        sys.stdout.write(ev.text)
        sys.stdout.flush()
        last = ev
    sys.stdout.write("\n")
    t = last.timings
    print(f"prompt: {t.prompt_n} tokens, {t.as_dict()['prompt_per_second']:.1f} tok/s | "
          f"generated: {t.predicted_n} tokens, {t.as_dict()['predicted_per_second']:.1f} tok/s | "
          f"finish: {last.finish_reason}", file=sys.stderr)
    spec = spec_summary(t)
    if spec is not None:
        print(spec, file=sys.stderr)
    if a.show_ids:
        print("ids: " + " ".join(map(str, last.tokens)), file=sys.stderr)
    return 0


class _NoEos:
    """Tokenizer view with an empty end-of-generation set (--ignore-eos)."""

    def __init__(self, tok):
        self._tok = tok
        self.eos_ids = ()

    def __getattr__(self, name):
        return getattr(self._tok, name)
