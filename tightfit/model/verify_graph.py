"""The speculative verify block as a captured CUDA graph per (M, attention mode) (issue 10).

`VerifyGraph(model, m_max)` runs a block of M <= m_max <= 16 tokens [last, d_1..d_k] through a
tightfit.model.executor.GPUModel without committing, like BatchForward.forward_block, but the way
the one-token step runs: every buffer is planned up front (`verify_buffers`, carved from ONE
allocation of exactly that list), the position and the active recurrent bank are read on the
device from the state's status word, and the pass makes no host sync, so on CUDA it is captured
once per (M, attention mode) and state, then replayed.

The pass (tightfit.kernels.block_step for the block-shaped kernels, the executor's own ops for
the rest): embedding of the M ids from the device buffer `v_ids` (tightfit.kernels.embed, when
the executor embeds on the device; else the host decodes the M rows into `v_x` before the replay,
as the step's fallback does) -> 64 blocks: RMSNorm; Gated DeltaNet = 4 matrices at N = M columns
(qkv straight into this layer's `v_conv_rows`; where the executor merged qkv + gate and beta +
alpha (tightfit.model.merge), one launch each, their consumers reading the column parts through
the row stride), conv over the block from the active bank, the
delta rule token after token (after the last token the state goes to the staging bank; for each
earlier token t its replay inputs k, delta, decay into `v_ssm_in[layer, t]`), gated norm,
ssm_out; attention = 3 matrices, q/k norm + RoPE and K/V rows at status[2] + t, M causal queries
over the cache (single pass while p0 + M <= attn_decode.SINGLE_PASS_MAX, else split-K), gate,
attn_output; FFN (gate + up one launch where merged, the SwiGLU reading the halves) -> final
norm -> LM head
[M, V] -> a finiteness check into the block's private status word `v_status` -> each row's
argmax, with that flag and the state's status words 1-2, into `v_out` (the host's ONE read after
the replay: the caller skips the state's sync before the block, and a greedy round needs no
launch after it).

Matrices go through the GEMV route of the step (gemv_route: quantize once per (input, layout),
`gemv_act`) with M columns; a small-path layout is used when gemv_route.act_buffers takes a
column count (the N <= 16 path), else the matrix's v1 layout (any N <= 16).

`Block.commit(j)` keeps block tokens 0..j-1 with three small launches (block_step.commit_block:
staging bank <- conv window after token j-1 (bank rows + u rows) and the SSM state after token
j-1 replayed from the active bank and v_ssm_in[:, :j] (for j < M; j = M: already there), then
bank flip + position advance on the device), nothing re-run; the KV rows of the rejected tokens
are abandoned.

Not taken (BatchForward.forward_block stays eager): row-split models (host rows mid-pass), a
quantized KV cache (no block kernels for the codes yet), a placed model whose plan priced no
verify region of the block's size (PlanOptions.batch), matrices on the torch reference path while
use_triton is on. Switch: TIGHTFIT_VERIFY_GRAPH = auto (CUDA only, default) | 1 (also CPU:
the same pass run eagerly, for tests) | 0 (off).

Memory: `verify_buffers(cfg, M, ...)`; the replay inputs, n_rec * (M-1) * Hv * (2S + 1) * 4 bytes
(27B: 2.3 MiB per extra token, where per-position states took 144 MiB until session 19), the
logits [M, V] and the GDN rows [n_rec, M, conv_dim + value_dim] (wide enough for the merged qkv +
gate product: +1.1 MiB per token on the 27B, session 24) are most of it: 33.4 MiB for the 27B's
5-token block, 62.0 MiB for 9 (`tightfit plan --preset qwen3.8-27b-seedmix --batch 5|9`).
"""
from __future__ import annotations

import inspect
import os
import time
import weakref
from typing import Any, Sequence

import numpy as np
import torch

from tightfit.kernels import attn_decode as A
from tightfit.kernels import block_step as BS
from tightfit.model import onetime
from tightfit.plan.buffers import Buf, matrix_input, pack
from tightfit.runtime.state import NonFiniteError, StateError

MAX_M = 16

# Round anatomy for benchmarks (bench/spec.py, TIGHTFIT_ROUND_TRACE): while this is a list, run()
# and commit() append (label, perf_counter seconds, CUDA event or None) at their steps; None (the
# default) costs one global read per step.
TRACE: list | None = None


def _mark(label: str, event: bool = False) -> None:
    if TRACE is not None:
        ev = None
        if event:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        TRACE.append((label, time.perf_counter(), ev))


