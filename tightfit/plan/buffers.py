"""The GPU executor's persistent step buffers, itemized (the plan's `workspace` line).

`step_buffers(...)` lists every device buffer that `tightfit.model.executor.GPUModel` holds besides
the weights and the per-sequence state (KV cache, recurrent banks): name, shape, dtype. The
planner prices the `workspace` line as the exact sum of these buffers' bytes (each one starts at
an ARENA_ALIGN boundary inside the region; that padding goes to the `alignment` line), and the
executor carves exactly these buffers, in this order, out of the arena's workspace region (or out
of one allocation of `packed_bytes` on the legacy path). Nothing else is allocated on the device
by the decode step, so the bill and the allocation are the same list.

Items (fp32 unless stated; E n_embd, H heads, D head_dim, V vocabulary):

* `status` int32 [4]: the first live state's status word (placed path only);
* `tok_id` int64 [1]: the token id the captured step embeds (device embedding lookup);
  `ids_ring` int64 [IDS_RING]: ids sampled on the device (greedy loop), by position;
  `argmax_val` [nb], `argmax_idx` int32 [nb], nb = ceil(V / ARGMAX_BLOCK): two-stage argmax;
* activations of one token: x, xn, mix, ffo [1, E]; u [1, conv_dim], y [conv_dim];
  zg, on [1, value_dim], o [Hv, S]; alpha, beta [1, Hv]; qg [1, 2 H D]; kk, vv [1, kv_dim];
  q [H, D]; ao [1, H D]; g, up, h [1, n_ff]; logits [1, V];
* RoPE tables cos, sin [ctx, n_rot / 2];
* split-K attention partials attn_m, attn_l [H, nch], attn_acc [H, nch, D], nch = ceil(ctx /
  chunk) (always allocated: the mode is chosen by position at run time);
* quantized KV cache (kv_type): rotation R [D, D], codebooks kcb, vcb [16], q_rot, o_rot [H, D]
  (attn_decode_q), write rows kvw_k, kvw_v [Hkv, D] and per K/V tables cb, mid [16] and 1/gain
  [GAIN_SEARCH] (kv_write_q);
* int8 activation copies for the quantized GEMV, one set per (input, layout) that a device
  matrix reads (tightfit.kernels.gemv_route.act_buffers: v1 q int8 [1, k], d [1, k/32], s16
  int32 [1, k/16]; small-N path q, xs [1, k/S], xsum [1, k/32], b), and `gemv_part`, the
  small path's split-K partials (gemv_route.split_bound); `mma_fixup` uint8, the tensor-core
  GEMV's fixup workspace (gemv_mma.fixup_workspace_bytes: tile counters for the largest n_out
  that can route there + 2 partial slots per warp of the largest grid), when any matrix can take
  that route (`mma_rows`); the SM count is the H200's (DEFAULT_SMS) unless given;
* decoded copies of non-F32 vector tensors (norm weights, conv kernel, ssm scalars).

What is not here: kernel constant tables that the kernel modules cache per device (a few KB,
shared by every model; they count against the reserve), the CUDA graphs themselves (driver
memory, reserve; the captured step allocates nothing, so the graph pool stays empty), and the
batched forward's per-chunk tensors (tightfit.model.batch; priced by the `scratch` line).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

DTYPE_BYTES = {"f32": 4, "i32": 4, "i64": 8, "i8": 1, "u8": 1}
IDS_RING = 256            # device-sampled ids kept between two host reads of the greedy loop
ARGMAX_BLOCK = 4096       # logits per program of the first argmax stage
DEFAULT_ATTN_CHUNK = 512  # rows per split-K chunk (tightfit.kernels.attn_decode.DEFAULT_CHUNK)
DEFAULT_SMS = 132         # H200 SMs: sizes the mma_fixup slots when the plan knows no device

# which activation buffer each matrix of a block reads (the executor's _linears calls)
_INPUT_OF = {"attn_qkv": "xn", "attn_gate": "xn", "ssm_beta": "xn", "ssm_alpha": "xn",
             "attn_q": "xn", "attn_k": "xn", "attn_v": "xn", "ffn_gate": "xn", "ffn_up": "xn",
             "ssm_out": "on", "attn_output": "ao", "ffn_down": "h"}


@dataclass(frozen=True)
class Buf:
    name: str
    shape: tuple[int, ...]
    dtype: str = "f32"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def matrix_input(name: str) -> str | None:
    """The activation buffer that matrix `name` reads in the decode step (None: not a matrix)."""
    if name == "output.weight":       # (a tied head reads token_embd under this name)
        return "xn"
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk":
        return _INPUT_OF.get(parts[2])
    return None


def act_layouts(matrices: Iterable[tuple[str, int, int]],
                layout_of=None) -> dict[str, tuple[int, ...]]:
    """{input buffer: activation layouts} that the quantized GEMV needs, from (name, ggml type,
    row length) of every matrix with device rows. A matrix takes the quantized path when
    tightfit.kernels.gemv has a kernel for its type and its rows are whole 256-blocks (as
    executor.Linear decides); F32/F16/BF16 matrices read the fp32 activations directly.
    `layout_of(qtype)`: the layout a matrix's input takes (default: the one-token step's,
    gemv_route.act_layout; the verify block passes its own, verify_graph.block_layout)."""
    try:
        from tightfit.kernels import gemv as gm
        from tightfit.kernels.gemv_route import act_layout
    except Exception:  # noqa: BLE001 - no GEMV module: every matrix runs the reference path
        return {}
    layout_of = layout_of or act_layout
    out: dict[str, set[int]] = {}
    for name, qtype, n_in in matrices:
        inp = matrix_input(name)
        if inp is None or qtype in gm.FLOAT_TYPES or qtype not in gm.QUANT_TYPES or n_in % 256:
            continue
        out.setdefault(inp, set()).add(layout_of(qtype))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def mma_rows(matrices: Iterable[tuple[str, int, int, int]]) -> int:
    """Largest n_out among (name, ggml type, n_in, n_out) matrices that can run on the tensor-core
    GEMV (gemv_route.mma_routed: a CUDA-layout type with a crossover, whole 256-blocks; the
    TIGHTFIT_GEMV_MMA switch is a run-time choice, so it is not consulted), else 0."""
    try:
        from tightfit.kernels.gemv_route import act_layout, is_cuda, mma_min_n
    except Exception:  # noqa: BLE001 - no GEMV module: no tensor-core route
        return 0
    best = 0
    for name, qtype, n_in, n_out in matrices:
        if matrix_input(name) is None or n_in % 256 or mma_min_n(int(qtype)) is None:
            continue
        if is_cuda(act_layout(int(qtype))):
            best = max(best, int(n_out))
    return best


def vector_shapes(tensors: Iterable[tuple[str, int, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    """{name: numpy shape} of the vector tensors (1-D or config.is_vector_tensor) that are not F32:
    the executor keeps a decoded fp32 copy of those on the device."""
    from tightfit.model.config import Qwen35Config
    out = {}
    for name, qtype, ne in tensors:
        if (len(ne) == 1 or Qwen35Config.is_vector_tensor(name)) and int(qtype) != 0:
            out[name] = tuple(int(d) for d in reversed(tuple(ne)))
    return out


def step_buffers(cfg: Any, ctx: int, kv_type: str | None = None,
                 chunk: int = DEFAULT_ATTN_CHUNK,
                 layouts: dict[str, tuple[int, ...]] | None = None,
                 vectors: dict[str, tuple[int, ...]] | None = None,
                 with_status: bool = True, mma_n_out: int = 0,
                 sms: int = DEFAULT_SMS) -> list[Buf]:
    """The executor's device buffers, in carving order (see the module docstring)."""
    E, H, D, V = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_vocab
    nb = -(-V // ARGMAX_BLOCK)
    b: list[Buf] = []
    if with_status:
        b.append(Buf("status", (4,), "i32"))
    b += [Buf("tok_id", (1,), "i64"), Buf("ids_ring", (IDS_RING,), "i64"),
          Buf("argmax_val", (nb,)), Buf("argmax_idx", (nb,), "i32")]
    b += [Buf(n, (1, E)) for n in ("x", "xn", "mix", "ffo")]
    b += [Buf("u", (1, cfg.conv_dim)), Buf("y", (cfg.conv_dim,)),
          Buf("zg", (1, cfg.value_dim)), Buf("o", (cfg.ssm_v_heads, cfg.ssm_state)),
          Buf("on", (1, cfg.value_dim)), Buf("alpha", (1, cfg.ssm_v_heads)),
          Buf("beta", (1, cfg.ssm_v_heads)), Buf("qg", (1, 2 * H * D)),
          Buf("kk", (1, cfg.kv_dim)), Buf("vv", (1, cfg.kv_dim)), Buf("q", (H, D)),
          Buf("ao", (1, H * D))]
    b += [Buf(n, (1, cfg.n_ff)) for n in ("g", "up", "h")]
    b.append(Buf("logits", (1, V)))
    half = cfg.n_rot // 2
    b += [Buf("cos", (int(ctx), half)), Buf("sin", (int(ctx), half))]
    nch = max(1, -(-int(ctx) // int(chunk)))
    b += [Buf("attn_m", (H, nch)), Buf("attn_l", (H, nch)), Buf("attn_acc", (H, nch, D))]
    if kv_type:
        from tightfit.kvquant.reference import GAIN_SEARCH
        Hkv = cfg.n_head_kv
        b += [Buf("kvq_R", (D, D)), Buf("kvq_kcb", (16,)), Buf("kvq_vcb", (16,)),
              Buf("kvq_q_rot", (H, D)), Buf("kvq_o_rot", (H, D)),
              Buf("kvw_k", (Hkv, D)), Buf("kvw_v", (Hkv, D))]
        for i in range(2):
            b += [Buf(f"kvw_cb{i}", (16,)), Buf(f"kvw_mid{i}", (16,)),
                  Buf(f"kvw_invf{i}", (int(GAIN_SEARCH),))]
    width = {"xn": E, "on": cfg.value_dim, "ao": H * D, "h": cfg.n_ff}
    small = False
    for inp, lays in sorted((layouts or {}).items()):
        k = width[inp]
        for lay in lays:
            from tightfit.kernels.gemv_route import act_buffers, is_small
            small = small or is_small(lay)
            b += [Buf(f"act_{inp}_{lay}_{suffix}", shape, dt)
                  for suffix, shape, dt in act_buffers(lay, k)]
    if small:       # split-K partials of the small-N GEMV path (gemv_route.split_bound)
        from tightfit.kernels.gemv_route import split_bound
        b.append(Buf("gemv_part", (split_bound(1),)))
    if mma_n_out > 0:   # tensor-core GEMV fixup workspace (gemv_mma.fixup_workspace_bytes)
        from tightfit.kernels.gemv_mma import fixup_workspace_bytes
        b.append(Buf("mma_fixup", (fixup_workspace_bytes(mma_n_out, sms),), "u8"))
    for name, shape in sorted((vectors or {}).items()):
        b.append(Buf(f"vec:{name}", tuple(shape)))
    return b


def pack(bufs: list[Buf], align: int | None = None) -> tuple[dict[str, int], int]:
    """({name: byte offset}, bytes of the packed region): each buffer at an `align` boundary."""
    if align is None:
        from tightfit.plan.placement import ARENA_ALIGN
        align = ARENA_ALIGN
    offs, off = {}, 0
    for x in bufs:
        offs[x.name] = off
        off = (off + x.nbytes + align - 1) // align * align
    return offs, off
