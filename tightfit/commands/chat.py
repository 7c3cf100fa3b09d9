"""`tightfit chat`: interactive multi-turn chat with the model's own template, streaming.
Uses the same Session (and prompt cache) as the server, so turn N prefills only its new tokens."""
from __future__ import annotations

import argparse
import sys

from tightfit.commands.common import (add_model_args, add_sampling_args, add_spec_args, load_from_args,
                                      sampling_from_args, spec_drafters, spec_load_kwargs, spec_summary,
                                      wrap_speculative)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="interactive chat (type /exit to quit)")
    add_model_args(p)
    p.add_argument("-sys", "--system-prompt", default=None, help="system message")
    p.add_argument("-n", "--n-predict", type=int, default=512, help="max tokens per reply (default 512)")
    p.add_argument("--no-think", action="store_true", help="render the template with enable_thinking=false")
    add_sampling_args(p)
    add_spec_args(p)
    p.set_defaults(func=main)


def main(a: argparse.Namespace) -> int:
    from tightfit.runtime.session import Session

    sampling = sampling_from_args(a)
    drafters = spec_drafters(a)
    eng = wrap_speculative(load_from_args(a, **spec_load_kwargs(a, drafters)), a, drafters)
    session = Session(eng)
    messages: list[dict] = []
    if a.system_prompt:
        messages.append({"role": "system", "content": a.system_prompt})
    kwargs = {"enable_thinking": False} if a.no_think else {}
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            sys.stdout.write("\n> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            break
        line = line.rstrip("\n")
        if line.strip() in ("/exit", "/quit"):
            break
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        text, last = [], None
        for ev in session.chat(messages, chat_template_kwargs=kwargs, max_tokens=a.n_predict, sampling=sampling):
            sys.stdout.write(ev.text)
            sys.stdout.flush()
            text.append(ev.text)
            last = ev
        sys.stdout.write("\n")
        t = last.timings
        print(f"[{t.cache_n} cached + {t.prompt_n} prompt tokens, {t.predicted_n} generated, "
              f"{t.as_dict()['predicted_per_second']:.1f} tok/s]", file=sys.stderr)
        spec = spec_summary(t)
        if spec is not None:
            print(f"[{spec}]", file=sys.stderr)
        messages.append({"role": "assistant", "content": "".join(text)})
    return 0
