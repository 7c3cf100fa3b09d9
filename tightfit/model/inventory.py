"""Check a GGUF's tensors against the qwen35 inventory that `Qwen35Config.tensor_shapes` derives.

llama.cpp rejects a missing or misshaped tensor and an unknown extra tensor at load time, but it
*accepts* a non-F32 norm/conv/ssm scalar or a missing linear-attention `attn_qkv` and then crashes
at the first decode (spec/gguf-synthetic-traps.md §8). We reject all of these up front.

MTP (nextn) blocks are blocks `n_layer .. block_count-1`. Their tensors are separated so later
stages (planner, forward pass) exclude them unless speculation asks for them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tightfit.errors import GGUFError

if TYPE_CHECKING:
    from tightfit.gguf.reader import GGUFFile, TensorInfo
    from tightfit.model.config import Qwen35Config

F32 = 0
_BLOCK = re.compile(r"^blk\.(\d+)\.")

#: MTP tensors that may be absent (llama.cpp falls back to output_norm / token_embd / output).
MTP_OPTIONAL = ("nextn.shared_head_norm.weight",)
MTP_EXTRA_OPTIONAL = {"nextn.embed_tokens.weight", "nextn.shared_head_head.weight"}


@dataclass
class Inventory:
    trunk: dict[str, "TensorInfo"] = field(default_factory=dict)   # everything the main logits use
    mtp: dict[str, "TensorInfo"] = field(default_factory=dict)     # blocks >= n_layer
    extra: list[str] = field(default_factory=list)                 # unknown tensors (allow_extra)
    mtp_complete: bool = False                                     # all required MTP tensors found
    mtp_missing: list[str] = field(default_factory=list)
    tied_output: bool = False

    def block_of(self, name: str) -> int | None:
        m = _BLOCK.match(name)
        return int(m.group(1)) if m else None


def _fmt(ne: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(d) for d in ne) + "}"


def _few(names: list[str], n: int = 4) -> str:
    more = f" (and {len(names) - n} more)" if len(names) > n else ""
    return ", ".join(f"'{x}'" for x in names[:n]) + more


def check_inventory(gguf_file: "GGUFFile", config: "Qwen35Config", *,
                    allow_extra: bool = False) -> Inventory:
    """Split the file's tensors into trunk / MTP and verify names, shapes and vector types.

    Raises GGUFError naming the first problem tensor (missing, wrong shape, vector not F32, unknown
    tensor unless `allow_extra`)."""
    fname = gguf_file.name
    have = gguf_file.tensors
    inv = Inventory(tied_output="output.weight" not in have)

    expected = config.tensor_shapes(include_mtp=False)
    if inv.tied_output:
        expected.pop("output.weight", None)
    elif "output.weight" not in expected:   # config says tied but the file has an LM head
        expected["output.weight"] = (config.n_embd, config.n_vocab)

    def check(name: str, want: tuple[int, ...], t: "TensorInfo") -> None:
        if tuple(t.ne) != tuple(want):
            hint = ""
            if name == "token_embd.weight" and t.ne[:1] == want[:1]:
                hint = f" (n_vocab is {config.n_vocab} = tokenizer.ggml.tokens entries)"
            raise GGUFError(f"{fname}: tensor '{name}' has wrong shape; expected {_fmt(want)}, "
                            f"got {_fmt(t.ne)}{hint}")
        if config.is_vector_tensor(name) and t.qtype != F32:
            raise GGUFError(f"{fname}: tensor '{name}' is {t.type_name}; qwen35 requires F32 for "
                            f"norms, ssm_a, ssm_dt.bias and ssm_conv1d")

    missing = [n for n in expected if n not in have]
    if missing:
        raise GGUFError(f"{fname}: tensor {_few(missing)} not found ({len(missing)} of "
                        f"{len(expected)} expected trunk tensors missing)")
    for name, want in expected.items():
        t = have[name]
        check(name, want, t)
        inv.trunk[name] = t

    # MTP blocks: required tensors, optional ones, and optional extras
    mtp_expected: dict[str, tuple[int, ...]] = {}
    for il in range(config.n_layer, config.block_count):
        mtp_expected.update(config.block_tensor_shapes(il))
    optional = {n for n in mtp_expected if n.split(".", 2)[2] in MTP_OPTIONAL}
    for name, want in mtp_expected.items():
        t = have.get(name)
        if t is None:
            if name not in optional:
                inv.mtp_missing.append(name)
            continue
        check(name, want, t)
        inv.mtp[name] = t
    for name, t in have.items():
        blk = inv.block_of(name)
        if (name not in inv.trunk and name not in inv.mtp and blk is not None
                and config.n_layer <= blk < config.block_count
                and name.split(".", 2)[2] in MTP_EXTRA_OPTIONAL):
            inv.mtp[name] = t
    inv.mtp_complete = config.nextn_layers > 0 and not inv.mtp_missing

    extra = [n for n in have if n not in inv.trunk and n not in inv.mtp]
    if extra and not allow_extra:
        blk = inv.block_of(extra[0])
        why = ""
        if blk is not None and blk >= config.block_count:
            why = f" (block {blk} >= block_count {config.block_count})"
        elif blk is not None and blk < config.n_layer:
            kind = "linear-attention" if config.is_recurrent(blk) else "full-attention"
            why = f" (block {blk} is a {kind} block)"
        raise GGUFError(f"{fname}: unexpected tensor {_few(extra)}{why}; llama.cpp rejects "
                        f"files with unknown tensors")
    inv.extra = extra
    return inv
