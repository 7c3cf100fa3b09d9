"""Arguments shared by the generating commands (llama.cpp's names where they exist)."""
from __future__ import annotations

import argparse

from tightfit.runtime.sampler import SamplingParams


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="qwen35 GGUF file (default: the built-in random demo model)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size in tokens (default 4096)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--kv-type", "-ctk", default="f16", type=str.lower, metavar="TYPE",
                   help="KV cache type: f16 (default, as llama.cpp), f32, or quantized (CPU path): "
                        "q8_0, tq4, tq3, tq2, tq4_128, tq3_128, or <k>+<v> such as q8_0+tq3")
    p.add_argument("--vram", default=None, metavar="SIZE|auto",
                   help="GPU memory budget for --device cuda (e.g. 16GiB, 7.6GB, auto = what the "
                        "device reports free): weights go into one arena planned to fit, the rest "
                        "stays on the host (see `tightfit plan`)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: torch's choice)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    d = SamplingParams()
    p.add_argument("--temp", type=float, default=d.temperature, help=f"temperature; 0 = greedy (default {d.temperature})")
    p.add_argument("--top-k", type=int, default=d.top_k, help=f"top-k, 0 = off (default {d.top_k})")
    p.add_argument("--top-p", type=float, default=d.top_p, help=f"top-p, 1 = off (default {d.top_p})")
    p.add_argument("--min-p", type=float, default=d.min_p, help=f"min-p, 0 = off (default {d.min_p})")
    p.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty)
    p.add_argument("--repeat-last-n", type=int, default=d.repeat_last_n)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("-s", "--seed", type=int, default=None, help="RNG seed (default: random)")


def sampling_from_args(a: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                          repeat_penalty=a.repeat_penalty, repeat_last_n=a.repeat_last_n,
                          presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty,
                          seed=a.seed).validate()


def resolve_model(a: argparse.Namespace) -> str:
    if a.model:
        return a.model
    import sys

    from tightfit.model.demo import demo_model_path
    path = demo_model_path()
    print(f"tightfit: no -m given; using the built-in demo model {path} (RANDOM weights: its text is "
          f"gibberish; it only shows the engine working)", file=sys.stderr)
    return str(path)


def add_spec_args(p: argparse.ArgumentParser, shared_cache: bool = False) -> None:
    """Speculative decoding (llama-server's --draft-max; drafters by name, no draft model)."""
    p.add_argument("--spec", default=None, metavar="DRAFTERS",
                   help="speculative decoding with these drafters, comma-separated: ngram, suffix, "
                        "mtp (the model's own MTP head)"
                        + ("; the suffix cache is shared by all requests" if shared_cache else ""))
    p.add_argument("--draft-max", type=int, default=8, metavar="N",
                   help="with --spec: most drafted tokens per verify round (default 8)")
    p.add_argument("--draft-mtp", type=int, default=3, metavar="N",
                   help="with --spec mtp: most tokens the MTP head drafts per round (default 3)")


def spec_drafters(a: argparse.Namespace) -> tuple[str, ...] | None:
    """--spec's drafters, checked before anything loads (None: no speculation)."""
    if a.spec is None:
        return None
    from tightfit.errors import UserError
    from tightfit.runtime.spec import parse_drafters
    drafters = parse_drafters(a.spec)
    if a.draft_max < 1:
        raise UserError(f"--draft-max must be >= 1, got {a.draft_max}")
    if a.draft_mtp < 1:
        raise UserError(f"--draft-mtp must be >= 1, got {a.draft_mtp}")
    return drafters


def spec_load_kwargs(a: argparse.Namespace, drafters: tuple[str, ...] | None) -> dict:
    """load_from_args' mtp / batch for these drafters: the GPU executor holds the MTP block only
    when asked (its plan then prices it; the CPU model's drafter dequantizes the block itself), and
    a verify block is the last token + up to --draft-max drafts."""
    if drafters is None:
        return {}
    return {"mtp": "mtp" in drafters and a.device.startswith("cuda"), "batch": a.draft_max + 1}


def wrap_speculative(engine, a: argparse.Namespace, drafters: tuple[str, ...] | None):
    """`engine` as is without --spec, else a SpeculativeEngine with those drafters."""
    if drafters is None:
        return engine
    from tightfit.runtime.spec import build_speculative
    return build_speculative(engine, drafters, max_draft=a.draft_max, mtp_draft=a.draft_mtp)


def spec_summary(timings) -> str | None:
    """One line of a speculative run's counters (llama.cpp's n_drafted / n_accept / accept %),
    None for a plain run."""
    d = getattr(timings, "spec_dict", None)
    if d is None:
        return None
    d = d()
    per = ", ".join(f"{k} {v['draft_n_accepted']}/{v['draft_n']}" for k, v in d["drafters"].items())
    rate = f"{100.0 * d['draft_acceptance']:.1f} %" if d["draft_n"] else "-"
    return (f"speculative: {d['spec_rounds']} rounds, {d['draft_rounds']} with a draft | drafted "
            f"{d['draft_n']}, accepted {d['draft_n_accepted']} ({rate})" + (f" | {per}" if per else ""))


def load_from_args(a: argparse.Namespace, path: str | None = None, mtp: bool = False,
                   batch: int = 1):
    """The engine the model arguments describe (every generating command loads through here).
    `mtp`: load the MTP block for the MTP drafter too (serve --spec ...,mtp; see load_engine);
    `batch`: the largest speculative verify block (with --vram the plan prices its buffers)."""
    from tightfit.runtime.loader import load_engine
    if a.threads:
        import torch
        torch.set_num_threads(a.threads)
    kw = {"vram": a.vram} if getattr(a, "vram", None) else {}
    if mtp:
        kw["mtp"] = True
    if batch > 1 and getattr(a, "vram", None):
        kw["batch"] = int(batch)
    return load_engine(path or resolve_model(a), device=a.device, n_ctx=a.ctx_size, kv_type=a.kv_type, **kw)
