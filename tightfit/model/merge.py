"""One GEMV launch for matrices that read the same input in the same quant format (issue 7).

Every GEMV launch of the decode step carries a few microseconds of fixed cost (bench/RESULTS.md
session 5: a 2.7 MB matrix takes 3.6-5 us although its bytes need ~0.7 us), so matrices that read
one input through the same kernel are cheaper as ONE matrix with n_out = the sum of theirs: the
raw GGUF rows of consecutive matrices, laid back to back, ARE the rows of that matrix, and the
output rows of the merged product, written into one contiguous buffer, are the parts' outputs
side by side. Per token on the 27B seed mix this covers GDN attn_qkv + attn_gate (IQ4_XS) and
ssm_beta + ssm_alpha (Q8_0), ffn_gate + ffn_up where both are IQ4_XS, and attn_k + attn_v where
both are Q6_K.

A group is a run of CONSECUTIVE matrices of one call site (the executor's `_linears` lists, in
their order) whose `key` is equal and not None: the executor's key is (qtype, n_in, activation
layout) for a device matrix on the quantized path with no host rows. The run must also be
adjacent in device memory (`adjacent`); on the legacy path the executor allocates each group in
one buffer so that it is, on the placed path the arena lays tensors in file order at ARENA_ALIGN
boundaries, so the parts are adjacent when each one's bytes fill whole alignment units (true for
every group of the 27B) - otherwise the group is simply not merged.

The outputs must be contiguous too: `relayout` moves the step buffers of each call site inside
the same workspace bytes so that the site's outputs follow each other in call order (u, zg, beta,
alpha of a GDN block are not neighbours in tightfit.plan.buffers' carving order). Nothing is
allocated: packing the outputs without padding between them never needs more bytes than the
aligned slots they came from, and the buffers in between keep their alignment.

On by default (the 27B step: 7.95 -> 7.82 ms, bench/RESULTS.md session 6); TIGHTFIT_MERGE_LINEARS=0
turns it off.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import torch

#: Byte alignment every part must start at inside a legacy-path group buffer: the per-part views
#: are still what the batched prefill and the verify graph read, and 16 B keeps their vector loads
#: as aligned as the rows themselves (a placed-path part starts at an ARENA_ALIGN boundary anyway)
PART_ALIGN = 16


def enabled() -> bool:
    v = os.environ.get("TIGHTFIT_MERGE_LINEARS", "1").strip().lower()
    return v not in ("0", "false", "off", "no")


def call_sites(cfg: Any) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(matrix names, output buffer names) of every decode-step `_linears` call that reads one
    input through several matrices, in the executor's call order (GPUModel._gdn, _attention and
    the FFN of _step)."""
    out = []
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        if cfg.is_recurrent(il):
            out.append(((p + "attn_qkv.weight", p + "attn_gate.weight", p + "ssm_beta.weight",
                         p + "ssm_alpha.weight"), ("u", "zg", "beta", "alpha")))
        else:
            out.append(((p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"),
                        ("qg", "kk", "vv")))
        out.append(((p + "ffn_gate.weight", p + "ffn_up.weight"), ("g", "up")))
    return out


def runs(names: Sequence[str], key: Callable[[str], Hashable | None]) -> list[tuple[str, ...]]:
    """The maximal runs (2 or more) of consecutive `names` with one key that is not None."""
    out: list[tuple[str, ...]] = []
    cur: list[str] = []
    cur_key = None
    for n in names:
        k = key(n)
        if k is not None and cur and k == cur_key:
            cur.append(n)
            continue
        if len(cur) > 1:
            out.append(tuple(cur))
        cur, cur_key = ([n], k) if k is not None else ([], None)
    if len(cur) > 1:
        out.append(tuple(cur))
    return out


def plan_groups(cfg: Any, key: Callable[[str], Hashable | None]) -> list[tuple[str, ...]]:
    """Every group of every call site (see `runs`)."""
    return [g for names, _ in call_sites(cfg) for g in runs(names, key)]


def adjacent(parts: Sequence[torch.Tensor], align: int = PART_ALIGN) -> bool:
    """Whether the 1-D byte tensors lie back to back in one storage (the end of part i is the
    start of part i+1), each starting at a multiple of `align` bytes from the first."""
    if len(parts) < 2:
        return False
    st = parts[0].untyped_storage().data_ptr()
    p0 = parts[0].data_ptr()
    end = p0
    for t in parts:
        if t.dim() != 1 or not t.is_contiguous() or t.untyped_storage().data_ptr() != st:
            return False
        if t.data_ptr() != end or (t.data_ptr() - p0) % align:
            return False
        end += t.numel() * t.element_size()
    return True


def span(first: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A contiguous view of `shape` starting where `first` starts, in first's storage (the caller
    knows the following bytes belong to the group: `adjacent`, or outputs from `relayout`)."""
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= int(d)
    return torch.as_strided(first, tuple(int(d) for d in shape), tuple(reversed(strides)),
                            first.storage_offset())


def outputs_contiguous(outs: Sequence[torch.Tensor]) -> bool:
    """Whether the float output buffers follow each other in memory (one [1, n] view covers all)."""
    end = outs[0].data_ptr()
    for o in outs:
        if not o.is_contiguous() or o.data_ptr() != end or o.dtype != outs[0].dtype:
            return False
        end += o.numel() * o.element_size()
    return True


def relayout(order: Sequence[tuple[str, int]], offs: dict[str, int],
             chains: Sequence[Sequence[str]], align: int) -> dict[str, int]:
    """New byte offsets for the buffers of `order` ((name, bytes) in carving order, at `offs`)
    such that each chain's buffers are contiguous in chain order. A chain takes the slots from its
    first to its last member (in carving order): its members packed from the first slot's offset,
    then the other buffers of that range at `align` boundaries. Chains whose ranges overlap an
    earlier chain's are left as they are. Returns only the offsets that change; every buffer stays
    inside the bytes of the original range, so the total never grows."""
    idx = {n: i for i, (n, _) in enumerate(order)}
    size = dict(order)
    taken: list[tuple[int, int]] = []
    new: dict[str, int] = {}
    for chain in chains:
        chain = [n for n in chain if n in idx]
        if len(chain) < 2 or len(set(chain)) != len(chain):
            continue
        lo, hi = min(idx[n] for n in chain), max(idx[n] for n in chain)
        if any(not (hi < a or lo > b) for a, b in taken):
            continue
        start = offs[order[lo][0]]
        # the range ends where the last member's aligned slot ends (tightfit.plan.buffers.pack
        # rounds every buffer up to `align`), not at its last byte: the packed chain can need
        # that padding, e.g. the 27B's u, zg, beta, alpha (the chain itself then ends off the
        # alignment, so the buffers after it start one unit later; session 23 found every GDN
        # site of the 27B left unmerged by this, 64 bytes short)
        limit = -(-(offs[order[hi][0]] + size[order[hi][0]]) // align) * align
        lay, off = {}, start
        for n in chain:
            lay[n] = off
            off += size[n]
        for n, nb in order[lo:hi + 1]:
            if n in lay:
                continue
            off = -(-off // align) * align
            lay[n] = off
            off += nb
        if off > limit:                 # cannot happen (see above); keep the carving then
            continue
        taken.append((lo, hi))
        new.update({n: o for n, o in lay.items() if o != offs[n]})
    return new


@dataclass
class MergedLinear:
    """Consecutive quantized matrices read as one: raw = their bytes back to back (a view over
    the parts' own bytes, never a copy), n_out = the sum of theirs; rows[i] = part i's row count."""
    names: tuple[str, ...]
    raw: torch.Tensor
    qtype: int
    n_in: int
    layout: int
    rows: tuple[int, ...]
    kind: str = "quant"

    @property
    def n_out(self) -> int:
        return sum(self.rows)
