"""The VRAM bill (seed 000 '第一步') and the planner that makes it fit.

    Peak VRAM = GPU-resident weights + alignment
              + full-attention KV cache + Gated DeltaNet recurrent state (two banks)
              + persistent workspace + max(prefill scratch, decode scratch)
              + staging buffers + safety reserve
              [+ MTP drafter: its KV cache + step scratch, with PlanOptions.include_mtp]
              [+ captured verify block of `batch` tokens, with PlanOptions.batch > 1]

The weights, KV cache, recurrent banks, workspace, staging and verify lines are regions of ONE
device allocation, the arena; the scratch and MTP lines are what the batched forward and the
drafter allocate through torch beside it, and the reserve is the driver's and the libraries'.

Every line is derived from the geometry in `Qwen35Config` and the exact byte counts of the tensors;
each formula is written next to its code and repeated in the line's `formula` text. The planner
never truncates the context or downgrades the KV format on its own: if the bill does not fit after
the allowed weight moves (embedding to the host, then output-row splits), the plan says so, and
`require_fit` raises PlanError (exit 2) with what would fit.

With `include_mtp` (the MTP drafter, `serve --spec ...,mtp`) the MTP block's weights join the
`weights` line and the `mtp` line prices the rest (tightfit.plan.mtp). The drafter runs only with
the whole model on the GPU, so no weight moves to the host then: the plan fits wholly on the
device or it does not fit, and says what the drafter costs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from tightfit.errors import PlanError, UserError
from tightfit.model.config import Qwen35Config
from tightfit.plan.buffers import (DEFAULT_ATTN_CHUNK, act_layouts, mma_rows, pack, step_buffers,
                                   vector_shapes)
from tightfit.plan.placement import (ModelInventory, Placement, TensorSpec, align_up,
                                     build_placement, type_name)
from tightfit.plan.host_speed import host_ms_by_type
from tightfit.plan.rowsplit import (SPLIT_ORDERS, check_exact_cover, host_rows_for,
                                    split_candidates)

MiB = 1 << 20
GiB = 1 << 30


# ---- KV cache formats ------------------------------------------------------------------------
@dataclass(frozen=True)
class KVFormat:
    """Bytes of `block` consecutive K (or V) elements of one head row. `runtime` says whether the
    attention kernels can read it yet; the planner can price any registered format."""
    name: str
    block: int
    block_bytes: int
    runtime: bool = False
    note: str = ""

    def bytes_for(self, n_elems: int) -> int:
        return -(-n_elems // self.block) * self.block_bytes


KV_FORMATS: dict[str, KVFormat] = {
    "f16": KVFormat("f16", 1, 2, runtime=True, note="default; seed 000 refuses to downgrade it"),
    "q8_0": KVFormat("q8_0", 32, 34, note="ggml Q8_0 block: fp16 scale + 32 int8"),
}


def register_kv_format(fmt: KVFormat) -> None:
    """Hook for the compressed formats of seed 004 (e.g. the original turbo3 block of 14 bytes per
    32 values, spec/quant-formats.md §6.3) once their kernels exist."""
    KV_FORMATS[fmt.name] = fmt


def kv_format(name: str) -> KVFormat:
    import tightfit.kvquant  # noqa: F401  registers the quantized formats (q8_0, tq2/3/4, mixes)
    if name.lower() not in KV_FORMATS and "+" in name:     # any other <k>+<v> mix
        from tightfit.kvquant import planner_format
        try:
            register_kv_format(planner_format(name.lower()))
        except ValueError:
            pass
    try:
        return KV_FORMATS[name.lower()]
    except KeyError:
        raise UserError(f"unknown --kv-type {name!r}; known: {', '.join(KV_FORMATS)}") from None


def kv_bytes_per_token(cfg: Qwen35Config, fmt: KVFormat) -> int:
    # n_attention_layers x (K + V) x bytes(Hkv*D elements); 27B f16: 16 x 2 x 2048 = 65,536 B
    return len(cfg.attention_ids) * 2 * fmt.bytes_for(cfg.kv_dim)


# ---- constants of the bill -------------------------------------------------------------------
STATE_BANKS = 2                # active + staging bank; swapped only after a clean step (seed 000)
STATE_DTYPE_BYTES = 4          # conv and SSM states are F32 (spec/qwen35.md §4)
ATTN_CHUNK = 1024              # decode attention: one partial per 1024 cached tokens (seed 000)
EXCHANGE_TOKENS = 64           # prefill hands host-computed rows over in groups of <= 64 tokens
GDN_PREFILL_CHUNK = 64         # chunked delta rule: a C x C matrix per head per chunk
RESERVE_FIXED = 192 * MiB      # allocator slack, kernel images, cuBLAS handle workspace
RESERVE_FRACTION = 0.01        # plus 1% of what the device reports free


def q8_bytes(n: int) -> int:
    """Activation quantized to int8 blocks of 32 with one fp32 scale each (Q8_F32S, seed 000)."""
    return n + 4 * (-(-n // 32))


@dataclass(frozen=True)
class PlanOptions:
    ctx: int
    available: int                 # bytes the device can give us (real free memory)
    kv_type: str = "f16"
    batch: int = 1                 # decode width (speculative verify)
    host_embd: str = "auto"        # auto | yes | no
    split: bool = True             # allow output-row splits
    include_mtp: bool = False      # single-token mode leaves blk.<n_layer>+ out
    prefill_chunk: int = 512       # tokens per prefill step
    reserve: int | None = None     # override the safety reserve
    attn_chunk: int = DEFAULT_ATTN_CHUNK   # split-K rows per chunk of the executor's decode step
    split_order: str = "host_speed"        # rowsplit.SPLIT_ORDERS; "layer" = the pre-issue-5 rule

    def validate(self, cfg: Qwen35Config) -> None:
        if self.ctx < 1:
            raise UserError(f"--ctx must be at least 1, got {self.ctx}")
        if self.ctx > cfg.n_ctx_train:
            raise UserError(f"--ctx {self.ctx} exceeds the model's trained context {cfg.n_ctx_train}")
        if self.batch < 1 or self.prefill_chunk < 1 or self.attn_chunk < 1:
            raise UserError("--batch, the prefill chunk and the attention chunk must be at least 1")
        if self.host_embd not in ("auto", "yes", "no"):
            raise UserError(f"--host-embd must be auto, yes or no, got {self.host_embd!r}")
        if self.available < 0:
            raise UserError("available VRAM cannot be negative")
        if self.split_order not in SPLIT_ORDERS:
            raise UserError(f"split order must be one of {', '.join(SPLIT_ORDERS)}, "
                            f"got {self.split_order!r}")
        kv_format(self.kv_type)
        if self.include_mtp:
            _validate_mtp(self, cfg)


def _validate_mtp(o: PlanOptions, cfg: Qwen35Config) -> None:
    """The MTP drafter needs the model's MTP block, and the whole model on the GPU."""
    if not cfg.nextn_layers:
        raise UserError("MTP asked for (--mtp / --spec mtp), but this model has no MTP block "
                        "(qwen35.nextn_predict_layers = 0)")
    if o.host_embd == "yes":
        raise UserError("--host-embd yes keeps the embedding on the host, but the MTP drafter "
                        "needs the whole model on the GPU; use --host-embd auto or drop MTP")


