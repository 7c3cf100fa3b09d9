"""Output-row split of matrices between the device arena and the host mmap, and the exact-cover
check that runs before the first token (seed 000 '实测' §3, spec/quant-formats.md §4.2).

A GGUF row is whole blocks, so cutting a matrix between output rows r and r+1 is cutting its bytes
at r·nb1: nothing is re-encoded, and the GPU prefix and the CPU suffix each produce a contiguous
slice of the output vector, concatenated without any reduction (ffn_down: the rows are the E
outputs, so its split is also on whole rows, never along K).
"""
from __future__ import annotations

from typing import Iterable, Mapping

from tightfit.errors import PlanError
from tightfit.plan.host_speed import speed_rank
from tightfit.plan.placement import ARENA_ALIGN, GPU, HOST, Placement, TensorSpec

#: A split point is a multiple of this many rows (unless the whole matrix moves): GPU GEMV kernels
#: tile output rows by 32/64, so a prefix of whole tiles needs no tail handling; every matrix row
#: count of the 27B geometry (5120, 6144, 10240, 17408, 1024, 12288, 248320) is a multiple of 64.
SPLIT_ROW_QUANTUM = 64

#: Order in which matrices give up rows. FFN first (seed 000: ffn_gate/ffn_up are the matrices
#: its placer splits), then the mixer projections, then the output head (read every token, so the
#: most expensive to serve from the CPU). Within one kind tier (`split_order="host_speed"`, the
#: default) the formats the host computes fast go first (plan/host_speed.py: the SIMD block
#: kernels run ~5x the low-bit ones, so a low-bit matrix moves only when no faster row of its
#: tier is left: that frees the same bytes for less host time per token). Within one speed class
#: (or across a tier with `split_order="layer"`, the rule before issue 5's profile), the last
#: layers go first: a fixed, documented rule that keeps the early layers, whose activations feed
#: everything, on the device, and keeps the FFN matrices of one layer together on the host
#: (gate+up share x: one grouped host call per layer).
FFN_KINDS = ("ffn_gate", "ffn_up", "ffn_down")
MIXER_KINDS = ("attn_qkv", "attn_gate", "ssm_out", "attn_q", "attn_k", "attn_v", "attn_output")
SPLIT_ORDERS = ("host_speed", "layer")


class PlacementError(PlanError):
    """A placement does not cover every row of every matrix exactly once."""


def split_candidates(tensors: Iterable[TensorSpec], n_layer: int,
                     order: str = "host_speed") -> list[TensorSpec]:
    """Matrices that may be split, in the order they give up rows. Vectors, the tiny ssm_alpha /
    ssm_beta projections, the embedding (handled whole by the host-embedding step) and MTP blocks
    are never candidates."""
    if order not in SPLIT_ORDERS:
        raise ValueError(f"split order {order!r}; known: {', '.join(SPLIT_ORDERS)}")
    by_name = {t.name: t for t in tensors}
    out: list[TensorSpec] = []
    for kinds in (FFN_KINDS, MIXER_KINDS):
        tier = []
        for il in range(n_layer - 1, -1, -1):
            for k in kinds:
                t = by_name.get(f"blk.{il}.{k}.weight")
                if t is not None and t.n_rows >= SPLIT_ROW_QUANTUM:
                    tier.append(t)
        if order == "host_speed":
            tier.sort(key=lambda t: speed_rank(t.qtype))     # stable: layer rule inside a class
        out += tier
    if "output.weight" in by_name:
        out.append(by_name["output.weight"])
    return out


