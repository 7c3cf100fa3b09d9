"""`tightfit inspect [MODEL] [--json]`: what is in a qwen35 GGUF, without reading tensor data.

Byte shares are of the *trunk* (the tensors the main logits use); the MTP block is listed
separately because it is only loaded for speculation.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from typing import Any

from tightfit.errors import UserError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("inspect", help="show geometry, quant mix and tokenizer of a GGUF",
                              description="Show what a qwen35 GGUF contains (no tensor data is read).")
    p.add_argument("model", nargs="?", help="path to a .gguf file (default: the built-in demo model)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--tensors", action="store_true", help="list every tensor (tables mode)")
    p.set_defaults(func=run)


def _demo_path() -> str:
    try:
        from tightfit.model.demo import demo_model_path  # type: ignore[import-not-found]
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("tightfit"):
            raise UserError("no MODEL given and this build has no demo model; "
                            "pass a path: tightfit inspect MODEL.gguf") from None
        raise
    return str(demo_model_path())


def summarize(mf: Any) -> dict[str, Any]:
    """One JSON-able dict describing an opened ModelFile (tightfit.api.open_model)."""
    cfg, g = mf.config, mf.gguf
    by_type: dict[str, int] = defaultdict(int)
    count_by_type: dict[str, int] = defaultdict(int)
    for t in mf.trunk_tensors.values():
        by_type[t.type_name] += t.nbytes
        count_by_type[t.type_name] += 1
    trunk_bytes = sum(by_type.values())
    md = mf.tokenizer_metadata
    blocks = []
    for il in range(cfg.block_count):
        kind = "mtp" if il >= cfg.n_layer else ("gdn" if cfg.is_recurrent(il) else "attention")
        pre = f"blk.{il}."
        tensors = mf.mtp_tensors if kind == "mtp" else mf.trunk_tensors
        nbytes = sum(t.nbytes for n, t in tensors.items() if n.startswith(pre))
        blocks.append({"index": il, "kind": kind, "bytes": nbytes})
    mtp_bytes = sum(t.nbytes for t in mf.mtp_tensors.values())
    return {
        "path": str(mf.path),
        "file_bytes": g.file_size,
        "gguf_version": g.version,
        "arch": g.architecture,
        "name": g.metadata.get("general.name"),
        "n_layers": cfg.n_layer,
        "n_params": sum(t.n_elements for t in mf.trunk_tensors.values()),
        "geometry": {
            "n_embd": cfg.n_embd, "n_ff": cfg.n_ff, "n_vocab": cfg.n_vocab,
            "n_head": cfg.n_head, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
            "n_rot": cfg.n_rot, "rope_sections": list(cfg.rope_sections),
            "rope_freq_base": cfg.rope_freq_base, "rms_eps": cfg.rms_eps,
            "ssm_conv_kernel": cfg.ssm_conv_kernel, "ssm_state": cfg.ssm_state,
            "ssm_k_heads": cfg.ssm_k_heads, "ssm_v_heads": cfg.ssm_v_heads,
            "ssm_inner": cfg.ssm_inner, "n_ctx_train": cfg.n_ctx_train,
            "gdn_layers": cfg.recurrent_ids, "attention_layers": cfg.attention_ids,
            "tied_output": mf.inventory.tied_output,
            "kv_bytes_per_token_f16": cfg.kv_bytes_per_token(2),
            "recurrent_state_bytes_f32": cfg.recurrent_state_bytes_per_layer(4) * len(cfg.recurrent_ids),
        },
        "trunk_bytes": trunk_bytes,
        "bytes_by_type": dict(sorted(by_type.items(), key=lambda kv: -kv[1])),
        "tensors_by_type": dict(count_by_type),
        "blocks": blocks,
        "mtp_layers": cfg.nextn_layers,
        "mtp": {"layers": list(range(cfg.n_layer, cfg.block_count)), "bytes": mtp_bytes,
                "n_tensors": len(mf.mtp_tensors), "complete": mf.inventory.mtp_complete,
                "missing": mf.inventory.mtp_missing},
        "tensors": [{"name": t.name, "type": t.type_name, "ne": list(t.ne), "bytes": t.nbytes,
                     "offset": t.offset, "mtp": t.name in mf.mtp_tensors}
                    for t in g.tensors.values()],
        "tokenizer": {
            "model": md.get("tokenizer.ggml.model"),
            "pre": md.get("tokenizer.ggml.pre"),
            "n_tokens": len(md.get("tokenizer.ggml.tokens", ())),
            "n_merges": len(md.get("tokenizer.ggml.merges", ())),
            "bos_id": md.get("tokenizer.ggml.bos_token_id"),
            "eos_id": md.get("tokenizer.ggml.eos_token_id"),
            "pad_id": md.get("tokenizer.ggml.padding_token_id"),
            "has_chat_template": bool(md.get("tokenizer.chat_template")),
        },
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 1024:,.1f} KiB"


def _print_tables(s: dict[str, Any], show_tensors: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    geo = s["geometry"]
    t = Table(title=f"{s['path']}  ({_mib(s['file_bytes'])}, GGUF v{s['gguf_version']})",
              show_header=False, title_justify="left")
    t.add_column("key", style="bold")
    t.add_column("value")
    t.add_row("architecture", str(s["arch"]) + (f"  ({s['name']})" if s["name"] else ""))
    t.add_row("trunk layers", f"{s['n_layers']}  ({len(geo['gdn_layers'])} Gated DeltaNet, "
              f"{len(geo['attention_layers'])} full attention)")
    t.add_row("parameters", f"{s['n_params']:,} (trunk)")
    t.add_row("hidden / ffn / vocab", f"{geo['n_embd']} / {geo['n_ff']} / {geo['n_vocab']}")
    t.add_row("attention", f"{geo['n_head']} q heads, {geo['n_head_kv']} kv heads, head dim "
              f"{geo['head_dim']}, rope {geo['n_rot']} dims {geo['rope_sections']} base "
              f"{geo['rope_freq_base']:g}")
    t.add_row("delta net", f"{geo['ssm_k_heads']} k heads, {geo['ssm_v_heads']} v heads, state "
              f"{geo['ssm_state']}, conv {geo['ssm_conv_kernel']}")
    t.add_row("context (train)", f"{geo['n_ctx_train']:,}")
    t.add_row("KV cache / token", f"{geo['kv_bytes_per_token_f16']:,} B (f16)")
    t.add_row("recurrent state", f"{_mib(geo['recurrent_state_bytes_f32'])} (f32, per sequence)")
    t.add_row("output head", "tied to token_embd" if geo["tied_output"] else "output.weight")
    mtp = s["mtp"]
    t.add_row("MTP", (f"{s['mtp_layers']} block(s) {mtp['layers']}, {_mib(mtp['bytes'])}"
                      + ("" if mtp["complete"] else f", incomplete ({len(mtp['missing'])} missing)"))
              if s["mtp_layers"] else "none")
    tok = s["tokenizer"]
    t.add_row("tokenizer", f"{tok['model']} / pre {tok['pre']}: {tok['n_tokens']:,} tokens, "
              f"{tok['n_merges']:,} merges, eos {tok['eos_id']}, pad {tok['pad_id']}, chat "
              f"template {'yes' if tok['has_chat_template'] else 'no'}")
    con.print(t)

    q = Table(title="trunk bytes by type (MTP excluded)", title_justify="left")
    for col, j in (("type", "left"), ("tensors", "right"), ("bytes", "right"), ("share", "right")):
        q.add_column(col, justify=j)  # type: ignore[arg-type]
    for name, nb in s["bytes_by_type"].items():
        q.add_row(name, str(s["tensors_by_type"][name]), _mib(nb), f"{100 * nb / max(1, s['trunk_bytes']):.1f}%")
    q.add_row("total", str(sum(s["tensors_by_type"].values())), _mib(s["trunk_bytes"]), "100.0%", style="bold")
    con.print(q)

    b = Table(title="blocks", title_justify="left")
    for col in ("block", "kind", "bytes"):
        b.add_column(col)
    for blk in s["blocks"]:
        b.add_row(str(blk["index"]), {"gdn": "Gated DeltaNet", "attention": "full attention",
                                      "mtp": "MTP (nextn)"}[blk["kind"]], _mib(blk["bytes"]))
    con.print(b)

    if show_tensors:
        tt = Table(title="tensors", title_justify="left")
        for col in ("name", "type", "ne", "bytes", "offset"):
            tt.add_column(col)
        for x in s["tensors"]:
            tt.add_row(x["name"] + (" (mtp)" if x["mtp"] else ""), x["type"], str(x["ne"]),
                       f"{x['bytes']:,}", f"{x['offset']:,}")
        con.print(tt)


def run(args: argparse.Namespace) -> int:
    from tightfit.api import open_model

    path = args.model or _demo_path()
    with open_model(path) as mf:
        s = summarize(mf)
    try:
        if args.json:
            sys.stdout.write(json.dumps(s) + "\n")
        else:
            _print_tables(s, args.tensors)
        sys.stdout.flush()
    except BrokenPipeError:   # `tightfit inspect --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