def cublas_workspace_bytes() -> int:
    """The cuBLAS workspace torch's caching allocator keeps once the prefill GEMM has run (dequant
    + cuBLAS): CUBLAS_WORKSPACE_CONFIG's ':KiB:count[:KiB:count...]' when set, else 32 MiB, what
    torch takes on sm_90 (measured: session 17, `bench/mtp_peak.py --where`, one 32 MiB block
    allocated under gemm_q._mm_f32 and held to the end; smaller on older GPUs: priced high)."""
    cfg = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "").strip()
    parts = [p for p in cfg.split(":") if p]
    if parts and len(parts) % 2 == 0 and all(p.isdigit() for p in parts):
        return sum(int(parts[i]) * int(parts[i + 1]) for i in range(0, len(parts), 2)) * 1024
    return 32 << 20


# the lines that are regions of the device arena (Plan.layout); the others (scratch, mtp, reserve)
# are budget that the arena leaves to torch's caching allocator / the driver
ARENA_LINES = ("kv_cache", "recurrent_state", "workspace", "staging", "verify")


@dataclass
class BillLine:
    key: str
    label: str
    bytes: int
    formula: str
    details: dict[str, Any] = field(default_factory=dict)
    region: int | None = None      # arena region bytes when larger than `bytes` (inner padding)

    @property
    def region_bytes(self) -> int:
        return self.bytes if self.region is None else self.region


