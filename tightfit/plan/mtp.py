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


def _rows_bytes(cfg: Qwen35Config, n: int, ctx: int) -> int:
    """fp32 intermediates of one forward over n pairs (every tensor the forward makes, summed:
    an upper bound, the allocator frees most of them before the next is made)."""
    E, F, H, D, Hkv = cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.head_dim, cfg.n_head_kv
    per_row = (
        4 * E            # embedding row, its norm, the hidden norm, their concat (2E) ...
        + 2 * E          # ... concat
        + 6 * E          # eh_proj out, attention norm, attention out, residuals, the final norm
        + 2 * 2 * H * D  # q|gate, q / gate views made contiguous
        + 4 * H * D      # q norm + rope temporaries, o, o * sigmoid(gate)
        + 6 * Hkv * D    # k, v, k norm + rope temporaries
        + 4 * F          # gate, up, silu(gate) * up, silu temp
        + 2 * (2 * E + F)  # int8 activation copies + scales for the GEMVs (generous)
    )
    scores = 3 * H * int(ctx)          # scores, masked copy, softmax
    return int(n) * (per_row + scores) * 4


def mtp_scratch_bytes(cfg: Qwen35Config, ctx: int, n_vocab: int) -> int:
    """Device scratch of the drafter: the captured one-token step (its rows + logits + argmax)
    plus one eager pair chunk (mtp_pair_chunk pairs, logits of its last row only)."""
    step = _rows_bytes(cfg, 1, ctx) + 2 * int(n_vocab) * 4 + 64
    chunk = _rows_bytes(cfg, mtp_pair_chunk(cfg, ctx), ctx) + int(n_vocab) * 4
    return step + chunk


def mtp_bytes(cfg: Qwen35Config, ctx: int, n_vocab: int) -> dict[str, int]:
    """The `mtp` bill line's parts (weights excluded: they are in the `weights` line)."""
    kv = mtp_kv_bytes(cfg, ctx)
    scratch = mtp_scratch_bytes(cfg, ctx, n_vocab)
    return {"kv": kv, "scratch": scratch, "total": kv + scratch}