_DT = {"f32": torch.float32, "i32": torch.int32, "i64": torch.int64, "i8": torch.int8,
       "u8": torch.uint8}

# per model: (its lin dict, its length, the set of its matrices' kinds) for VerifyGraph.supports
_KINDS: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def enabled_for(device: torch.device) -> bool:
    v = os.environ.get("TIGHTFIT_VERIFY_GRAPH", "auto").strip().lower()
    if v in ("0", "off", "no", "false"):
        return False
    if v in ("1", "on", "yes", "true"):
        return True
    return torch.device(device).type == "cuda"


def _act_buffers_take_n() -> bool:
    from tightfit.kernels.gemv_route import act_buffers
    try:
        return len(inspect.signature(act_buffers).parameters) >= 3
    except (TypeError, ValueError):
        return False


def block_layout(qtype: int) -> int:
    """Activation layout of a quantized matrix in the block (M columns): the step's layout when
    its path takes M columns (small path with a column-aware act_buffers), else v1's."""
    from tightfit.kernels import gemv as gm
    from tightfit.kernels.gemv_route import act_layout, is_small
    lay = act_layout(qtype)
    if is_small(lay) and not _act_buffers_take_n():
        lay = int(gm.ACT_LAYOUT.get(int(qtype), 0))
    return int(lay)


def act_specs(layout: int, k: int, m: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(suffix, shape, dtype) of x [m, k] quantized for `layout`."""
    from tightfit.kernels.gemv_route import act_buffers, is_small
    if _act_buffers_take_n():
        return [(s, tuple(sh), dt) for s, sh, dt in act_buffers(layout, k, m)]
    if is_small(layout) and m != 1:
        raise ValueError(f"layout {layout}: the small GEMV path takes one column here")
    return [(s, (m,) + tuple(sh[1:]), dt) for s, sh, dt in act_buffers(layout, k)]


def plan_layouts(mats) -> dict[str, tuple[int, ...]]:
    """{input: block layouts} of the trunk matrices (name, ggml type, row length) that take the
    quantized GEMV (as executor.Linear.classify decides on the GPU): what VerifyGraph finds in
    an executor's `lin`, computed from a model file's inventory for the plan."""
    from tightfit.plan.buffers import act_layouts
    return act_layouts(mats, layout_of=block_layout)


def verify_buffers(cfg: Any, m: int, ctx: int, chunk: int,
                   layouts: dict[str, tuple[int, ...]] | None = None) -> list[Buf]:
    """Every device buffer of the verify block for up to m tokens (carving order)."""
    E, H, D, V = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_vocab
    Hv, S = cfg.ssm_v_heads, cfg.ssm_state
    n_rec = max(1, len(cfg.recurrent_ids))
    b = [Buf("v_ids", (m,), "i64"), Buf("v_status", (4,), "i32")]
    b += [Buf(f"v_{n}", (m, E)) for n in ("x", "xn", "mix", "ffo")]
    b.append(Buf("v_xpk", (m, E // 2), "i32"))     # a norm's output as bf16 pairs (_pack_wanted)
    b += [Buf("v_y", (m, cfg.conv_dim)), Buf("v_zg", (m, cfg.value_dim)), Buf("v_o", (m, Hv, S)),
          Buf("v_on", (m, cfg.value_dim)), Buf("v_ba", (m, 2 * Hv)),
          Buf("v_qg", (m, 2 * H * D)), Buf("v_kk", (m, cfg.kv_dim)), Buf("v_vv", (m, cfg.kv_dim)),
          Buf("v_q", (m, H, D)), Buf("v_ao", (m, H * D))]
    # gate and up: one [m, 2 n_ff] buffer, the column halves of a merged product or two flat halves
    b += [Buf("v_gu", (m, 2 * cfg.n_ff)), Buf("v_h", (m, cfg.n_ff))]
    b.append(Buf("v_logits", (m, V)))
    # each row's argmax + the block's flag + the state's flag and position: the host's one read
    nb = BS.argmax_parts(V)
    b += [Buf("v_am_val", (m, nb)), Buf("v_am_idx", (m, nb), "i32"), Buf("v_out", (m + 3,), "i64")]
    nch = max(1, -(-int(ctx) // int(chunk)))
    b += [Buf("v_attn_m", (m * H, nch)), Buf("v_attn_l", (m * H, nch)),
          Buf("v_attn_acc", (m * H, nch, D))]
    # per GDN layer the qkv rows (kept for the commit) and, where qkv + gate run as one launch,
    # the gate's beside them: rows of conv_dim + value_dim (VerifyGraph.conv_rows)
    b += [Buf("v_conv_rows", (n_rec, m, cfg.conv_dim + cfg.value_dim)),
          Buf("v_ssm_in", (n_rec, max(1, m - 1), Hv, 2 * S + 1))]
    width = {"xn": E, "on": cfg.value_dim, "ao": H * D, "h": cfg.n_ff}
    small = False
    from tightfit.kernels.gemv_route import is_small, split_bound
    for inp, lays in sorted((layouts or {}).items()):
        for lay in lays:
            small = small or is_small(lay)
            b += [Buf(f"v_act_{inp}_{lay}_{s}", sh, dt) for s, sh, dt in act_specs(lay, width[inp], m)]
    if small:
        b.append(Buf("v_gemv_part", (split_bound(m),)))
    return b


class _Views:
    """The buffers of one block size M (leading-M views of the m_max buffers). v_ba holds the GDN
    gates: with `ba_merged` (ssm_beta and ssm_alpha one launch, merge.py) row t is [beta_t,
    alpha_t] and beta / alpha are its two column halves; else two contiguous [M, Hv] blocks.
    v_gu holds the FFN's gate and up outputs the same way: g_m / up_m the column halves (a layer
    whose ffn_gate + ffn_up run as one launch), g / up two contiguous [M, n_ff] blocks."""

    def __init__(self, ws: dict[str, torch.Tensor], M: int, ba_merged: bool = False):
        for n, t in ws.items():
            if n.startswith("v_act_") or n in ("v_status", "v_gemv_part", "v_attn_m",
                                              "v_attn_l", "v_attn_acc", "v_conv_rows",
                                              "v_ssm_in", "v_am_val", "v_am_idx", "v_out"):
                continue
            setattr(self, n[2:], t[:M])
        hv = ws["v_ba"].shape[1] // 2
        f = ws["v_gu"].shape[1] // 2
        flat = self.gu.reshape(-1)
        self.g, self.up = flat[:M * f].view(M, f), flat[M * f:].view(M, f)
        self.g_m, self.up_m = self.gu[:, :f], self.gu[:, f:]
        self.ba_merged = ba_merged
        if ba_merged:
            self.beta, self.alpha = self.ba[:, :hv], self.ba[:, hv:]
        else:
            flat = self.ba.reshape(-1)
            self.beta, self.alpha = flat[:M * hv].view(M, hv), flat[M * hv:].view(M, hv)


def planned_tokens(model: Any) -> int:
    """Tokens of the plan's verify region of a placed model (0: none, or not placed)."""
    placed = getattr(model, "placed", None)
    if placed is None or "verify" not in getattr(placed.arena, "regions", {}):
        return 0
    return min(int(placed.plan.options.batch), MAX_M)


