"""`tightfit plan`: the VRAM bill of a model at a context length, and where every row will live.

Reads a GGUF header only (or a named preset), never the weights. Exit 0 when it fits, 2 when it
does not (the whole bill and what would fit are printed first).
"""
from __future__ import annotations

import argparse
import json
import sys

from tightfit.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    import tightfit.kvquant  # noqa: F401  registers the quantized KV formats (tq2/tq3/tq4, mixes)
    from tightfit.plan.budget import KV_FORMATS
    from tightfit.plan.placement import PRESETS
    p = sub.add_parser("plan", help="VRAM bill and placement for a model and context",
                       description=__doc__)
    p.add_argument("model", nargs="?", help="GGUF file (header only is read)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="plan a named geometry + quant mix")
    p.add_argument("--ctx", type=int, default=8192, help="context length in tokens (default 8192)")
    p.add_argument("--vram", help="available device memory, e.g. 16GiB, 7.6GB, 7600MiB or bytes "
                                  "(default: free memory of the CUDA device after context creation)")
    p.add_argument("--kv-type", default="f16", choices=sorted(KV_FORMATS), help="KV cache format")
    p.add_argument("--batch", type=int, default=1, help="decode width (speculative verify)")
    p.add_argument("--host-embd", default="auto", choices=["auto", "yes", "no"],
                   help="keep the embedding table on the host (auto: only when short)")
    p.add_argument("--no-split", dest="split", action="store_false",
                   help="never split matrices between device and host")
    p.add_argument("--mtp", action="store_true",
                   help="price the MTP drafter (serve --spec ...,mtp): its block's weights, KV "
                        "cache and scratch; the whole model must then fit on the GPU")
    p.add_argument("--prefill-chunk", type=int, default=512, help="tokens per prefill step")
    p.add_argument("--reserve", help="override the safety reserve (size)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def device_free_bytes() -> int:
    """Real free memory of CUDA device 0, measured after the context exists (the context itself
    costs a few hundred MiB that the card's nominal size does not tell)."""
    import torch
    if not torch.cuda.is_available():
        raise UserError("no CUDA device found; pass --vram SIZE to plan for a device")
    torch.cuda.init()
    free, _total = torch.cuda.mem_get_info()
    return int(free)


def run(args: argparse.Namespace) -> int:
    from tightfit.plan.budget import PlanOptions, parse_size, plan_model, require_fit
    from tightfit.plan.placement import load_inventory

    inv = load_inventory(args.model, args.preset)
    available = parse_size(args.vram) if args.vram else device_free_bytes()
    opts = PlanOptions(ctx=args.ctx, available=available, kv_type=args.kv_type, batch=args.batch,
                       host_embd=args.host_embd, split=args.split, include_mtp=args.mtp,
                       prefill_chunk=args.prefill_chunk,
                       reserve=parse_size(args.reserve) if args.reserve else None)
    plan = plan_model(inv, opts)
    if args.json:
        json.dump(plan.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print_plan(plan)
    require_fit(plan)   # raises PlanError (exit 2) after the bill has been shown
    return 0


def print_plan(plan) -> None:
    from rich.console import Console
    from rich.table import Table
    from tightfit.plan.budget import fmt_bytes

    con = Console()
    o = plan.options
    t = Table(title=f"tightfit plan: {plan.inventory.source}  ctx={o.ctx}  kv={o.kv_type}  "
                    f"batch={o.batch}")
    t.add_column("line")
    t.add_column("bytes", justify="right")
    t.add_column("", justify="right")
    t.add_column("formula", style="dim")
    for l in plan.lines:
        t.add_row(l.label, f"{l.bytes:,}", fmt_bytes(l.bytes), l.formula)
    t.add_section()
    t.add_row("[bold]total[/bold]", f"{plan.total_bytes:,}", fmt_bytes(plan.total_bytes), "")
    t.add_row("available", f"{plan.available_bytes:,}", fmt_bytes(plan.available_bytes), "")
    con.print(t)
    s = plan.placement.summary(plan.inventory.tensors)
    con.print(f"host embedding: {'yes' if plan.host_embd else 'no'};  weights on host: "
              f"{fmt_bytes(plan.host_weights_bytes)} in {len(s['host'])} tensors;  "
              f"excluded (MTP): {len(s['excluded'])} tensors")
    for h in s["host"][:12]:
        con.print(f"  host rows {h['host_rows'][0]}..{h['host_rows'][1]} of {h['tensor']} "
                  f"({h['type']}, {fmt_bytes(h['host_bytes'])})")
    if len(s["host"]) > 12:
        con.print(f"  ... and {len(s['host']) - 12} more (see --json)")
    for n in plan.notes:
        con.print(f"note: {n}")
    if plan.fits:
        con.print(f"[green]fits[/green]: {fmt_bytes(plan.available_bytes - plan.total_bytes)} to "
                  f"spare; largest ctx with this placement {plan.max_ctx_same_placement}, with more "
                  f"rows on the host {plan.max_ctx_that_fits}")
    else:
        w = plan.would_fit or {}
        con.print(f"[red]does not fit[/red]: {fmt_bytes(plan.total_bytes - plan.available_bytes)} "
                  f"over. Largest ctx that fits: {w.get('max_ctx', 0)}")
        if w.get("max_ctx_with_moves", 0) > w.get("max_ctx", 0):
            con.print(f"largest ctx with --host-embd auto and row splits: {w['max_ctx_with_moves']}")
        if w.get("move_to_host"):
            con.print(f"at ctx {o.ctx}, moving {fmt_bytes(w['move_to_host_bytes'])} of rows of "
                      f"{len(w['move_to_host'])} matrices to the host would fit "
                      f"(--host-embd auto, without --no-split)")