# ---- the lines that do not depend on placement ------------------------------------------------
def _decode_scratch(cfg: Qwen35Config, T: int, ctx: int, partials: bool) -> dict[str, int]:
    """Per-block intermediates for T tokens; blocks run one after another, so the scratch is the
    largest of them (reused by every block)."""
    E, H, D, F = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_ff
    # FFN: gate and up f32; SiLU(gate)*up overwrites gate and its Q8 copy overwrites up; normed x
    # f32 + its Q8 copy. 27B, T=1: 2*17408*4 + 5120*4 + 5760 = 165,504 B (seed 000's FFN workspace)
    ffn = T * (2 * F * 4 + E * 4 + q8_bytes(E))
    # GDN: raw qkv + conv output (conv_dim f32 each), z gate and core output (value_dim f32 each),
    # alpha and beta (Hv f32 each), normed x f32, one Q8 activation of the wider input
    gdn = T * (2 * cfg.conv_dim * 4 + 2 * cfg.value_dim * 4 + 2 * cfg.ssm_v_heads * 4 + E * 4
               + q8_bytes(max(E, cfg.value_dim)))
    # Attention: q+gate (2*H*D), k and v (Hkv*D each), output (H*D), normed x, Q8 activation
    attn = T * (2 * H * D * 4 + 2 * cfg.kv_dim * 4 + H * D * 4 + E * 4 + q8_bytes(max(E, H * D)))
    n_chunks = -(-ctx // ATTN_CHUNK) if (partials and ctx > ATTN_CHUNK) else 0
    # two-stage decode attention past 1024 tokens: per (chunk, query head) an f32 max, an f32
    # numerator of D and an f64 denominator: 27B at 32K = 32 x 24 x 1036 = 795,648 B
    attn_partials = T * n_chunks * H * (4 + 4 * D + 8)
    head = T * (E * 4 + q8_bytes(E))          # final norm + Q8 input of the output head
    return {"ffn": ffn, "gdn": gdn, "attention": attn + attn_partials,
            "attention_partials": attn_partials, "output_head": head}


# ---- the batched forward's per-chunk bytes (ONE formula: tightfit.model.batch uses it too) ------
PREFILL_GEMM_SCRATCH = 64 * MiB   # tightfit.kernels.gemm_q.DEFAULT_SCRATCH (bf16 dequant row chunk)
PREFILL_ATTN_TILE = 4096          # tightfit.kernels.attn_prefill_flash.TILE_ROWS (quantized KV)
RING_SLOT = 32 * MiB              # tightfit.model.batch.RING_SLOT_BYTES (host-row ring, 2 slots)
RING_MIN_M = 32                   # tightfit.model.batch.RING_MIN_M (smaller blocks: CPU rows)
FLA_CHUNK = 64                    # fla-core chunk_gated_delta_rule's chunk (BT)


def _gemm_temp(n: int, n_in: int, n_out: int, scratch: int) -> int:
    """gemm_q temporaries of one [n, n_in] x [n_in, n_out] call besides its fp32 output: the bf16
    copy of x, then either the dequant path (bf16 row chunk <= scratch, cuBLAS's fp32 result of
    the chunk before it is copied into the output) or a float matrix (x cast + a full fp32
    result); the fused path needs only the bf16 copy of x."""
    rows = min(n_out, max(1, scratch // (2 * n_in)))
    return n * n_in * 2 + max(min(scratch, rows * n_in * 2) + n * rows * 4, n * n_out * 4)


def _norm_temp(n: int, width: int) -> int:
    """_rmsnorm of [n, width] fp32: the float64 copy and its square (the mean is taken in
    float64) are alive together, then x * rsqrt before * w."""
    return n * width * (8 + 8)


def prefill_workspace(cfg: Qwen35Config, n: int, depth: int = 0, kv_type: str | None = None,
                      scratch_bytes: int = PREFILL_GEMM_SCRATCH, gdn_chunk: int = GDN_PREFILL_CHUNK,
                      attn_tile: int = PREFILL_ATTN_TILE, gdn: str = "max",
                      attn: str = "auto") -> dict[str, int]:
    """Device bytes BatchForward (tightfit.model.batch) allocates for one chunk of n tokens after
    `depth` cached ones, besides weights, state and the executor's buffers: the peak of the
    blocks, which run one after another (every tensor of a block is freed before the next).

    Phases (fp32 = 4 B; E, F, C = conv_dim, Vd = value_dim, Hv, S, H, D, Hkv):
      resident   the residual x and the block's normed input xn (n E each), the new residual
                 while the old one is alive (n E), and one _rmsnorm's float64 temporaries;
      gdn        u (n C), the conv window ((K-1+n) C), conv output (n C) and the conv's running
                 sum + product (2 n C), z (n Vd), q/k repeated to Hv heads (2 n Vd), fla's
                 contiguous v (n Vd), alpha/beta/g/beta (4 n Hv), then the larger of: the chunked
                 delta rule's temporaries (`gdn`: 'torch' chunk_gdn_torch, 'fla' fla-core
                 chunk_gated_delta_rule_fwd, 'max' the larger: whichever backend the device
                 takes), or the output norm / gate (2 n Vd + norm) + ssm_out's GEMM temporaries;
      attention  q|gate (2 n H D), k, v (2 n Hkv D), q (n H D), then the largest of: q/k norm +
                 RoPE temporaries (24 n H D; quantize-on-write 64 B per K/V value), the attention
                 (`attn`: 'flash' the bounded Triton kernel attn_prefill_flash: fp32 output, for a
                 quantized cache 2 fp16 tiles of min(attn_tile, depth+n) rows + m, l + the
                 rotations; 'sdpa' torch flash SDPA of the first chunk: fp16 q, fp16 + fp32
                 output, logsumexp; 'auto' the larger of the two for an f16 cache, flash for a
                 quantized one), or the gate (2 n H D) + attn_output's GEMM temporaries;
      ffn        the normed input (n E), gate and up (2 n F), SiLU(gate) and the product (2 n F),
                 the largest GEMM's temporaries (E -> F or F -> E) and its output;
      gemm       `scratch_bytes`: gemm_q's bf16 dequant chunk (inside the GEMM temporaries);
      logits     one row of the LM head (state-only prefill: the last token only).
    Every phase's matrices are priced with `_gemm_temp` at their real widths; the figure is an
    upper bound of the caching allocator's peak (bench/prefill.py prints both)."""
    c = cfg
    n = max(1, int(n))
    E, F, C, Vd = c.n_embd, c.n_ff, c.conv_dim, c.value_dim
    H, D, Hkv, Hv, S = c.n_head, c.head_dim, c.n_head_kv, c.ssm_v_heads, c.ssm_state
    HD, kvd, K = H * D, c.kv_dim, c.ssm_conv_kernel
    sc = int(scratch_bytes)
    resident = n * E * 4 * 3 + _norm_temp(n, E)
    # ---- Gated DeltaNet block
    # alive until _gdn returns: u, conv window, conv output, z, alpha/beta/g/beta
    gdn_keep = 4 * (2 * n * C + (K - 1 + n) * C + n * Vd + 4 * n * Hv)
    Cc = max(1, min(int(gdn_chunk), n))
    per = Hv * -(-n // Cc) * Cc
    # chunk_gdn_torch: padded q/k/v chunks, decay matrix D, A, the solve's right-hand side and
    # solution (and the solver's own copies), P, [Q Gamma; W], K~^T, O, per (head, token)
    torch_core = per * (11 * S + 4 * Cc) * 4 + 2 * Hv * S * S * 4
    NT = -(-n // FLA_CHUNK)
    # fla-core chunk_gated_delta_rule_fwd: g cumsum, A and its inverse [T, BT] fp32, w, u,
    # v_new, o [T, Vd], chunk states h [NT, Hv, S, S], initial/final state
    fla_core = (n * Hv * (4 + 2 * FLA_CHUNK * 4) + 4 * n * Vd * 4 + NT * Hv * S * S * 4
                + 3 * Hv * S * S * 4)
    core = {"torch": torch_core, "fla": fla_core, "max": max(torch_core, fla_core)}[gdn]
    qk_rep = 2 * n * Vd * 4                        # q, k repeated to Hv heads (alive to the end)
    gdn_out = qk_rep + 3 * n * Vd * 4 + _norm_temp(n, Vd) + n * E * 4   # o, silu(z), o*gate
    gdn_proj = max(_gemm_temp(n, E, w, sc) + n * w * 4 for w in (C, Vd))
    gdn_b = gdn_keep + max(2 * n * C * 4, qk_rep + n * Vd * 4 + core,
                           gdn_out + _gemm_temp(n, Vd, E, sc), gdn_proj)
    # ---- full attention block
    attn_keep = (2 * n * HD + 2 * n * kvd + n * HD) * 4
    prep = 24 * n * HD + (64 * n * kvd * 2 if kv_type else 0)
    T = depth + n
    flash = n * HD * 4
    if kv_type:
        from tightfit.kvquant.formats import get_format, split_kv_type
        kf, vf = (get_format(x) for x in split_kv_type(kv_type))
        flash += 2 * min(int(attn_tile), T) * kvd * 2 + 2 * n * H * 4
        rot = (n * HD * 4 if kf.rotate else 0) + (n * HD * 4 if vf.rotate else 0)
        flash += rot + (D * D * 4 if rot else 0)
    sdpa = n * HD * (2 + 2 + 4) + n * H * 4
    a_core = {"flash": flash, "sdpa": sdpa,
              "auto": flash if kv_type else max(flash, sdpa)}[attn]
    attn_out = 2 * n * HD * 4 + _gemm_temp(n, HD, E, sc) + n * E * 4
    attn_proj = max(_gemm_temp(n, E, w, sc) + n * w * 4 for w in (2 * HD, kvd))
    attn_b = attn_keep + max(prep, a_core, attn_out, attn_proj)
    # ---- FFN
    ffn_b = n * E * 4 + max(_norm_temp(n, E), 2 * n * F * 4 + max(
        _gemm_temp(n, E, F, sc), 2 * n * F * 4, n * F * 4 + _gemm_temp(n, F, E, sc) + n * E * 4))
    blocks = {"gdn_block": gdn_b, "attention_block": attn_b, "ffn_block": ffn_b}
    peak_block = max(blocks.values())
    out = {"resident": resident, **blocks, "gdn_core": core, "attention_core": a_core,
           "gemm_scratch": sc,
           "logits": c.n_vocab * 4}
    out["total"] = resident + peak_block + out["logits"]
    return out


def ring_bytes(slot: int = RING_SLOT) -> int:
    """Device bytes of the host-row ring (tightfit.model.batch.HostRowRing: 2 staging slots), held
    once a prefill chunk of >= 32 tokens streams split rows."""
    return 2 * int(slot)


def workspace_buffers(cfg: Qwen35Config, o: PlanOptions, inv: ModelInventory | None = None):
    """The executor's step buffers for these options (tightfit.plan.buffers.step_buffers); the
    int8 GEMV inputs are priced for every matrix the executor reads (a matrix moved wholly to
    the host keeps its few KB), the decoded vectors for every non-F32 vector tensor."""
    fmt = kv_format(o.kv_type)
    layouts, vectors = {}, {}
    if inv is not None:
        mma_n_out = mma_fixup_rows(cfg, o, inv)
        needed = inv.needed(o.include_mtp)
        layouts = act_layouts((t.name, t.qtype, t.ne[0]) for t in needed if t.is_matrix)
        if cfg.tied_output or "output.weight" not in inv.tensors:
            emb = inv.tensors["token_embd.weight"]
            extra = act_layouts([("output.weight", emb.qtype, emb.ne[0])])
            for k, v in extra.items():
                layouts[k] = tuple(sorted(set(layouts.get(k, ())) | set(v)))
        vectors = vector_shapes((t.name, t.qtype, t.ne) for t in needed)
    return step_buffers(cfg, o.ctx, None if fmt.name == "f16" else fmt.name, o.attn_chunk,
                        layouts, vectors, mma_n_out=mma_n_out if inv is not None else 0)


def mma_fixup_rows(cfg: Qwen35Config, o: PlanOptions, inv: ModelInventory) -> int:
    """The largest n_out that can run on the tensor-core GEMV (buffers.mma_rows), the output head
    included when it is the tied embedding: what the `mma_fixup` buffer's counters are sized for."""
    needed = inv.needed(o.include_mtp)
    mats = [(t.name, t.qtype, t.ne[0], t.ne[1]) for t in needed if t.is_matrix]
    if cfg.tied_output or "output.weight" not in inv.tensors:
        emb = inv.tensors["token_embd.weight"]
        mats.append(("output.weight", emb.qtype, emb.ne[0], emb.ne[1]))
    return mma_rows(mats)


def _fixed_lines(cfg: Qwen35Config, o: PlanOptions,
                 inv: ModelInventory | None = None) -> dict[str, BillLine]:
    fmt = kv_format(o.kv_type)
    B = o.batch
    per_tok = kv_bytes_per_token(cfg, fmt)
    kv = BillLine("kv_cache", f"Full-attention KV cache ({fmt.name})", o.ctx * per_tok,
                  "ctx x n_attn_layers x 2 x bytes(n_head_kv x head_dim)",
                  {"bytes_per_token": per_tok, "attention_layers": len(cfg.attention_ids),
                   "kv_type": fmt.name})
    per_layer = (cfg.conv_state_elems + cfg.ssm_state_elems) * STATE_DTYPE_BYTES
    n_rec = len(cfg.recurrent_ids)
    state = BillLine("recurrent_state", "Gated DeltaNet recurrent state (2 banks)",
                     STATE_BANKS * n_rec * per_layer,
                     "banks x n_gdn_layers x ((K-1) x conv_dim + S x d_inner) x 4",
                     {"bytes_per_layer": per_layer, "bytes_per_bank": n_rec * per_layer,
                      "gdn_layers": n_rec, "banks": STATE_BANKS,
                      "conv_bytes_per_layer": cfg.conv_state_elems * STATE_DTYPE_BYTES,
                      "ssm_bytes_per_layer": cfg.ssm_state_elems * STATE_DTYPE_BYTES})
    # the executor's persistent step buffers, itemized (tightfit.plan.buffers): every one is
    # carved from this region, so the line is exactly what is allocated
    bufs = workspace_buffers(cfg, o, inv)
    _offs, packed = pack(bufs)
    ws = BillLine("workspace", "Persistent workspace (executor step buffers)",
                  sum(b.nbytes for b in bufs),
                  "sum of the executor's step buffers (tightfit.plan.buffers): activations, "
                  "logits, token id + argmax, RoPE tables, split-K partials, KV-quant tables, "
                  "int8 GEMV inputs, status word", {"buffers": {b.name: b.nbytes for b in bufs}},
                  region=packed)
    dec = _decode_scratch(cfg, B, o.ctx, partials=True)
    P = min(o.prefill_chunk, o.ctx)
    # what BatchForward allocates for its largest chunk at the deepest position (prefill_workspace,
    # the same function tightfit.model.batch.workspace_bytes returns)
    pre = prefill_workspace(cfg, P, depth=o.ctx - P,
                            kv_type=None if fmt.name == "f16" else fmt.name)
    dec_bytes = max(v for k, v in dec.items() if k != "attention_partials")
    pre_bytes = pre["total"]
    cub = cublas_workspace_bytes()
    scratch = BillLine("scratch", "Scratch of the batched forward: max(prefill, verify) + cuBLAS",
                       max(dec_bytes, pre_bytes) + cub,
                       "max(verify: T=batch largest block incl. attention partials, "
                       "prefill: T=min(chunk, ctx): resident rows + largest block (GEMM, GDN, "
                       "attention tiles) + logits row, tightfit.plan.budget.prefill_workspace) "
                       "+ the cuBLAS workspace torch keeps for the prefill GEMMs",
                       {"decode_bytes": dec_bytes, "prefill_bytes": pre_bytes, "prefill_tokens": P,
                        "cublas_workspace": cub, "decode": dec, "prefill": pre})
    lines = {"kv_cache": kv, "recurrent_state": state, "workspace": ws, "scratch": scratch}
    if o.include_mtp:              # absent otherwise: plans without MTP stay as they were
        lines["mtp"] = _mtp_line(cfg, o.ctx)
    if o.batch > 1:                # speculation: the captured verify block's own buffers
        lines["verify"] = _verify_line(cfg, o, inv)
    return lines


def _verify_line(cfg: Qwen35Config, o: PlanOptions, inv: ModelInventory | None) -> BillLine:
    """The captured verify block of up to `batch` tokens (tightfit.model.verify_graph): every
    buffer it carves, ONE list with the runtime (verify_buffers), as an arena region. A partial
    accept replays the recurrent state from 2S + 1 floats per head and token (n_gdn_layers x
    (batch - 1) x Hv x (2S + 1) x 4 B); with the logits [batch, V] they are most of the line
    (27B: 33.4 MiB at 5 tokens, 62.0 MiB at 9; 27 / 52 before the GDN rows took the merged
    qkv + gate product, session 24)."""
    from tightfit.model.verify_graph import MAX_M, plan_layouts, verify_buffers
    mats = []
    if inv is not None:
        mats = [(t.name, t.qtype, t.ne[0]) for t in inv.needed(False) if t.is_matrix]
    m = min(o.batch, MAX_M)        # longer blocks leave the skinny GEMV: never captured
    bufs = verify_buffers(cfg, m, o.ctx, o.attn_chunk, plan_layouts(mats))
    _offs, packed = pack(bufs)
    by = {b.name: b.nbytes for b in bufs}
    return BillLine("verify", f"Speculative verify block ({m} tokens, captured)",
                    sum(by.values()),
                    "verify_buffers(batch): activations, logits [batch, V], attention partials, "
                    "conv rows, SSM replay inputs n_gdn x (batch-1) x Hv x (2S+1) x 4",
                    {"tokens": m, "ssm_replay": by.get("v_ssm_in", 0),
                     "logits": by.get("v_logits", 0)}, region=packed)


def _mtp_line(cfg: Qwen35Config, ctx: int) -> BillLine:
    """The MTP drafter beside its block's weights (those are in the `weights` line): its own
    one-layer KV cache and the scratch of its forward, one formula with the runtime
    (tightfit.plan.mtp). It grows with ctx, so every fit and max-ctx search prices it at its ctx.
    Not an arena region: the drafter allocates it itself, next to the arena."""
    from tightfit.plan.mtp import mtp_bytes, mtp_pair_chunk
    parts = mtp_bytes(cfg, ctx, cfg.n_vocab)
    return BillLine("mtp", "MTP drafter: KV cache + step scratch", parts["total"],
                    "ctx x 2 x n_head_kv x head_dim x 2 (fp16 K, V of one layer) + scratch of the "
                    "captured draft step and one eager pair chunk (tightfit.plan.mtp)",
                    {"kv": parts["kv"], "scratch": parts["scratch"],
                     "pair_chunk": mtp_pair_chunk(cfg, ctx), "n_vocab": cfg.n_vocab,
                     "block": f"blk.{cfg.n_layer}"})


def _exchange_tokens(o: PlanOptions, t: TensorSpec) -> int:
    # the output head runs for the last prompt token only (state-only prefill), so B tokens
    return o.batch if t.name == "output.weight" else max(o.batch, min(o.prefill_chunk, o.ctx,
                                                                      EXCHANGE_TOKENS))


def _staging(cfg: Qwen35Config, o: PlanOptions, host_embd: bool, exchange: int) -> BillLine:
    T = max(o.batch, min(o.prefill_chunk, o.ctx, EXCHANGE_TOKENS))
    emb = T * cfg.n_embd * 4 if host_embd else 0
    # NOT priced yet: BatchForward's host-row ring (ring_bytes(), 2 x 32 MiB device) that split
    # rows stream through in prefill chunks of >= RING_MIN_M tokens (a fixed cost once any row is
    # split; pricing it needs the solver to treat it as a step cost, not per moved byte)
    return BillLine("staging", "Staging buffers (device side)", emb + exchange,
                    "host_embd x T x E x 4 + 2 x max_split(tokens x (K + host_rows) x 4)",
                    {"embedding_rows": emb, "row_split_exchange": exchange, "tokens": T})


def _reserve(o: PlanOptions) -> int:
    return o.reserve if o.reserve is not None else RESERVE_FIXED + int(o.available * RESERVE_FRACTION)


# ---- the planner -----------------------------------------------------------------------------
@dataclass
class Plan:
    inventory: ModelInventory
    options: PlanOptions
    placement: Placement
    host_embd: bool
    lines: list[BillLine]
    fits: bool
    max_ctx_that_fits: int = 0
    max_ctx_same_placement: int = 0
    would_fit: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def line(self, key: str) -> BillLine:
        return next(l for l in self.lines if l.key == key)

    @property
    def total_bytes(self) -> int:
        return sum(l.bytes for l in self.lines)

    @property
    def available_bytes(self) -> int:
        return self.options.available

    @property
    def host_weights_bytes(self) -> int:
        return self.placement.host_bytes

    def host_ms_by_type(self) -> dict[str, float]:
        """Estimated host GEMV ms per decode token by format (tightfit.plan.host_speed)."""
        return host_ms_by_type(self.placement, self.inventory.tensors)

    @property
    def host_ms_per_token(self) -> float:
        return sum(self.host_ms_by_type().values())

    def layout(self) -> list[tuple[str, int, int]]:
        """(region, offset, bytes) of the ONE device arena, in order; the reserve is not allocated."""
        out, off = [], 0
        regions = [("weights", self.placement.weights_region_bytes),
                   ("kv_cache", self.line("kv_cache").bytes)]
        bank = self.line("recurrent_state").bytes // STATE_BANKS
        regions += [(f"recurrent_state.bank{i}", bank) for i in range(STATE_BANKS)]
        # not regions: `scratch` (the batched forward's per-chunk tensors) and `mtp` go through
        # torch's caching allocator, inside the budget the arena leaves (session 17: as a region
        # the scratch was reserved AND allocated again by torch, 341 MiB twice on the 27B)
        regions += [(k, self.line(k).region_bytes) for k in ("workspace", "staging")]
        if any(l.key == "verify" for l in self.lines):
            regions.append(("verify", self.line("verify").region_bytes))
        for name, n in regions:
            out.append((name, off, n))
            off = align_up(off + n)
        return out

    @property
    def arena_bytes(self) -> int:
        name, off, n = self.layout()[-1]
        return align_up(off + n)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.inventory.source, "ctx": self.options.ctx,
                             "kv_type": self.options.kv_type, "batch": self.options.batch,
                             "prefill_chunk": self.options.prefill_chunk,
                             "host_embd": self.host_embd}
        for l in self.lines:
            d[f"{l.key}_bytes"] = l.bytes
        d.update(total_bytes=self.total_bytes, available_bytes=self.available_bytes,
                 fits=self.fits, host_weights_bytes=self.host_weights_bytes,
                 max_ctx_that_fits=self.max_ctx_that_fits,
                 max_ctx_same_placement=self.max_ctx_same_placement,
                 split_order=self.options.split_order,
                 host_ms_per_token_est=self.host_ms_per_token,
                 host_ms_by_type_est=self.host_ms_by_type(),
                 arena_bytes=self.arena_bytes,
                 lines=[{"key": l.key, "label": l.label, "bytes": l.bytes, "formula": l.formula,
                         "details": l.details} for l in self.lines],
                 placement=self.placement.summary(self.inventory.tensors),
                 would_fit=self.would_fit, notes=self.notes)
        return d


class _Solver:
    """Aggregates that make one planning attempt O(number of split candidates)."""

    def __init__(self, inv: ModelInventory, o: PlanOptions):
        self.inv, self.o, self.cfg = inv, o, inv.config
        self.needed = inv.needed(o.include_mtp)
        self.emb = inv.tensors["token_embd.weight"]
        self.fixed = _fixed_lines(self.cfg, o, inv)
        # arena regions with their alignment, the other lines (torch's) as they are: the bill's sum
        self.fixed_total = sum(align_up(l.region_bytes) if l.key in ARENA_LINES else l.bytes
                               for l in self.fixed.values())
        self.region_all = sum(align_up(t.nbytes) for t in self.needed)
        self.reserve = _reserve(o)

    def total(self, region: int, host_embd: bool, exchange: int) -> int:
        st = _staging(self.cfg, self.o, host_embd, exchange).bytes
        return region + self.fixed_total + align_up(st) + self.reserve

    def solve(self, split: bool) -> tuple[bool, dict[str, int], bool]:
        """(host_embd, host_rows, fits) following the documented order of moves."""
        o, avail = self.o, self.o.available
        choices = {"no": [False], "yes": [True], "auto": [False, True]}[o.host_embd]
        if o.include_mtp:          # the drafter runs only with the whole model on the GPU
            choices, split = [False], False
        for he in choices:
            region = self.region_all - (align_up(self.emb.nbytes) if he else 0)
            if self.total(region, he, 0) <= avail:
                return he, {}, True
        he = choices[-1]
        host_rows: dict[str, int] = {}
        if not split:
            return he, host_rows, False
        exchange = 0
        for t in split_candidates(self.needed, self.cfg.n_layer, o.split_order):
            rb = t.row_bytes
            while True:
                deficit = self.total(region, he, exchange) - avail
                if deficit <= 0:
                    return he, host_rows, True
                k_old = host_rows.get(t.name, 0)
                if k_old == t.n_rows:
                    break
                k = host_rows_for(t, deficit, k_old)
                region += align_up((t.n_rows - k) * rb) - align_up((t.n_rows - k_old) * rb)
                exchange = max(exchange, 2 * _exchange_tokens(o, t) * (t.ne[0] + k) * 4)
                host_rows[t.name] = k
        return he, host_rows, self.total(region, he, exchange) <= avail

    def exchange_for(self, host_rows: dict[str, int]) -> int:
        ts = self.inv.tensors
        return max([2 * _exchange_tokens(self.o, ts[n]) * (ts[n].ne[0] + k) * 4
                    for n, k in host_rows.items()] or [0])


MIN_PREFILL_CHUNK = 64         # the planner lowers the prefill chunk down to this, never below


def _chunk_ladder(o: PlanOptions) -> list[int]:
    """Prefill chunks the planner may take, largest first: the requested one, then halvings down
    to MIN_PREFILL_CHUNK (a smaller chunk shrinks the prefill scratch line, costs prefill speed)."""
    out = [o.prefill_chunk]
    c = o.prefill_chunk
    while c > MIN_PREFILL_CHUNK:
        c = max(MIN_PREFILL_CHUNK, c // 2)
        out.append(c)
    return out


def _fits_at(inv: ModelInventory, o: PlanOptions, ctx: int,
             fixed: tuple[bool, dict[str, int]] | None = None) -> bool:
    if fixed is not None:          # the same placement: the same (chosen) prefill chunk
        return _fits_at_chunk(inv, o, ctx, fixed)
    # every line shrinks with the chunk: something fits iff the smallest chunk of the ladder fits
    return _fits_at_chunk(inv, replace(o, prefill_chunk=_chunk_ladder(o)[-1]), ctx, fixed)


def _fits_at_chunk(inv: ModelInventory, o: PlanOptions, ctx: int,
                   fixed: tuple[bool, dict[str, int]] | None = None) -> bool:
    s = _Solver(inv, replace(o, ctx=ctx))
    if fixed is None:
        return s.solve(o.split)[2]
    he, host_rows = fixed
    ts = inv.tensors
    region = s.region_all - (align_up(s.emb.nbytes) if he else 0)
    for n, k in host_rows.items():
        region += align_up((ts[n].n_rows - k) * ts[n].row_bytes) - align_up(ts[n].nbytes)
    return s.total(region, he, s.exchange_for(host_rows)) <= o.available


def _max_ctx(inv: ModelInventory, o: PlanOptions, fixed=None) -> int:
    """Largest ctx in [1, n_ctx_train] that fits (every line grows with ctx, so bisect); 0: none."""
    lo, hi = 0, inv.config.n_ctx_train
    if _fits_at(inv, o, hi, fixed):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits_at(inv, o, mid, fixed):
            lo = mid
        else:
            hi = mid
    return lo


def plan_model(inv: ModelInventory, o: PlanOptions) -> Plan:
    """Make the bill and a placement. Order of moves when short: (1) the embedding table to the
    host (`--host-embd auto`; one row per token is decoded on the CPU), (2) output-row splits of
    matrices in `rowsplit.split_candidates` order. Never touches ctx or the KV format. If even
    that does not fit, the prefill chunk is halved (down to MIN_PREFILL_CHUNK) until the bill
    fits: the plan's options then carry the smaller chunk (BatchForward takes it) and a note.

    Speculation (`batch` > 1) never costs the plain decode: when the captured verify block's
    region would move weights to the host (or stop the plan fitting) where the plan without it
    does not, the block shrinks (batch 9 -> 5 -> 3 -> 2) and, if none is free, is left out
    (verify blocks then run eagerly); the plan's options carry the batch it priced, and a note."""
    plan = _plan_at(inv, o)
    if o.batch <= 1:
        return plan
    base = _plan_at(inv, replace(o, batch=1))
    b = o.batch
    while b > 1 and _costs_decode(plan, base):
        b = 1 if b == 2 else (b + 1) // 2
        plan = base if b == 1 else _plan_at(inv, replace(o, batch=b))
    if b < o.batch:
        plan.notes.append(
            f"speculative verify blocks priced for {b} tokens, not {o.batch}: a larger captured "
            "block would move weights to the host" if b > 1 else
            "no captured verify block: its region would move weights to the host; speculative "
            "verify blocks run eagerly (slow: drop --spec or give more VRAM)")
    return plan


def _costs_decode(plan: Plan, base: Plan) -> bool:
    """Whether `plan` is worse than `base` (the same options without speculation): it does not
    fit (a smaller block never makes that worse, and a refusal then names the real shortfall), or
    it places weights on the host that `base` keeps on the GPU."""
    return (not plan.fits or plan.placement.host_bytes > base.placement.host_bytes
            or (plan.host_embd and not base.host_embd))


def _plan_at(inv: ModelInventory, o: PlanOptions) -> Plan:
    cfg = inv.config
    o.validate(cfg)
    asked = o.prefill_chunk
    for c in _chunk_ladder(o):
        s = _Solver(inv, replace(o, prefill_chunk=c))
        he, host_rows, fits = s.solve(o.split)
        if fits:
            o = replace(o, prefill_chunk=c)
            break
    if not fits:
        s = _Solver(inv, o)
        he, host_rows, fits = s.solve(o.split)
    excluded = [t.name for t in inv.excluded(o.include_mtp)]
    rows = dict(host_rows)
    if he:
        rows["token_embd.weight"] = s.emb.n_rows
    placement = build_placement(s.needed, rows, excluded)
    check_exact_cover(placement, inv.tensors)
    lines = [BillLine("weights", "GPU-resident weights", placement.gpu_bytes,
                      "sum of exact GGUF bytes of GPU rows (MTP block included: --mtp)"
                      if o.include_mtp else
                      "sum of exact GGUF bytes of GPU rows (MTP excluded in single-token mode)",
                      {"tensors": len(placement.gpu_segments()),
                       "excluded_bytes": sum(inv.tensors[n].nbytes for n in excluded),
                       "host_bytes": placement.host_bytes})]
    fixed = s.fixed
    staging = _staging(cfg, o, he, s.exchange_for(host_rows))
    region_pad = sum(align_up(l.region_bytes) - l.bytes
                     for l in (*fixed.values(), staging) if l.key in ARENA_LINES)
    lines.append(BillLine("alignment", f"Arena alignment ({256} B)", placement.padding_bytes
                          + region_pad, "sum(align_up(region) - region)",
                          {"weights": placement.padding_bytes, "other_regions": region_pad}))
    lines += [fixed["kv_cache"], fixed["recurrent_state"], fixed["workspace"], fixed["scratch"],
              *([fixed["mtp"]] if "mtp" in fixed else []),
              *([fixed["verify"]] if "verify" in fixed else []), staging,
              BillLine("reserve", "Safety reserve", s.reserve,
                       "override" if o.reserve is not None else
                       f"{RESERVE_FIXED // MiB} MiB + {RESERVE_FRACTION:.0%} of available")]
    plan = Plan(inv, o, placement, he, lines, fits)
    assert (plan.total_bytes <= o.available) == fits, "solver and bill disagree"
    plan.max_ctx_that_fits = _max_ctx(inv, replace(o, prefill_chunk=asked))
    plan.max_ctx_same_placement = _max_ctx(inv, o, (he, host_rows)) if fits else 0
    fmt = kv_format(o.kv_type)
    if o.prefill_chunk != asked:
        plan.notes.append(f"prefill chunk lowered from {asked} to {o.prefill_chunk} tokens: the "
                          f"prefill scratch of {asked}-token chunks does not fit")
    by_type = plan.host_ms_by_type()
    if by_type:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(by_type.items(), key=lambda kv: -kv[1]))
        plan.notes.append(f"host GEMV estimate {sum(by_type.values()):.1f} ms/token ({parts}; "
                          f"bytes / in-model GB/s per format, tightfit.plan.host_speed)")
    if not fmt.runtime:
        plan.notes.append(f"KV format {fmt.name}: priced exactly, but no executor reads it yet")
    elif fmt.name != "f16":
        plan.notes.append(f"KV format {fmt.name}: {kv_bytes_per_token(cfg, fmt):,} B/token, priced "
                          f"exactly; {fmt.note}")
    if not fits:
        plan.would_fit = _would_fit(inv, o)
    if o.include_mtp:              # what the drafter costs; when short, why and what to do
        if fits:
            plan.notes.append(_mtp_cost(plan)["text"])
        else:
            plan.would_fit["mtp"] = _mtp_shortfall(plan)
            plan.notes.append(plan.would_fit["mtp"]["reason"])
    return plan


def _mtp_cost(plan: Plan) -> dict[str, Any]:
    """What the MTP drafter adds to the bill: its block's weights as the arena holds them (each
    tensor aligned) plus the `mtp` line (aligned as the solver counts it)."""
    inv = plan.inventory
    L = inv.config.n_layer
    weights = sum(align_up(t.nbytes) for t in inv.needed(True) if t.layer is not None
                  and t.layer >= L)
    line = align_up(plan.line("mtp").bytes)
    parts = (f"{fmt_bytes(weights + line)}: blk.{L} weights {fmt_bytes(weights)} + KV cache and "
             f"scratch {fmt_bytes(line)}")
    return {"bytes": weights + line, "weights_bytes": weights, "line_bytes": line,
            "parts": parts, "text": f"the MTP drafter costs {parts}"}


def _mtp_shortfall(plan: Plan) -> dict[str, Any]:
    """Why a plan with the MTP drafter does not fit: the drafter runs only with the whole model on
    the GPU (the solver moved nothing to the host), so the whole-GPU bill is over by this much."""
    cost = _mtp_cost(plan)
    over = plan.total_bytes - plan.available_bytes
    # a smaller ctx is advice only when one fits (the weights alone may be too many)
    smaller = " or a smaller --ctx" if (plan.would_fit or {}).get("max_ctx") else ""
    reason = (f"the MTP drafter needs the whole model on the GPU: {fmt_bytes(over)} more than is "
              f"available at ctx {plan.options.ctx} (it costs {cost['parts']}); drop mtp from --spec (or "
              f"--mtp), or give more VRAM{smaller}")
    return {"bytes": cost["bytes"], "weights_bytes": cost["weights_bytes"],
            "line_bytes": cost["line_bytes"], "over_bytes": over, "reason": reason}


def _would_fit(inv: ModelInventory, o: PlanOptions) -> dict[str, Any]:
    """What would fit: the largest ctx with these options, and which matrix rows would have to move
    to the host at the requested ctx if every move were allowed (None if even that fails)."""
    free = replace(o, split=True, host_embd="auto" if o.host_embd == "no" else o.host_embd)
    d: dict[str, Any] = {"max_ctx": _max_ctx(inv, o), "max_ctx_with_moves": _max_ctx(inv, free)}
    he, host_rows, ok = _Solver(inv, free).solve(True)
    if ok:
        ts = inv.tensors
        moves = ([{"tensor": "token_embd.weight", "bytes": ts["token_embd.weight"].nbytes,
                   "rows": ts["token_embd.weight"].n_rows}] if he else [])
        moves += [{"tensor": n, "rows": k, "bytes": k * ts[n].row_bytes,
                   "type": type_name(ts[n].qtype)} for n, k in host_rows.items()]
        d["move_to_host"] = moves
        d["move_to_host_bytes"] = sum(m["bytes"] for m in moves)
    else:
        d["move_to_host"] = None
        d["move_to_host_bytes"] = None
    return d


def require_fit(plan: Plan) -> Plan:
    if plan.fits:
        return plan
    over = plan.total_bytes - plan.available_bytes
    w = plan.would_fit or {}
    parts = [f"the bill is {fmt_bytes(plan.total_bytes)} but only {fmt_bytes(plan.available_bytes)}"
             f" is available ({fmt_bytes(over)} over) at ctx {plan.options.ctx}"]
    if w.get("max_ctx"):
        parts.append(f"largest ctx that fits: {w['max_ctx']}")
    else:
        parts.append("no ctx fits with these options")
    if w.get("max_ctx_with_moves", 0) > w.get("max_ctx", 0):
        parts.append(f"largest ctx with --host-embd auto and row splits: {w['max_ctx_with_moves']}")
    if w.get("move_to_host_bytes") and (not plan.options.split or plan.options.host_embd == "no"):
        parts.append(f"or move {fmt_bytes(w['move_to_host_bytes'])} of matrix rows to the host "
                     f"({len(w['move_to_host'])} matrices; allow --host-embd auto and row splits)")
    if w.get("mtp"):
        parts.append(w["mtp"]["reason"])
    raise PlanError("; ".join(parts))


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """'16GiB', '7.6GB', '7600MiB', '123456789' -> bytes. SI units are powers of 1000, IEC units
    powers of 1024; a bare K/M/G/T means the IEC unit (as nvidia-smi and most CLIs use)."""
    import re
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([KMGT]?)(i?)(B?)\s*", text, re.I)
    if not m or (m.group(3) and not m.group(2)):
        raise UserError(f"cannot read size {text!r}; use e.g. 16GiB, 7.6GB, 7600MiB or bytes")
    num, prefix, iec, b = float(m.group(1)), m.group(2).upper(), m.group(3), m.group(4)
    exp = "KMGT".find(prefix) + 1 if prefix else 0
    base = 1000 if (prefix and not iec and b) else 1024
    return int(round(num * base ** exp))