def unplanned_verify(model: Any) -> bool:
    """A placed model without host rows whose plan priced no verify region: its speculative
    blocks can only run eagerly, slower than plain decoding (the placed 27B: 96 tokens in 13.2 s
    against 8.1 plain, session 18) and with tensors beside the plan (+36 MiB over total -
    reserve). Planned with batch = draft + 1 (serve --spec does), the captured block runs in the
    plan's region (4.5 s, 18 MiB under). Host-row placements never take the captured block."""
    return (getattr(model, "placed", None) is not None and not getattr(model, "hostw", None)
            and not planned_tokens(model))


def planned_region(model: Any) -> torch.Tensor | None:
    """The plan's verify region (arena bytes) of a placed model, else None."""
    if not planned_tokens(model):
        return None
    return model.placed.arena.region("verify")


class VerifyGraph:
    def __init__(self, model: Any, m_max: int):
        if not 1 <= m_max <= MAX_M:
            raise ValueError(f"verify block of {m_max} tokens: 1..{MAX_M}")
        self.m = model
        self.c = c = model.config
        self.m_max = int(m_max)
        self.layout: dict[str, int] = {}
        layouts: dict[str, set] = {}
        for name, L in model.lin.items():
            if L.kind == "quant" and not c.is_mtp_tensor(name):   # the block never runs blk.<n_layer>
                lay = block_layout(L.qtype)
                self.layout[name] = lay
                layouts.setdefault(matrix_input(name), set()).add(lay)
        self.bufs = verify_buffers(c, self.m_max, model.n_ctx, model.chunk,
                                   {k: tuple(sorted(v)) for k, v in layouts.items()})
        offs, packed = pack(self.bufs)
        planned = planned_region(model)
        if planned is not None:          # a placed model: the plan's `verify` region
            if packed > planned.numel():
                raise StateError(f"the verify block of {self.m_max} tokens needs {packed} B; "
                                 f"the plan's verify region holds {planned.numel()} B")
            self.region = planned[:packed]
        else:
            self.region = torch.empty(packed, dtype=torch.uint8, device=model.device)   # ONE allocation
        self.ws: dict[str, torch.Tensor] = {}
        for bf in self.bufs:
            t = self.region[offs[bf.name]:offs[bf.name] + bf.nbytes].view(_DT[bf.dtype]).view(bf.shape)
            t.zero_()
            self.ws[bf.name] = t
        self.status = self.ws["v_status"]
        # qkv + gate as one launch (where the executor merged them in every GDN layer): each
        # layer's rows are [u_t | zg_t], and the conv, the gated norm and the commit read u and
        # zg through the row stride; else u rows are contiguous (conv_dim apart) and zg is v_zg
        self.qkv_merged = self._qkv_merged()
        rows = self.ws["v_conv_rows"]
        n_rec, m_, cw = rows.shape
        rs = cw if self.qkv_merged else c.conv_dim
        self.conv_rows_w = rows                      # [n_rec, m, conv_dim + value_dim]
        self.conv_rows = rows.as_strided((n_rec, m_, c.conv_dim), (m_ * cw, rs, 1))
        self.ssm_in = self.ws["v_ssm_in"]
        self.attn_ws = (self.ws["v_attn_m"], self.ws["v_attn_l"], self.ws["v_attn_acc"])
        self.part = self.ws.get("v_gemv_part")
        self._views: dict[int, _Views] = {}
        self._acts: dict[tuple[int, str, int], Any] = {}
        self._fresh: set = set()   # (M, input, layout) whose int8 copy its producer just wrote
        self.quantized_apart: list[str] = []
        self._packed: set = set()  # (M, input) whose bf16 pairs (v_xpk) its producer just wrote
        self._graphs: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
        # per state: {(M, j): graph of commit(j) after an M-token block} (_capture_commits)
        self._commits: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
        self._commit_warm = False  # the commit kernels compiled (one warm-up serves every state)
        self.serial = 0            # passes run; a Block commits only the latest one
        self.replays = 0           # graph replays (tests, bench)
        t = model.use_triton
        self.op_conv = BS.conv_block if t else BS.conv_block_ref
        self.op_gdn = BS.gdn_block if t else BS.gdn_block_ref
        self.op_qk = BS.qk_prep_block if t else BS.qk_prep_block_ref
        self.op_attn = BS.attn_block if t else BS.attn_block_ref
        self.op_commit_block = BS.commit_block if t else BS.commit_block_ref
        self.op_argmax = BS.argmax_rows if t else BS.argmax_rows_ref
        self.out = self.ws["v_out"]
        self._ids_host = (torch.empty(self.m_max, dtype=torch.int64).pin_memory()
                          if model.device.type == "cuda" else None)
        self._ids_np = self._ids_host.numpy() if self._ids_host is not None else None

    def workspace_bytes(self) -> int:
        return int(self.region.numel())

    @staticmethod
    def supports(model: Any, st: Any, n: int) -> bool:
        """Whether the block of n tokens on this model/state can take the graph path. A placed
        model takes it when it has no host rows and its plan priced a verify region of >= n
        tokens (PlanOptions.batch)."""
        if not 1 <= n <= MAX_M or getattr(model, "hostw", None) or not hasattr(model, "op_norm"):
            return False
        if getattr(model, "placed", None) is not None and n > planned_tokens(model):
            return False
        if getattr(st, "kv_type", None) or getattr(model, "kv_type", None):
            return False
        # the matrices' kinds, once per model (every round asks; the ~500 matrices took ~0.03 ms)
        lin = model.lin
        hit = _KINDS.get(model)
        if hit is None or hit[0] is not lin or hit[1] != len(lin):
            hit = (lin, len(lin), frozenset(L.kind for L in lin.values()))
            try:
                _KINDS[model] = hit
            except TypeError:       # not weak-referenceable: no cache
                pass
        return hit[2] <= ({"quant", "float"} if model.use_triton else {"ref"})

    # ---- buffers per M ------------------------------------------------------------------------
    def views(self, M: int) -> _Views:
        v = self._views.get(M)
        if v is None:
            v = self._views[M] = _Views(self.ws, M, self._ba_merged())
        return v

    def _qkv_merged(self) -> bool:
        """Whether the executor runs every GDN layer's attn_qkv + attn_gate as one launch (then
        so does the block: one [M, conv_dim + value_dim] product per layer, saving a launch's ramp
        and tail: 5.2 us per layer at M = 5 on the 27B, session 24)."""
        c = self.c
        return bool(c.recurrent_ids) and all(
            self._merged_pair([f"blk.{il}.attn_qkv.weight", f"blk.{il}.attn_gate.weight"])
            is not None for il in c.recurrent_ids)

    def _ba_merged(self) -> bool:
        """Whether the executor runs every GDN layer's ssm_beta + ssm_alpha as one launch (then
        so does the block: one [M, 2 Hv] product whose halves the GDN kernel reads strided)."""
        c, merged = self.c, getattr(self.m, "merged", {})
        return bool(c.recurrent_ids) and all(
            getattr(merged.get(f"blk.{il}.ssm_beta.weight"), "names", ()) ==
            (f"blk.{il}.ssm_beta.weight", f"blk.{il}.ssm_alpha.weight")
            for il in c.recurrent_ids)

    def _merged_pair(self, names):
        """The executor's merged group of exactly these matrices (merge.py: one launch whose
        output rows are the parts' side by side), or None. Why: at M = 5 a launch of the FFN's
        gate or up costs its fixed ramp and tail on top of its bytes; one launch of both pays it
        once (7.6 us less per IQ4_XS pair on the 27B, session 24; the step merges them since
        session 6)."""
        g = getattr(self.m, "merged", {}).get(names[0])
        return g if g is not None and tuple(g.names) == tuple(names) else None

    def _act(self, M: int, inp: str, lay: int, k: int):
        key = (M, inp, lay)
        a = self._acts.get(key)
        if a is None:
            from tightfit.kernels.gemv_route import make_act
            bufs = {}
            for s, sh, _dt in act_specs(lay, k, M):
                flat = self.ws[f"v_act_{inp}_{lay}_{s}"].view(-1)
                n = int(np.prod(sh))
                bufs[s] = flat[:n].view(sh)
            a = self._acts[key] = make_act(lay, bufs, M, k)
        return a

    def _produce(self, op, args: tuple, x: torch.Tensor, inp: str, M: int, names) -> None:
        """op(*args) writing x (block input `inp` of the matrices `names`), fused with x's int8
        copy for the first of their layouts that the producers can write (quantize_act layouts
        0-3, or the CUDA layout 200 = layout 0's buffers), as the step does (executor
        `_produce`): the block then skips that separate quantize launch (241 of 257 per pass; on
        the H200 inside the captured graph they cost only ~0.04 ms of 16.1 at M = 5, session 9).
        TIGHTFIT_FUSE_QUANT=0 (the model's fuse_quant) turns it off. The matrices that gemv_mmh
        takes read x as bf16 pairs instead, which the norm writes beside (or instead of) the int8
        copy where _pack_wanted says so."""
        pack = self._pack_wanted(op, x, M, names)
        lay = self._fusable([n for n in names if n not in pack], x.shape[-1])
        kw: dict = {}
        if lay is not None:
            qa = self._act(M, inp, lay, x.shape[-1])
            kw.update(quant_out=(qa.q, qa.d, qa.s16), quant_layout=qa.layout)
            self._fresh.add((M, inp, lay))
        if pack:
            kw["pack_out"] = self.views(M).xpk.view(torch.bfloat16)
            self._packed.add((M, inp))
        op(*args, **kw)

    def _pack_wanted(self, op, x: torch.Tensor, M: int, names) -> set:
        """The matrices of `names` that take gemv_mmh's kind "foldp" on x packed by the producer:
        those gemv_mmh takes (IQ4_XS, wide, 4..8 columns), when the producer is the Triton norm
        (it writes the pairs in the same pass) and x fits the pack buffer (the model's width).
        Measured on the H200 (session 18, bench/mmh.py): 5120 -> 17408 at N = 5 26.6 us against
        29.4 for the fp32-x "table" kind, 5120 -> 10240 17.7 against 19.5.
        TIGHTFIT_MMH_PACK=0 (or TIGHTFIT_FUSE_QUANT=0) keeps the table kind."""
        if os.environ.get("TIGHTFIT_MMH_PACK", "1").strip().lower() in ("0", "off", "no", "false"):
            return set()
        if (op is not self.m.op_norm or not getattr(self.m, "fuse_quant", False)
                or not self.m.use_triton or x.shape[-1] != self.c.n_embd or self.c.n_embd % 32):
            return set()
        from tightfit.kernels.gemv_route import mmh_routed
        out = set()
        for n in names:
            L = self.m.lin.get(n)
            if (L is not None and L.kind == "quant"
                    and mmh_routed(L.qtype, M, L.raw, L.n_in * L.n_out, packed=True)):
                out.add(n)
        return out

    def _fusable(self, names, k: int) -> int | None:
        if not getattr(self.m, "fuse_quant", False) or k % 32:
            return None
        from tightfit.kernels.gemv_route import producer_writable
        for n in names:
            lay = self.layout.get(n)
            if lay is not None and producer_writable(lay):
                return lay
        return None

    def _lin(self, x: torch.Tensor, inp: str, M: int, pairs) -> None:
        """out = x . W^T per (matrix, out): a matrix is a name of the executor's `lin`, or one of
        its merged groups (merge.MergedLinear: the parts' rows in one launch, out [M, sum])."""
        acts: dict = {}
        for name, out in pairs:
            if isinstance(name, str):
                L = self.m.lin[name]
            else:
                L, name = name, name.names[0]       # a group reads its first part's layout
            if L.kind == "quant":
                from tightfit.kernels.gemv_route import gemv_act, quantize_into, mmh_input, mmh_routed
                packed = (M, inp) in self._packed                   # the producer's pairs
                if mmh_input(x) and mmh_routed(L.qtype, M, L.raw, x.shape[1] * L.n_out, packed):
                    from tightfit.kernels.gemv_mmh import gemv_mmh      # no int8 quantization
                    if packed:
                        gemv_mmh(self.views(M).xpk, L.raw, L.qtype, L.n_out, out, kind="foldp")
                    else:                                               # fp32 x
                        gemv_mmh(x, L.raw, L.qtype, L.n_out, out)
                    continue
                lay = self.layout[name]
                if lay not in acts and (M, inp, lay) in self._fresh:   # written by its producer
                    self._fresh.discard((M, inp, lay))
                    acts[lay] = self._act(M, inp, lay, x.shape[1])
                if lay not in acts:
                    acts[lay] = quantize_into(x, lay, self._act(M, inp, lay, x.shape[1]))
                    self.quantized_apart.append(name)
                gemv_act(acts[lay], L.raw, L.qtype, L.n_out, out, self.part)
            elif L.kind == "float":
                from tightfit.kernels import gemv as gm
                gm.gemv(x, L.raw, L.qtype, L.n_out, L.n_in, out=out)
            else:
                L.ref(x, out)
        # a producer's quantized copy / pairs of this input must not pass for the NEXT producer's
        # output of the same buffer
        self._fresh = {f for f in self._fresh if f[:2] != (M, inp)}
        self._packed.discard((M, inp))

    # ---- the pass -----------------------------------------------------------------------------
    def _gdn(self, il: int, st: Any, B: _Views, M: int) -> None:
        m, c, p = self.m, self.c, f"blk.{il}."
        v = m.vec
        slot = st.rec_slot[il]
        u = self.conv_rows[slot, :M]
        if B.ba_merged:                                 # one [M, 2 Hv] product: B.beta | B.alpha
            gates = [(m.merged[p + "ssm_beta.weight"], B.ba)]
        else:
            gates = [(p + "ssm_beta.weight", B.beta), (p + "ssm_alpha.weight", B.alpha)]
        if self.qkv_merged:                             # one [M, conv + value] product: u | zg
            rows = self.conv_rows_w[slot, :M]
            self._lin(B.xn, "xn", M, [(m.merged[p + "attn_qkv.weight"], rows)] + gates)
            zg = rows[:, c.conv_dim:]
        else:
            self._lin(B.xn, "xn", M, [(p + "attn_qkv.weight", u), (p + "attn_gate.weight", B.zg)]
                      + gates)
            zg = B.zg
        self.op_conv(u, st.conv, v[p + "ssm_conv1d.weight"], B.y, st.status, slot)
        self.op_gdn(B.y, B.alpha, B.beta, v[p + "ssm_dt.bias"], v[p + "ssm_a"], st.ssm,
                    self.ssm_in[slot], B.o, st.status, slot, c.ssm_k_heads, c.rms_eps)
        Hv, S = c.ssm_v_heads, c.ssm_state
        self._produce(m.op_gnorm, (B.o, zg.view(M, Hv, S), v[p + "ssm_norm.weight"],
                                   c.rms_eps, B.on.view(M, Hv, S)),
                      B.on, "on", M,
                      [p + "ssm_out.weight"] if S % 32 == 0 else [])   # whole 32-blocks per head
        self._lin(B.on, "on", M, [(p + "ssm_out.weight", B.mix)])

    def _attention(self, il: int, st: Any, B: _Views, M: int, mode: str) -> None:
        m, c, p = self.m, self.c, f"blk.{il}."
        v = m.vec
        s = st.attn_slot[il]
        H, D = c.n_head, c.head_dim
        self._lin(B.xn, "xn", M, [(p + "attn_q.weight", B.qg), (p + "attn_k.weight", B.kk),
                                  (p + "attn_v.weight", B.vv)])
        self.op_qk(B.qg, B.kk, B.vv, v[p + "attn_q_norm.weight"], v[p + "attn_k_norm.weight"],
                   m.cos, m.sin, st.k[s], st.v[s], B.q, st.status, c.rms_eps)
        nch = 1 if mode == "single" else m.n_chunks
        self.op_attn(B.q, st.k[s], st.v[s], B.qg, B.ao.view(M, H, D), st.status, self.attn_ws,
                     n_chunks=nch, chunk=m.chunk)
        self._lin(B.ao, "ao", M, [(p + "attn_output.weight", B.mix)])

    def _pass(self, st: Any, M: int, mode: str) -> None:
        m, c = self.m, self.c
        v, eps = m.vec, c.rms_eps
        B = self.views(M)
        if m._embed_dev is not None:
            raw, fn = m._embed_dev
            fn(B.ids, raw, int(m._embd_info.qtype), c.n_embd, out=B.x)
        self.status.zero_()
        self.quantized_apart = []      # matrices whose input a separate launch quantized (bench)
        self._fresh.clear()
        self._packed.clear()
        for il in range(c.n_layer):
            p = f"blk.{il}."
            # every matrix reading this norm's output: with qkv and the gate on the norm's bf16
            # pairs, the int8 copy it writes is the one beta and alpha read (else a separate
            # quantize launch per layer: 48 x 1.9 us, session 19)
            first = ([p + "attn_qkv.weight", p + "attn_gate.weight", p + "ssm_beta.weight",
                      p + "ssm_alpha.weight"] if c.is_recurrent(il)
                     else [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
            self._produce(m.op_norm, (B.x, B.ffo if il else None, v[p + "attn_norm.weight"], eps,
                                      B.xn), B.xn, "xn", M, first)
            if c.is_recurrent(il):
                self._gdn(il, st, B, M)
            else:
                self._attention(il, st, B, M, mode)
            ffn = [p + "ffn_gate.weight", p + "ffn_up.weight"]
            self._produce(m.op_norm, (B.x, B.mix, v[p + "post_attention_norm.weight"], eps, B.xn),
                          B.xn, "xn", M, ffn)
            grp = self._merged_pair(ffn)
            if grp is not None:             # one launch: gate | up as the halves of each row
                self._lin(B.xn, "xn", M, [(grp, B.gu)])
                g, up = B.g_m, B.up_m
            else:
                self._lin(B.xn, "xn", M, [(ffn[0], B.g), (ffn[1], B.up)])
                g, up = B.g, B.up
            self._produce(m.op_swiglu, (g, up, B.h), B.h, "h", M, [p + "ffn_down.weight"])
            self._lin(B.h, "h", M, [(p + "ffn_down.weight", B.ffo)])
        self._produce(m.op_norm, (B.x, B.ffo, v["output_norm.weight"], eps, B.xn), B.xn, "xn", M,
                      ["output.weight"])
        self._lin(B.xn, "xn", M, [("output.weight", B.logits)])
        m.op_commit(B.x, B.logits, self.status, 1)      # finite check: v_status[1] = 1 if not
        self.op_argmax(B.logits, self.ws["v_am_val"], self.ws["v_am_idx"], self.out, self.status,
                       st.status)

    def _graph(self, st: Any, M: int, mode: str):
        per = self._graphs.get(st)
        if per is None:
            per = self._graphs[st] = {}
        g = per.get((M, mode))
        if g is not None:
            return g
        # the first block of a mode captures every size of it that fits here (2..m_max, and M):
        # a size first met later (the last rounds before max_tokens, the policy's shorter drafts)
        # would stall that round by its capture, ~0.1-0.3 s each (session 20: 0.28 s inside a
        # timed 512-token run). The block buffers are views of one region, so more graphs hold no
        # more memory. A size is captured only where this state could run it now (its KV rows
        # inside the context, the single-pass attention inside its limit): the capture's warm-up
        # pass writes past the committed length.
        room = st.max_ctx - st.pos
        if mode == "single":
            room = min(room, A.SINGLE_PASS_MAX - st.pos)
        for m in sorted({M, *range(2, min(self.m_max, room) + 1)}):
            if (m, mode) not in per:
                per[(m, mode)] = self._capture(st, m, mode)
                self._capture_commits(st, m)
        return per[(M, mode)]

    def _capture_commits(self, st: Any, M: int) -> None:
        """Every commit(j) of an M-token block on this state, j = 1..M, as a graph of its three
        kernels. Why: launched from Python, the three Triton launches cost ~0.2 ms of host time
        per round in which the device waits (session 22: the round's gap between verify graphs was
        0.67 ms, the commit the largest piece); a graph replay costs ~0.01 ms. Runs here, before
        the block: the kernels' warm-up (their compilation: j is not specialised, so one warm-up
        serves every j) writes only the staging bank, which the block about to run rewrites, and
        advances a scratch copy of the status words, not the state's."""
        if self.op_commit_block is not BS.commit_block:     # the torch reference reads status
            return
        per = self._commits.get(st)
        if per is None:
            per = self._commits[st] = {}
        if (M, M) in per:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            if not self._commit_warm:
                scratch = st.status.clone()
                BS.commit_block(st.conv, st.ssm, self.conv_rows, self.ssm_in, scratch, 1, 2,
                                advance_status=scratch)
                self._commit_warm = True
            onetime.note()
            for j in range(1, M + 1):
                g = torch.cuda.CUDAGraph()
                # capture_begin / capture_end directly: torch.cuda.graph would also collect garbage
                # and empty the allocator's cache once per graph (these graphs allocate nothing)
                g.capture_begin()
                try:
                    BS.commit_block(st.conv, st.ssm, self.conv_rows, self.ssm_in, st.status, j, M)
                finally:
                    g.capture_end()
                per[(M, j)] = g
        torch.cuda.current_stream().wait_stream(side)

    def _capture(self, st: Any, M: int, mode: str):
        # warm-up (JIT, lazy tables) on a side stream: it writes only block buffers, the staging
        # bank and KV rows past the committed length; st.status is only read by the pass
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._pass(st, M, mode)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        onetime.note()
        with torch.cuda.graph(g):
            self._pass(st, M, mode)
        return g

    def _load(self, ids: Sequence[int], B: _Views, M: int) -> None:
        m = self.m
        if m._embed_dev is not None:
            if self._ids_host is None:
                B.ids.copy_(torch.tensor(list(ids), dtype=torch.int64))
            else:
                # straight into the pinned buffer through its numpy view (no tensor per round);
                # the previous round's upload from it finished before that round's read
                self._ids_np[:M] = ids
                B.ids.copy_(self._ids_host[:M], non_blocking=True)
            return
        rows = torch.cat([m._host_row(int(t)).reshape(1, -1) for t in ids], 0)
        B.x.copy_(rows.to(torch.float32))

    # ---- public -------------------------------------------------------------------------------
    def run(self, ids: Sequence[int], st: Any):
        """One verify block (ids validated by the caller); a batch.Block whose logits / hidden
        rows are views of the block buffers (valid until the next block of this executor)."""
        from tightfit.model.batch import Block
        M = len(ids)
        if not 1 <= M <= self.m_max:
            raise ValueError(f"block of {M} tokens on a verify graph of at most {self.m_max}")
        mode = "single" if st.pos + M <= A.SINGLE_PASS_MAX else "split"
        _mark("enter")
        B = self.views(M)
        per = None
        with torch.no_grad():
            if self.m.use_graphs:
                g = self._graph(st, M, mode)
                per = self._commits.get(st)
                _mark("found")
                self._load(ids, B, M)
                _mark("uploaded")
                _mark("loaded", event=True)
                g.replay()
                _mark("launched", event=True)
                self.replays += 1
            else:
                self._load(ids, B, M)
                self._pass(st, M, mode)
        self.serial += 1
        serial, p0 = self.serial, st.pos
        # ONE small read after the block: each row's argmax, the block's non-finite flag, and the
        # state's status words, which the caller did not sync before the block (so the commit
        # before it and this block ran back to back on the device): st.check_status raises as
        # st.sync() would have
        words = self.out[:M + 3].tolist()
        st.check_status(words[M + 1], words[M + 2])
        if words[M]:
            raise NonFiniteError("non-finite values in the hidden state or the logits; the "
                                 "state was not advanced past the previous chunk")
        _mark("read")

        def commit(j: int) -> None:
            if st.pos != p0 or self.serial != serial:
                raise StateError("the state moved (or another block ran) since this block was run")
            _mark("commit0")
            cg = per.get((M, int(j))) if per is not None else None
            if cg is not None:
                cg.replay()
            else:
                with torch.no_grad():
                    self.op_commit_block(st.conv, st.ssm, self.conv_rows, self.ssm_in, st.status,
                                         int(j), M)
            st.advanced(int(j))
            _mark("commit1")
        return Block(B.logits, B.xn, commit, argmaxes=[int(i) for i in words[:M]])