def host_rows_for(t: TensorSpec, need_bytes: int, already: int = 0) -> int:
    """Host suffix length (rows) covering at least `need_bytes` more than `already` rows, with the
    split point on a multiple of SPLIT_ROW_QUANTUM; capped at the whole matrix."""
    if need_bytes <= 0:
        return already
    want = already + -(-need_bytes // t.row_bytes)
    if want >= t.n_rows:
        return t.n_rows
    split = (t.n_rows - want) // SPLIT_ROW_QUANTUM * SPLIT_ROW_QUANTUM
    return t.n_rows - split


def check_exact_cover(placement: Placement, tensors: Mapping[str, TensorSpec] | Iterable[TensorSpec],
                      arena_bytes: int | None = None, quantum: int = SPLIT_ROW_QUANTUM) -> None:
    """Prove that every row of every (non-excluded) tensor is in exactly one place: one GPU arena
    range or one host mmap range; raise PlacementError naming the first fault otherwise.

    Checked: each tensor has segments iff it is not excluded; segments are non-empty, sorted, and
    tile [0, n_rows) with no gap or overlap; at most one GPU prefix followed by one host suffix;
    byte ranges equal row ranges times the row size (so every cut is on a row and block boundary);
    split points sit on `quantum` rows; GPU ranges are ARENA_ALIGN-aligned, inside the weights
    region (and the arena), and no two GPU ranges overlap."""
    if not isinstance(tensors, Mapping):
        tensors = {t.name: t for t in tensors}
    excluded = set(placement.excluded)
    for name in placement.segments:
        if name not in tensors:
            raise PlacementError(f"placement names tensor {name}, which the model does not have")
    limit = placement.weights_region_bytes
    if arena_bytes is not None and limit > arena_bytes:
        raise PlacementError(f"weights region {limit} B exceeds the arena's {arena_bytes} B")
    ranges: list[tuple[int, int, str]] = []
    for name, t in tensors.items():
        segs = placement.segments.get(name)
        if name in excluded:
            if segs:
                raise PlacementError(f"{name} is excluded but has placed rows")
            continue
        if not segs:
            raise PlacementError(f"{name}: no rows placed (0..{t.n_rows} uncovered)")
        rb = t.row_bytes
        pos = 0
        kinds = []
        for s in segs:
            if s.tensor != name:
                raise PlacementError(f"{name}: segment belongs to {s.tensor}")
            if s.where not in (GPU, HOST):
                raise PlacementError(f"{name}: unknown location {s.where!r}")
            if s.row_start != pos:
                what = "gap" if s.row_start > pos else "overlap"
                raise PlacementError(f"{name}: {what} at row {min(pos, s.row_start)} "
                                     f"(segment starts at row {s.row_start}, covered up to {pos})")
            if s.row_end <= s.row_start:
                raise PlacementError(f"{name}: empty or reversed segment rows "
                                     f"[{s.row_start}, {s.row_end})")
            if s.byte_start != s.row_start * rb or s.byte_end != s.row_end * rb:
                raise PlacementError(
                    f"{name}: bytes [{s.byte_start}, {s.byte_end}) are not rows "
                    f"[{s.row_start}, {s.row_end}) x {rb} B: the cut is not on a row/block boundary")
            if 0 < s.row_start < t.n_rows and s.row_start % quantum:
                raise PlacementError(f"{name}: split at row {s.row_start} is not a multiple of "
                                     f"{quantum}")
            if s.where == GPU:
                if s.arena_offset is None or s.arena_offset < 0 or s.arena_offset % ARENA_ALIGN:
                    raise PlacementError(f"{name}: arena offset {s.arena_offset} is not "
                                         f"{ARENA_ALIGN}-aligned")
                if s.arena_offset + s.nbytes > limit:
                    raise PlacementError(f"{name}: arena range ends at {s.arena_offset + s.nbytes}, "
                                         f"past the weights region ({limit} B)")
                ranges.append((s.arena_offset, s.arena_offset + s.nbytes, name))
            elif s.arena_offset is not None:
                raise PlacementError(f"{name}: host segment has an arena offset")
            kinds.append(s.where)
            pos = s.row_end
        if pos != t.n_rows:
            raise PlacementError(f"{name}: rows {pos}..{t.n_rows} uncovered")
        if kinds not in ([GPU], [HOST], [GPU, HOST]):
            raise PlacementError(f"{name}: segments {kinds} are not one GPU prefix + one host suffix")
    ranges.sort()
    for (a0, a1, n0), (b0, b1, n1) in zip(ranges, ranges[1:]):
        if b0 < a1:
            raise PlacementError(f"arena ranges of {n0} [{a0}, {a1}) and {n1} [{b0}, {b1}) overlap")
