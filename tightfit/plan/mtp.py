"""What the MTP (nextn) drafter costs on the device, beside its block's weights.

The block's matrices and norms (`blk.<n_layer>.*`) are ordinary tensors of the plan when
`PlanOptions.include_mtp` is on: the executor holds them as raw GGUF bytes in the arena and the
drafter runs them through the same GEMV kernels as the trunk (no dequantized copy). What is left
is priced here, ONE formula for the planner (the `mtp` bill line) and the runtime
(tightfit.runtime.spec.mtp sizes its cache and its pair chunks with these functions):

* the drafter's KV cache: one full-attention layer of fp16 K and V rows for every position of the
  context (fixed capacity, allocated once: it never grows);
* the scratch of its forward: the captured one-token draft step (tightfit.runtime.spec.mtp_graph:
  its intermediates live in the graph's private pool while the graph exists) plus one eager chunk
  of (hidden row, next token) pairs, whose attention scores are [chunk, H, ctx] fp32.
"""
from __future__ import annotations

from tightfit.model.config import Qwen35Config

MTP_KV_BYTES = 2                  # fp16 K and V
# fp32 bytes the eager pair chunk's attention may take (scores, their mask and softmax); the chunk
# shrinks as the context grows so that a long prompt never asks for [n, H, ctx] at once
PAIR_SCORE_BUDGET = 64 << 20
PAIR_CHUNK_MAX = 64


def mtp_kv_bytes(cfg: Qwen35Config, ctx: int) -> int:
    """K and V of the MTP block for `ctx` positions: ctx x 2 x n_head_kv x head_dim x 2 B."""
    return int(ctx) * 2 * cfg.n_head_kv * cfg.head_dim * MTP_KV_BYTES


def mtp_pair_chunk(cfg: Qwen35Config, ctx: int) -> int:
    """Pairs per eager forward: at most PAIR_CHUNK_MAX, and [chunk, H, ctx] fp32 scores x 3 (scores,
    masked copy, softmax) within PAIR_SCORE_BUDGET (at least 1)."""
    per_pair = 3 * cfg.n_head * max(int(ctx), 1) * 4
    return max(1, min(PAIR_CHUNK_MAX, PAIR_SCORE_BUDGET // per_pair))


def _row_bytes(cfg: Qwen35Config) -> int:
    """fp32 bytes of one pair's intermediates but its attention scores (every tensor the
    forward makes, summed: an upper bound, the allocator frees most before the next is made)."""
    E, F, H, D, Hkv = cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.head_dim, cfg.n_head_kv
    return 4 * (
        4 * E            # embedding row, its norm, the hidden norm, ...
        + 2 * E          # ... their concat
        + 6 * E          # eh_proj out, attention norm, attention out, residuals, the final norm
        + 2 * 2 * H * D  # q|gate, q / gate views made contiguous
        + 4 * H * D      # q norm + rope temporaries, o, o * sigmoid(gate)
        + 6 * Hkv * D    # k, v, k norm + rope temporaries
        + 4 * F          # gate, up, silu(gate) * up, silu temp
        + 2 * (2 * E + F)  # int8 activation copies + scales for the GEMVs (generous)
    )


SMALL_BLOCK = 2 << 20       # torch's caching allocator: allocations < 1 MiB share 2 MiB blocks,
LARGE_SEGMENT = 20 << 20    # 1-10 MiB ones 20 MiB segments, larger ones their size in 2 MiB steps
LARGE = 1 << 20


def _round_up(n: int, q: int) -> int:
    return -(-int(n) // q) * q


def _reserved(small: int, tensors: list[int]) -> int:
    """What the caching allocator (or a graph's private pool) reserves for `small` bytes of
    small tensors plus `tensors` (sizes): small ones in 2 MiB blocks, the large ones (>= 1 MiB)
    in segments of at least 20 MiB."""
    small += sum(t for t in tensors if t < LARGE)
    big = sum(_round_up(t, SMALL_BLOCK) for t in tensors if t >= LARGE)
    return _round_up(small, SMALL_BLOCK) + (max(LARGE_SEGMENT, big) if big else 0)


def mtp_scratch_bytes(cfg: Qwen35Config, ctx: int, n_vocab: int) -> int:
    """Device scratch of the drafter, as the allocator reserves it: the captured one-token
    steps' private pool (one pair's rows, its scores / masked copy / softmax over the whole
    capacity, the logits and their argmax) plus one eager pair chunk (mtp_pair_chunk pairs'
    rows and scores, the logits of its last row only)."""
    H, ctx, V = cfg.n_head, max(int(ctx), 1), int(n_vocab)
    step = _reserved(_row_bytes(cfg) + 64, [H * ctx * 4] * 3 + [V * 4] * 2)
    n = mtp_pair_chunk(cfg, ctx)
    chunk = _reserved(n * _row_bytes(cfg), [n * H * ctx * 4] * 3 + [V * 4])
    return step + chunk


def mtp_bytes(cfg: Qwen35Config, ctx: int, n_vocab: int) -> dict[str, int]:
    """The `mtp` bill line's parts (weights excluded: they are in the `weights` line)."""
    kv = mtp_kv_bytes(cfg, ctx)
    scratch = mtp_scratch_bytes(cfg, ctx, n_vocab)
    return {"kv": kv, "scratch": scratch, "total": kv + scratch}
