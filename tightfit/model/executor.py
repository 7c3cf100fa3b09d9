"""GPU executor of qwen35: the decode step on raw GGUF blocks, captured as a CUDA graph.

`GPUModel.from_model_file(mf, device=, n_ctx=)` uploads every trunk matrix as its raw GGUF bytes
(no dequantized copy) and the 1-D tensors as fp32, and preallocates every activation buffer of a
one-token step. `forward(tokens, state, logits=)` has the ReferenceModel API; tokens go one at a
time through the step (a simple, correct state-only prefill: the LM head runs only where logits
are wanted).

The step (embedding lookup -> 64 blocks -> final norm -> LM head -> commit) runs on one stream
and reads everything it needs from device buffers: the token id from `tok_id` (the first kernel
of the step decodes that row of the compressed table with tightfit.kernels.embed.embed_rows), the
position and the active state bank from the state's device status word. On CUDA it is captured
once per (attention mode, head on/off, feed) and state, then replayed; batch width is 1.
Attention mode "single" (one pass per KV head) serves positions < 1024, "split" (split-K over
chunks of `chunk` rows + reduce) the rest. With feed=True the step ends with a two-stage argmax
of the logits written to `tok_id` (and to `ids_ring` at the position), so `greedy()` runs
token after token without the sampled id visiting the host (one host read per IDS_RING tokens).
The last kernel checks the hidden state and logits for NaN/Inf and only then flips the recurrent
bank and advances the device position; the host reads the status lazily (`GPUState.sync`, at the
end of each forward unless `lazy_check`).

Matrices: `tightfit.kernels.gemv` for the formats it supports (activations quantized once per
input and layout, shared by the matrices reading the same input; the kernels producing an input
- add+RMSNorm, SwiGLU, gated RMSNorm - write that int8 copy themselves for the first quantize_act
layout among its readers (norm.py quant_out=, bit-identical to quantizing after; the attention
output is still quantized by a separate launch; on by default, measured 8.66 -> 8.47 ms per step,
TIGHTFIT_FUSE_QUANT=0 turns it off); on the
CPU (tests) a torch path: float views for F32/F16/BF16, per-call NumPy dequantization for
quantized blocks.
Merged launches (on by default, TIGHTFIT_MERGE_LINEARS=0 turns them off;
tightfit.model.merge): consecutive matrices of one `_linears` call with the same type, row length
and activation layout and no host rows (GDN attn_qkv + attn_gate, ssm_beta + ssm_alpha; ffn_gate +
ffn_up; attn_k + attn_v where they match) run as ONE GEMV over their adjacent raw bytes (legacy:
uploaded into slices of one buffer per group; placed: only where the arena already put them back
to back), writing one contiguous output: the step buffers of each call site are re-laid inside the
same workspace bytes so that its outputs follow each other (`merged`: first part's name -> group).
`lin` keeps every part (views of the same bytes) for the batched forward and the verify graph.
Embedding (`device_embed=`): on the device when the table is there (the plan's arena; on the
legacy path a device copy only with TIGHTFIT_DEVICE_EMBED=1 or device_embed=True) and
tightfit.kernels.embed has a capturable kernel for its type; otherwise (fallback) the row is
decoded on the host from the mmap and copied into `x` before the step (~20 KB per token).

Placement (issue 5): with `plan=` (a tightfit.plan Plan of this file; `from_model_file(vram=)`
makes one) the weights are not uploaded per tensor: tightfit.model.placed allocates the plan's
ONE arena, checks exact cover first, copies the GPU rows from the mmap through the pinned ring,
and serves the rest from the host: the embedding table (one row decoded per token) and the
suffix rows of split matrices (`hostw`, computed by tightfit.kernels.cpu_gemv while the GPU
prefix runs; only activations cross PCIe). The KV cache (in the plan's format, f16 or
quantized), recurrent banks and status word of the first live state are arena views too. MTP
blocks are never loaded. With host matrix rows the step is not ONE CUDA graph (host work sits
between kernels): tightfit.model.segments captures the GPU work between host calls as a chain of
graphs replayed around them (TIGHTFIT_HOST_GRAPHS=0: the eager step).
TIGHTFIT_HOST_PROFILE=1 (read once at import of tightfit.model.placed): `host_profile`, a
host_profile.HostProfile timing each uncaptured step_token in buckets (embedding, x to the host,
x quantization, kernels, copies back, GPU tail, the rest); None otherwise (no timing call).

Workspace: every step buffer (activations, logits, token id + argmax partials + id ring, RoPE
tables, split-K partials, KV-quant rotation/codebooks, int8 GEMV inputs, decoded non-F32
vectors) is listed by tightfit.plan.buffers.step_buffers and carved from ONE allocation: the
arena's workspace region with a plan (whose workspace line is the sum of exactly these
buffers), else one uint8 tensor. The captured step allocates nothing (the graph pool stays
empty). Outside the plan remain: the batched forward's per-chunk tensors (tightfit.model.batch),
the kernel modules' per-device constant tables, the logits tensors `forward` returns, and a
second live state (Placed.extra_states).

Quantized KV cache (`kv_type=` q8_0, tq3, tq4, `<k>+<v>`, legacy and placed): the state holds
byte caches, the step quantizes the new K/V row at the device position
(tightfit.kernels.kv_write_q) and attention reads the codes (tightfit.kernels.attn_decode_q,
single pass / split-K as above); the batched prefill writes with kvquant.reference.write_rows
and attends with attention_quant. With a plan the KV type and the split-K chunk are the plan's.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tightfit.errors import UserError
from tightfit.kernels import attn_decode as A
from tightfit.kernels import block_step as BS
from tightfit.kernels import gdn as G
from tightfit.kernels import norm as N
from tightfit.model import onetime
from tightfit.model.config import Qwen35Config
from tightfit.model.reference import LOGITS_MODES, UnknownTokenError, imrope_pair_uses_position
from tightfit.plan.buffers import ARGMAX_BLOCK
from tightfit.runtime.gpu_state import GPUState, state_bytes
from tightfit.runtime.state import StateError

FLOAT_QTYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


@triton.jit
def _argmax_stage2(val_ptr, idx_ptr, nb, n, tok_ptr, ring_ptr, status_ptr, RING: tl.constexpr,
                   NB: tl.constexpr):
    """tok = the first index of the overall max; ring[status.pos % RING] = tok."""
    offs = tl.arange(0, NB)
    v = tl.load(val_ptr + offs, mask=offs < nb, other=float("-inf"))
    i = tl.load(idx_ptr + offs, mask=offs < nb, other=n)
    m = tl.max(v, axis=0)
    best = tl.min(tl.where(v == m, i, n), axis=0).to(tl.int64)
    pos = tl.load(status_ptr + 2)
    tl.store(tok_ptr, best)
    tl.store(ring_ptr + pos % RING, best)


def _gemv_mod():
    try:
        from tightfit.kernels import gemv
        return gemv
    except Exception:  # noqa: BLE001 - the GEMV module is optional until it lands
        return None


class Linear:
    """One matrix W[n_out, n_in] as raw GGUF bytes on the device."""

    def __init__(self, name: str, info: Any, device: torch.device, use_triton: bool,
                 raw: torch.Tensor | None = None, n_out: int | None = None,
                 dest: torch.Tensor | None = None):
        self.name = name
        self.info = info
        self.qtype = int(info.qtype)
        self.n_out, self.n_in = (int(s) for s in info.numpy_shape)
        self.whole = raw is None
        if raw is None:           # legacy: one device allocation per matrix ...
            host = np.ascontiguousarray(np.asarray(info.raw(), dtype=np.uint8).reshape(-1))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                if dest is None:
                    self.raw = torch.from_numpy(host).to(device)
                else:             # ... or its slice of a merged group's one buffer (merge.py)
                    self.raw = dest.copy_(torch.from_numpy(host))
        else:                     # placed: the first n_out rows, a view of the device arena
            self.raw = raw
            self.n_out = int(n_out)
        self.nbytes = int(self.raw.numel())
        self.kind, self.layout = self.classify(self.qtype, self.n_in, use_triton)
        if self.kind == "ref" and use_triton and device.type == "cuda" and \
                self.qtype not in FLOAT_QTYPES:
            raise UserError(f"{name}: type {info.type_name} with rows of {self.n_in} has no GPU "
                            "GEMV kernel yet")
        if self.kind == "ref" and self.qtype in FLOAT_QTYPES:
            self.view = self.raw.view(FLOAT_QTYPES[self.qtype]).view(self.n_out, self.n_in)

    @staticmethod
    def classify(qtype: int, n_in: int, use_triton: bool) -> tuple[str, int | None]:
        """(kind, activation layout) of a matrix: "float" (F32/F16/BF16 GEMV), "quant" (the
        quantized GEMV on int8 activations of that layout) or "ref" (torch; CPU only). Also what
        the legacy upload uses to plan merged groups before any Linear exists."""
        gm = _gemv_mod() if use_triton else None
        if gm is not None and qtype in gm.FLOAT_TYPES:
            return "float", None
        if gm is not None and qtype in gm.QUANT_TYPES and n_in % 256 == 0:
            from tightfit.kernels.gemv_route import act_layout
            return "quant", act_layout(qtype)
        return "ref", None

    def ref(self, x: torch.Tensor, out: torch.Tensor) -> None:
        if self.qtype in FLOAT_QTYPES:
            out.copy_(F.linear(x, self.view.to(x.dtype)))
            return
        from tightfit.model.weights import dequantize_tensor   # per-call dequantization (CPU)
        if self.whole:
            w = dequantize_tensor(self.info, torch.float32).to(x.device)
        else:
            from tightfit.quant.dequant import dequantize
            w = torch.from_numpy(np.ascontiguousarray(dequantize(
                self.raw.cpu().numpy(), self.qtype, (self.n_out, self.n_in)), np.float32))
        out.copy_(F.linear(x, w.to(x.device)))


class GPUModel:
    def __init__(self, config: Qwen35Config, model_file: Any, device: str | torch.device = "cuda",
                 n_ctx: int | None = None, use_triton: bool | None = None,
                 chunk: int | None = None, use_graphs: bool | None = None,
                 lazy_check: bool = False, prefill_chunk: int | None = None,
                 batched: bool = True, plan: Any = None, progress: bool | None = None,
                 kv_type: str | None = None, device_embed: bool | None = None,
                 mtp: bool = False):
        """`mtp`: also hold the MTP (nextn) block blk.<n_layer> (raw matrices in `lin`, norms in
        `vec`) for tightfit.runtime.spec.mtp's drafter; with a plan, the plan decides
        (PlanOptions.include_mtp, priced there) and asking for it without is an error."""
        config.validate()
        self.config = c = config
        # KV cache: fp16, or a quantized type (tightfit.kvquant) read by attn_decode_q
        from tightfit.runtime.state import quant_kv_type
        self.kv_type = quant_kv_type(kv_type, c)
        if kv_type is not None and self.kv_type is None and kv_type.lower() != "f16":
            raise UserError(f"--kv-type {kv_type}: the GPU executor's KV cache is f16 or a "
                            "quantized type (q8_0, tq3, tq4, <k>+<v>)")
        if plan is not None:               # the plan fixes the KV format and the split-K chunk
            pkv = str(plan.options.kv_type)
            plan_qt = quant_kv_type(pkv, c)
            if plan_qt is None and pkv.lower() != "f16":
                raise UserError(f"the plan's KV type {pkv} has no GPU executor (f16 or a "
                                "quantized type)")
            if kv_type is None:
                self.kv_type = plan_qt
            elif self.kv_type != plan_qt:
                raise UserError(f"--kv-type {kv_type} differs from the plan's KV type {pkv}; "
                                f"make the plan with --kv-type {kv_type}")
            if chunk is not None and int(chunk) != plan.options.attn_chunk:
                raise UserError(f"chunk {chunk} differs from the plan's attention chunk "
                                f"{plan.options.attn_chunk}")
            chunk = plan.options.attn_chunk
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UserError("no CUDA device is available")
        interp = os.environ.get("TRITON_INTERPRET") == "1"
        self.use_triton = (self.device.type == "cuda" or interp) if use_triton is None else use_triton
        self.use_graphs = (self.device.type == "cuda") if use_graphs is None else use_graphs
        if plan is not None:
            if n_ctx is not None and int(n_ctx) > plan.options.ctx:
                raise UserError(f"n_ctx {n_ctx} exceeds the plan's ctx {plan.options.ctx}")
            n_ctx = n_ctx or plan.options.ctx
        self.n_ctx = int(n_ctx or min(c.n_ctx_train, 4096))
        self.chunk = int(chunk or A.DEFAULT_CHUNK)
        if self.chunk < 1:
            raise UserError(f"chunk must be at least 1, got {chunk}")
        self.lazy_check = lazy_check
        self.batched = batched            # n > 1 tokens: tightfit.model.batch (chunked prefill)
        self.prefill_chunk = prefill_chunk
        self._batch = None
        self.dtype = torch.float32
        self.kv_dtype = torch.float16
        tensors = getattr(model_file, "gguf", model_file).tensors
        self._tensors = tensors
        dev = self.device
        self.lin: dict[str, Linear] = {}
        self.hostw: dict = {}          # lin name -> placed.HostRows (suffix rows on the host)
        self.vec: dict[str, torch.Tensor] = {}
        if plan is not None:
            if mtp and not plan.options.include_mtp:
                raise UserError("the MTP drafter is not in this plan: make the plan with MTP "
                                "(tightfit plan --mtp)")
            mtp = bool(plan.options.include_mtp)
        self.has_mtp = bool(mtp) and c.nextn_layers > 0
        needed = [n for n in c.tensor_shapes(include_mtp=self.has_mtp)
                  if not (n.endswith("nextn.shared_head_norm.weight") and n not in tensors)]
        for name in needed:
            if name not in tensors:
                raise UserError(f"model file lacks tensor {name}")
        self.placed = None
        #: placed.HostProfile with TIGHTFIT_HOST_PROFILE=1 (placed path), else None; set it to
        #: None to stop profiling, back to the object to resume
        self.host_profile = None
        if plan is not None:
            from tightfit.model import placed as _placed
            self.placed = _placed.Placed(plan, model_file, dev, needed, progress=progress)
            if _placed.HOST_PROFILE:
                self.host_profile = _placed.HostProfile()
        self._carve_workspace(plan, tensors, needed)
        # merged GEMV launches (tightfit.model.merge, TIGHTFIT_MERGE_LINEARS=1): on the legacy
        # path each group's matrices are uploaded into slices of one buffer (_merge_dest)
        from tightfit.model import merge as _merge
        self.merge = _merge.enabled() and self.use_triton
        self.merged: dict[str, _merge.MergedLinear] = {}    # first part's name -> group
        self._merge_dest: dict[str, torch.Tensor] = {}
        if self.merge and self.placed is None:
            self._merge_alloc(tensors)
        from tightfit.model.weights import dequantize_tensor
        for name in needed:
            if name == "token_embd.weight":
                continue
            info = tensors[name]
            if len(info.numpy_shape) == 1 or Qwen35Config.is_vector_tensor(name):
                w = self._ws.get("vec:" + name)
                if w is not None:          # non-F32 vector: decoded into its planned buffer
                    w.copy_(dequantize_tensor(info, torch.float32).reshape(w.shape))
                    self.vec[name] = w
                else:
                    self.vec[name] = (self.placed.vector(name, info) if self.placed is not None
                                      else dequantize_tensor(info, torch.float32).contiguous()
                                      .to(dev))
            else:
                self._add_matrix(name, name, info)
        self._embd_info = tensors["token_embd.weight"]
        if c.tied_output or "output.weight" not in tensors:
            self._add_matrix("output.weight", "token_embd.weight", self._embd_info)
        self._merge_dest = {}
        if self.merge:
            self._merge_build()
        self.weight_bytes = sum(l.nbytes for l in self.lin.values())
        self.host_weight_bytes = sum(h.nbytes for h in self.hostw.values())
        if self.hostw:             # host rows run between kernels: no whole-step CUDA graph
            if use_graphs:
                raise UserError("CUDA graphs cannot capture a step with host-computed rows")
            self.use_graphs = False
        # ... but piecewise graphs between the host calls (tightfit.model.segments), unless
        # TIGHTFIT_HOST_GRAPHS=0 (the eager step) or use_graphs=False was asked for
        from tightfit.model import segments as _segments
        self.host_graphs = bool(self.hostw) and self.device.type == "cuda" and \
            use_graphs is not False and _segments.enabled()
        self._seg_rec = None       # segments.Recorder while the segment graphs are captured
        self._alloc_buffers()
        # host rows the step's GPU reads over PCIe beside the CPU (tightfit.model.pcie_rows):
        # on CUDA with TIGHTFIT_PCIE_ROWS (default share), on the CPU only when that is set
        self.hostc: dict = dict(self.hostw)      # the CPU's part of each host suffix (the step)
        self.pcie: dict[str, Linear] = {}        # the GPU's part, a view of registered host pages
        self.pcie_gen = 0                        # bumped by set_pcie_share (segment graph key)
        self._pcie_reg = None
        if self.hostw and (self.device.type == "cuda" or
                           os.environ.get("TIGHTFIT_PCIE_ROWS", "").strip()):
            from tightfit.model.pcie_rows import share_from_env
            try:
                share = share_from_env()
            except ValueError as e:
                raise UserError(str(e)) from None
            self.set_pcie_share(share)
            self.pcie_gen = 0                    # the split built with the executor: no new key
        # fused activation quantization (norm.py quant_out=): the producers of GEMV inputs
        # (add+RMSNorm, SwiGLU, gated RMSNorm) write the int8 copy themselves, so `_linears`
        # skips the separate quantize launch. On by default: on the H200 the 27B's logits are
        # bit-identical to the unfused step and the step is 8.66 -> 8.47 ms (bench/RESULTS.md,
        # session 4 call 2); TIGHTFIT_FUSE_QUANT=0 turns it off
        self.fuse_quant = (self.use_triton and
                           os.environ.get("TIGHTFIT_FUSE_QUANT", "1").strip() != "0")
        self._fresh: set = set()     # (input address, layout) written by a fused producer
        self._embed_dev = self._device_embedding(device_embed)
        # the ops: Triton kernels on the GPU (or under the interpreter), torch references on CPU
        t = self.use_triton
        self.op_norm = N.add_rmsnorm if t else N.add_rmsnorm_ref
        self.op_swiglu = N.swiglu if t else N.swiglu_ref
        self.op_gnorm = N.gated_rmsnorm if t else N.gated_rmsnorm_ref
        self.op_commit = N.commit if t else N.commit_ref
        self.op_conv = G.conv_step if t else G.conv_step_ref
        self.op_gdn = G.gdn_step if t else G.gdn_step_ref
        self.op_qk = A.qk_prep if t else A.qk_prep_ref
        self.op_attn = A.attn_decode if t else A.attn_decode_ref
        if self.kv_type:                   # quantize-on-write + attention over the codes
            import functools
            from tightfit.kernels import attn_decode_q as Q
            from tightfit.kernels import kv_write_q as W
            # q = R q inside the KV-write kernel (it holds R already): the attention then skips
            # its own q-rotation launch (2.4-3.0 us per layer at 32K, session 5 call 3)
            self.op_qk = functools.partial(W.qk_prep_q if t else W.qk_prep_q_ref, ws=self.kvw,
                                           rotate_q=True)
            self.op_attn = functools.partial(Q.attn_decode_q if t else Q.attn_decode_q_ref,
                                             q_rotated=True)

    @classmethod
    def from_model_file(cls, mf: Any, device: str = "cuda", n_ctx: int | None = None,
                        **kw: Any) -> "GPUModel":
        if isinstance(mf, str) or hasattr(mf, "__fspath__"):
            from tightfit.api import open_model
            mf = open_model(mf)
        vram = kw.pop("vram", None)
        if vram is not None and kw.get("plan") is None:
            from tightfit.model.placed import plan_for
            kw["plan"] = plan_for(mf.path, n_ctx or min(mf.config.n_ctx_train, 4096), vram,
                                  kv_type=kw.get("kv_type") or "f16", device=device,
                                  mtp=bool(kw.get("mtp", False)))
        return cls(mf.config, mf, device=device, n_ctx=n_ctx, **kw)

    def _add_matrix(self, key: str, tensor: str, info: Any) -> None:
        """lin[key]: the device rows of `tensor` (all of them, or the placement's GPU prefix);
        hostw[key]: its host suffix, if the placement has one."""
        if self.placed is None:
            self.lin[key] = Linear(key, info, self.device, self.use_triton,
                                   dest=self._merge_dest.get(key))
            return
        raw = self.placed.gpu_raw(tensor)
        if raw is not None:
            self.lin[key] = Linear(key, info, self.device, self.use_triton, raw=raw,
                                   n_out=self.placed.gpu_rows(tensor))
        if tensor in self.placed.host:
            self.hostw[key] = self.placed.host[tensor]

    # ---- merged GEMV groups (tightfit.model.merge) ----------------------------------------------
    def _merge_key(self, name: str):
        """What must be equal for matrices to share one launch: (qtype, n_in, layout) of a device
        matrix on the quantized path with no host rows; None: never merged."""
        L = self.lin.get(name)
        if L is None or L.kind != "quant" or name in self.hostw:
            return None
        return L.qtype, L.n_in, L.layout

    def _merge_alloc(self, tensors: Any) -> None:
        """Legacy path, before the upload: one device buffer per group (planned from the tensor
        types exactly as Linear classifies them), each part a slice that Linear fills from the
        file, so the parts are adjacent and no second copy of any weight exists."""
        from tightfit.model import merge as _merge

        def key(name: str):
            info = tensors.get(name)
            if info is None:
                return None
            qt, n_in = int(info.qtype), int(info.numpy_shape[-1])
            kind, lay = Linear.classify(qt, n_in, self.use_triton)
            return (qt, n_in, lay) if kind == "quant" else None

        for group in _merge.plan_groups(self.config, key):
            sizes = [int(tensors[n].nbytes) for n in group]
            if any(sz % _merge.PART_ALIGN for sz in sizes[:-1]):
                continue                       # a part would start misaligned: keep them apart
            buf = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
            off = 0
            for n, sz in zip(group, sizes):
                self._merge_dest[n] = buf[off:off + sz]
                off += sz

    def _merge_build(self) -> None:
        """self.merged: every group whose parts are adjacent device bytes (legacy: allocated so;
        placed: the arena put them back to back), and the step buffers re-laid so that each call
        site's outputs are contiguous in call order (merge.relayout, inside the same workspace
        bytes). A group whose outputs cannot be made contiguous is not merged."""
        from tightfit.model import merge as _merge
        from tightfit.plan.placement import ARENA_ALIGN
        groups = []
        for g in _merge.plan_groups(self.config, self._merge_key):
            if _merge.adjacent([self.lin[n].raw for n in g]):
                groups.append(g)
        if not groups:
            return
        sites = _merge.call_sites(self.config)
        out_of = {n: o for names, outs in sites for n, o in zip(names, outs)}
        chains, seen = [], set()
        for names, outs in sites:
            if outs not in seen and any(set(g) <= set(names) for g in groups):
                seen.add(outs)
                chains.append(outs)
        order = [(b.name, b.nbytes) for b in self._ws_bufs]
        moved = _merge.relayout(order, self._ws_offs, chains, ARENA_ALIGN)
        dt = {"f32": torch.float32, "i32": torch.int32, "i64": torch.int64, "i8": torch.int8,
              "u8": torch.uint8}
        for b in self._ws_bufs:
            if b.name in moved:
                off = moved[b.name]
                self._ws_offs[b.name] = off
                t = self._ws_region[off:off + b.nbytes].view(dt[b.dtype]).view(b.shape)
                self._ws[b.name] = t.zero_()
        ws = self._ws
        for g in groups:
            if not _merge.outputs_contiguous([ws[out_of[n]] for n in g]):
                continue
            parts = [self.lin[n] for n in g]
            L0 = parts[0]
            raw = _merge.span(L0.raw, (sum(L.nbytes for L in parts),))
            self.merged[g[0]] = _merge.MergedLinear(tuple(g), raw, L0.qtype, L0.n_in, L0.layout,
                                                    tuple(L.n_out for L in parts))

    # ---- buffers ------------------------------------------------------------------------------
    def _carve_workspace(self, plan: Any, tensors: Any, needed: list[str]) -> None:
        """Every step buffer (tightfit.plan.buffers) as a view of ONE allocation: the arena's
        workspace region with a plan (the very list the plan priced), else one uint8 tensor of
        the packed size (legacy path)."""
        from tightfit.plan.buffers import (act_layouts, pack, step_buffers)
        c = self.config
        if plan is not None:
            from tightfit.plan.budget import workspace_buffers
            bufs = workspace_buffers(c, plan.options, plan.inventory)
            region = self.placed.arena.region("workspace")
        else:
            lay = {}
            if self.use_triton:
                mats = [(n, int(tensors[n].qtype), int(tensors[n].numpy_shape[-1]))
                        for n in needed if len(tensors[n].numpy_shape) == 2
                        and not Qwen35Config.is_vector_tensor(n)]
                if c.tied_output or "output.weight" not in tensors:
                    e = tensors["token_embd.weight"]
                    mats.append(("output.weight", int(e.qtype), int(e.numpy_shape[-1])))
                lay = act_layouts(mats)
            bufs = step_buffers(c, self.n_ctx, self.kv_type, self.chunk, lay, {},
                                with_status=False)
            region = None
        offs, packed = pack(bufs)
        if region is None:
            region = torch.empty(packed, dtype=torch.uint8, device=self.device)
        elif packed > region.numel():
            raise UserError(f"the plan's workspace region ({region.numel()} B) is smaller than "
                            f"the executor's step buffers ({packed} B); make the plan again")
        dt = {"f32": torch.float32, "i32": torch.int32, "i64": torch.int64, "i8": torch.int8,
              "u8": torch.uint8}
        self._ws_region = region
        self._ws_bufs = bufs
        self._ws_offs = dict(offs)
        self._ws: dict[str, torch.Tensor] = {}
        for b in bufs:
            t = region[offs[b.name]:offs[b.name] + b.nbytes].view(dt[b.dtype]).view(b.shape)
            t.zero_()
            self._ws[b.name] = t
        if "mma_fixup" in self._ws and plan is not None and self.device.type == "cuda":
            # the planned tensor-core GEMV workspace (counters zeroed above) replaces its lazy one
            # (a CPU executor on a GPU host keeps the planned line but has no such kernel)
            from tightfit.kernels.gemv_mma import use_workspace
            from tightfit.plan.budget import mma_fixup_rows
            use_workspace(self._ws["mma_fixup"], mma_fixup_rows(c, plan.options, plan.inventory))

    def _alloc_buffers(self) -> None:
        """The step's buffers are views of the carved workspace; constants (RoPE tables, the
        KV rotation and codebooks) are computed on the host and copied in once."""
        c, dev, w = self.config, self.device, self._ws
        H, D = c.n_head, c.head_dim
        for n in ("x", "xn", "mix", "ffo", "u", "y", "zg", "o", "on", "alpha", "beta", "qg",
                  "kk", "vv", "q", "ao", "g", "up", "h", "logits", "tok_id", "ids_ring",
                  "argmax_val", "argmax_idx"):
            setattr(self, n, w[n])
        rot = imrope_pair_uses_position(c.n_rot, c.rope_sections)
        cos, sin = A.rope_tables(w["cos"].shape[0], c.n_rot, c.rope_freq_base, rot)
        self.cos, self.sin = w["cos"].copy_(cos), w["sin"].copy_(sin)
        self.n_chunks = int(w["attn_m"].shape[1])
        self.kvw = None
        if self.kv_type:
            from tightfit.kernels import attn_decode_q as Q
            from tightfit.kernels import kv_write_q as W
            w0 = Q.make_workspace(self.kv_type, H, D, 1, self.chunk)       # host values
            self.ws = Q.QuantAttnWorkspace(self.kv_type, D, w["kvq_R"].copy_(w0.R),
                                           w["kvq_kcb"].copy_(w0.kcb), w["kvq_vcb"].copy_(w0.vcb),
                                           w["kvq_q_rot"], w["kvq_o_rot"], w["attn_m"],
                                           w["attn_l"], w["attn_acc"])
            k0 = W.make_write_workspace(self.kv_type, c.n_head_kv, D, R=w0.R)
            tabs = tuple((w[f"kvw_cb{i}"].copy_(cb), w[f"kvw_mid{i}"].copy_(mid),
                          w[f"kvw_invf{i}"].copy_(invf)) for i, (cb, mid, invf)
                         in enumerate(k0.tabs))
            self.kvw = W.KVWriteWorkspace(self.kv_type, self.ws.R, tabs, w["kvw_k"], w["kvw_v"],
                                          k0.search, k0.seed)
        else:
            self.ws = (w["attn_m"], w["attn_l"], w["attn_acc"])
        self._qa: dict = {}        # (buffer address, layout) -> prepared x over planned buffers
        acts = [n for n in w if n.startswith("act_") and n.endswith("_q")]
        if acts:
            from tightfit.kernels.gemv_route import act_buffers, make_act
            for n in acts:
                _, inp, lay = n[:-2].split("_")
                x, lay = getattr(self, inp), int(lay)
                bufs = {sfx: w[f"{n[:-2]}_{sfx}"] for sfx, _, _ in act_buffers(lay, x.shape[1])}
                self._qa[(x.data_ptr(), lay)] = make_act(lay, bufs, 1, x.shape[1])
        self._gemv_part = w.get("gemv_part")
        self._pinned = None
        self._io = None
        self._hgroups: dict = {}           # host names -> placed.HostGroup (one CPU call each)
        if dev.type == "cuda":
            from tightfit.model.placed import PinnedIO
            self._io = PinnedIO()          # activations of split matrices crossing PCIe
            self._pinned = [torch.empty(1, c.n_embd, dtype=torch.float32).pin_memory()
                            for _ in range(2)]
            self._events = [None, None]
            self._slot = 0

    def workspace_bytes(self) -> int:
        """Device bytes of the step buffers (tightfit.plan.buffers): the plan's workspace line
        on the placed path (status word included)."""
        return sum(t.numel() * t.element_size() for t in self._ws.values())

    def buffers(self) -> dict[str, torch.Tensor]:
        """The step buffers by name (views of the one workspace allocation)."""
        return dict(self._ws)

    def new_state(self, max_ctx: int | None = None) -> GPUState:
        m = int(max_ctx or self.n_ctx)
        if m > self.n_ctx:
            raise UserError(f"max_ctx {m} exceeds the executor's n_ctx {self.n_ctx}")
        if self.placed is not None:        # KV + recurrent banks + status in the arena
            return self.placed.new_state(self.config, m, self.kv_type)
        return GPUState(self.config, m, device=self.device, kv_type=self.kv_type)

    def state_bytes(self, max_ctx: int | None = None) -> dict[str, int]:
        return state_bytes(self.config, int(max_ctx or self.n_ctx), self.kv_type)

    # ---- matrices -----------------------------------------------------------------------------
    def _quant(self, x: torch.Tensor, layout: int):
        from tightfit.kernels.gemv_route import new_act, quantize_into
        key = (x.data_ptr(), layout)
        qa = self._qa.get(key)
        if qa is None:
            if self.placed is not None:
                raise RuntimeError(f"no planned int8 activation buffer for layout {layout} of a "
                                   f"[{x.shape[0]}, {x.shape[1]}] input (plan/buffers.py)")
            n, k = x.shape
            qa = new_act(layout, n, k, x.device)
            self._qa[key] = qa
        return quantize_into(x, layout, qa)

    def _fused_target(self, x: torch.Tensor, names: Sequence[str]):
        """(key, act) when the producer of x can write x's int8 copy for the matrices `names`
        (the next `_linears` on x) itself: fusion is on and one of their layouts is a
        quantize_act layout (v1 layouts 0-3, or the CUDA layout 200 = layout 0 buffers); the
        first such matrix's layout is fused, any other layouts are quantized by `_linears` as
        before. None otherwise."""
        if not self.fuse_quant or x.shape[-1] % 32:
            return None
        from tightfit.kernels.gemv_route import new_act, producer_writable
        lays = [L.layout for n in names if (L := self.lin.get(n)) is not None
                and L.kind == "quant" and producer_writable(L.layout)]
        if not lays:
            return None
        lay = lays[0]
        key = (x.data_ptr(), lay)
        qa = self._qa.get(key)
        if qa is None:
            if self.placed is not None:
                return None                    # _quant raises the planning error
            n, k = x.shape
            qa = self._qa[key] = new_act(lay, n, k, x.device)
        return key, qa

    def _produce(self, op, x: torch.Tensor, names: Sequence[str], *args) -> None:
        """op(*args) writing x (the float input of the matrices `names`); fused with the
        quantization of x when `_fused_target` allows it."""
        t = self._fused_target(x, names)
        if t is None:
            op(*args)
            return
        key, qa = t
        op(*args, quant_out=(qa.q, qa.d, qa.s16), quant_layout=qa.layout)
        self._fresh.add(key)

    def _linears(self, x: torch.Tensor, pairs: Sequence[tuple[str, torch.Tensor]]) -> None:
        """out = x . W^T for each (tensor name, out buffer); x quantized once per layout.
        A split matrix writes out[:, :gpu_rows] on the device and out[:, gpu_rows:] from its host
        suffix rows: x is sent to the host first, the GPU parts are launched, the CPU computes
        the host rows meanwhile, and only those output values are copied back."""
        host = [(name, out) for name, out in pairs if name in self.hostw]
        if host and self._seg_rec is not None:     # capturing segment graphs: cut here
            self._seg_rec.host_linears(x, pairs, host)
            return
        if host:
            from tightfit.model.placed import to_host_async
            prof = self.host_profile           # None unless TIGHTFIT_HOST_PROFILE=1
            if prof is not None:
                t = prof.now()
            xh, ev = to_host_async(x, self._io, ("x", x.data_ptr()))
            if prof is not None:
                prof.lap("x_d2h", t)
        self._gpu_linears(x, pairs)
        if not host:
            return
        if prof is not None:
            t = prof.now()
        if ev is not None:
            ev.synchronize()                   # x is on the host; the GPU parts keep running
        if prof is not None:
            t = prof.lap("x_wait", t)
        names = tuple(name for name, _ in host)
        G = self._host_group(names)
        key = ("y",) + names
        if prof is not None:
            t = prof.now()
        buf = self._io.get(key, (1, G.n_rows)) if self._io is not None else None
        if prof is not None:
            t = prof.lap("copy_back", t)
        y = G.gemv(xh, out=None if buf is None else buf.numpy())   # straight into pinned memory
        if prof is not None:
            t = prof.host_call(names, G.nbytes, t)
        y = buf if buf is not None else torch.from_numpy(y.reshape(1, -1))   # pinned: async copies
        for (name, out), (a, b) in zip(host, G.spans):
            out.view(1, -1)[:, self.hostc[name].row_start:].copy_(y[:, a:b], non_blocking=True)
        if buf is not None:
            self._io.recorded(key)
        if prof is not None:
            prof.host_done(prof.lap("copy_back", t))

    def _host_group(self, names: tuple):
        """ONE parallel CPU call (placed.HostGroup) for the CPU's rows of `names` (same input)."""
        G = self._hgroups.get(names)
        if G is None:
            from tightfit.model.placed import HostGroup
            G = self._hgroups[names] = HostGroup([self.hostc[n] for n in names])
        return G

    @property
    def host_cpu_bytes(self) -> int:
        """Bytes of host rows the CPU reads per step (host_weight_bytes less the PCIe rows)."""
        return sum(h.nbytes for h in self.hostc.values())

    def set_pcie_share(self, share: float) -> None:
        """Let the step's GPU read the first `share` of every split matrix's host rows over PCIe
        (tightfit.model.pcie_rows; 0: the CPU reads them all). Cached host groups and segment
        graphs of the old split are not reused (pcie_gen is part of their key)."""
        from tightfit.model import pcie_rows as P
        from tightfit.plan.rowsplit import SPLIT_ROW_QUANTUM
        cuda = self.device.type == "cuda"

        def served(qt: int) -> bool:
            if not cuda:               # CPU (tests): any type, by the GPU part's own route
                return True
            from tightfit.kernels.gemv_route import cuda_routed
            kind, _ = Linear.classify(qt, 256, self.use_triton)
            # the CUDA GEMV, measured on mapped rows (bench/zero_copy.py)
            return kind == "quant" and cuda_routed(qt)

        split = P.plan_split(self.hostw, float(share), SPLIT_ROW_QUANTUM, served)
        if split and cuda and self._pcie_reg is None:
            self._pcie_reg = P.register_or_warn(
                [(int(H.w.ctypes.data), int(H.w.ctypes.data) + int(H.w.nbytes))
                 for H in self.hostw.values()])
            if self._pcie_reg is None:         # said on stderr: the CPU reads every host row
                split = {}
            self.placed.pcie_reg = self._pcie_reg      # unregistered by Placed.close
        self.hostc, self.pcie = {}, {}
        for name, H in self.hostw.items():
            n = split.get(name, 0)
            self.hostc[name] = H.tail(n)
            if n:
                rows = H.w[:n]
                if cuda:
                    raw = self._pcie_reg.device_view(rows)
                else:                  # read-only mapping: never written through this view
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", UserWarning)
                        raw = torch.from_numpy(rows.reshape(-1))
                L = Linear(name, self._tensors[H.name], self.device, self.use_triton, raw=raw,
                           n_out=n)
                L.row_start = H.row_start
                self.pcie[name] = L
        self.pcie_share = float(share) if split else 0.0
        self._hgroups = {}
        self.pcie_gen += 1

    def _gpu_linears(self, x: torch.Tensor, pairs: Sequence[tuple[str, torch.Tensor]]) -> None:
        """The device rows of each (name, out): all of it, or out[:, :gpu_rows] of a split
        matrix; x quantized once per layout (or its producer's fused int8 copy)."""
        acts: dict = {}
        gm = _gemv_mod()
        from tightfit.kernels.gemv_route import gemv_act
        i = 0
        while i < len(pairs):
            name, out = pairs[i]
            i += 1
            M = self.merged.get(name)
            if M is not None:                  # one launch for the group starting here
                k = len(M.names)
                grp = pairs[i - 1:i - 1 + k]
                outs = [o for _, o in grp]
                if tuple(n for n, _ in grp) == M.names and \
                        self._merge_outputs_ok(outs, M.rows):
                    out = self._merge_span(outs[0], M.n_out)
                    i += k - 1
                else:
                    M = None
            L = M if M is not None else self.lin.get(name)
            P = self.pcie.get(name)            # host rows the GPU reads over PCIe
            parts = [] if L is None else \
                [(L, out if name not in self.hostw else out.view(1, -1)[:, :L.n_out])]
            if P is not None:
                parts.append((P, out.view(1, -1)[:, P.row_start:P.row_start + P.n_out]))
            for L, o in parts:
                if L.kind == "quant":
                    if L.layout not in acts:
                        key = (x.data_ptr(), L.layout)
                        if key in self._fresh:     # its producer wrote the int8 copy this step
                            self._fresh.discard(key)
                            acts[L.layout] = self._qa[key]
                        else:
                            acts[L.layout] = self._quant(x, L.layout)
                    gemv_act(acts[L.layout], L.raw, L.qtype, L.n_out, o, self._gemv_part)
                elif L.kind == "float":
                    gm.gemv(x, L.raw, L.qtype, L.n_out, L.n_in, out=o)
                else:
                    L.ref(x, o)

    @staticmethod
    def _merge_outputs_ok(outs: Sequence[torch.Tensor], rows: Sequence[int]) -> bool:
        """The outputs of a merged group: one row each of the part's width, back to back."""
        from tightfit.model import merge as _merge
        return all(o.numel() == r for o, r in zip(outs, rows)) and \
            _merge.outputs_contiguous(outs)

    @staticmethod
    def _merge_span(first: torch.Tensor, n: int) -> torch.Tensor:
        from tightfit.model import merge as _merge
        return _merge.span(first, (1, n))

    # ---- embedding ----------------------------------------------------------------------------
    def _device_embedding(self, want: bool | None = None):
        """(table raw bytes, embed_rows) when the step embeds on the device: the token id is read
        from `tok_id` by tightfit.kernels.embed.embed_rows inside the (captured) step. Used when
        the table is on the device (the plan put it in the arena; on the legacy path an extra
        device copy, only with TIGHTFIT_DEVICE_EMBED=1 or device_embed=True), its type has a
        device kernel (embed.DEVICE_TYPES; n_embd % 256 == 0 for the quantized ones) and it
        agrees with the host path on two rows. Otherwise None: the row is decoded on the host
        and copied into x before each step (the fallback). `want`: None = automatic (CUDA only),
        False = host rows, True = device lookup wherever possible (also on the CPU, for tests)."""
        if want is False or (want is None and self.device.type != "cuda"):
            return None
        placed_raw = None
        if self.placed is not None:
            if self.placed.embedding_on_host():
                return None   # the plan keeps the table on the host: one row per token
            placed_raw = self.placed.gpu_raw("token_embd.weight")
        elif want is None and os.environ.get("TIGHTFIT_DEVICE_EMBED") != "1":
            return None       # default: the host row (no second copy of the table on the GPU)
        try:
            from tightfit.kernels import embed as EM
        except Exception:  # noqa: BLE001
            return None
        info = self._embd_info
        t = int(info.qtype)
        if t not in EM.DEVICE_TYPES or (t not in EM.FLOAT_TYPES and self.config.n_embd % 256):
            return None       # no capturable kernel for this type: host rows
        try:
            raw = placed_raw if placed_raw is not None else torch.from_numpy(np.ascontiguousarray(
                np.asarray(info.raw(), dtype=np.uint8).reshape(-1))).to(self.device)
            ids = torch.tensor([0, self.config.n_vocab - 1], device=self.device)
            got = EM.embed_rows(ids, raw, t, self.config.n_embd)
            want_rows = torch.cat([self._host_row(0), self._host_row(self.config.n_vocab - 1)])
            if torch.allclose(got.float().cpu(), want_rows, rtol=1e-5, atol=1e-6):
                return raw, EM.embed_rows
        except Exception:  # noqa: BLE001 - unknown signature: keep the host path
            pass
        return None

    @property
    def device_embedding(self) -> bool:
        """True when the step reads its token id from the device buffer `tok_id`."""
        return self._embed_dev is not None

    def _host_row(self, tok: int) -> torch.Tensor:
        if self.placed is not None:        # decoded on the CPU from the mmap (cpu_gemv)
            return torch.from_numpy(self.placed.embed_rows([tok]))
        from tightfit.model.weights import dequantize_rows
        return dequantize_rows(self._embd_info, np.array([tok]), torch.float32)

    def _embed_step(self) -> None:
        """First op of the step (device path): x = row tok_id of the compressed table."""
        raw, fn = self._embed_dev
        fn(self.tok_id, raw, int(self._embd_info.qtype), self.config.n_embd, out=self.x)

    def _load_embedding(self, tok: int | None) -> None:
        """Before the step: the token id into `tok_id` (device path; None = already there, fed
        back by the previous step), or its host-decoded row into x (fallback)."""
        if self._embed_dev is not None:
            if tok is not None:
                self.tok_id.fill_(int(tok))
            return
        if tok is None:
            raise UserError("this executor embeds on the host: the step needs the token id")
        row = self._host_row(tok)
        if self._pinned is None:
            self.x.copy_(row)
            return
        s = self._slot = 1 - self._slot
        if self._events[s] is not None:
            self._events[s].synchronize()          # the copy that used this slot is done
        self._pinned[s].copy_(row)
        self.x.copy_(self._pinned[s], non_blocking=True)
        ev = self._events[s] = torch.cuda.Event()
        ev.record()

    def _argmax_feed(self, st: GPUState) -> None:
        """tok_id = argmax(logits) and ids_ring[status.pos % IDS_RING] = the same id, on the
        device (two-stage argmax; the first maximal index wins, like torch.argmax)."""
        V = self.config.n_vocab
        if self.use_triton:
            nb = self.argmax_val.numel()
            BS._argmax_rows_stage1[(nb, 1)](self.logits, V, self.argmax_val, self.argmax_idx,
                                            nb, BLOCK=ARGMAX_BLOCK, num_warps=8)
            _argmax_stage2[(1,)](self.argmax_val, self.argmax_idx, nb, V, self.tok_id,
                                 self.ids_ring, st.status, RING=self.ids_ring.numel(),
                                 NB=triton.next_power_of_2(nb), num_warps=1)
            return
        b = self.logits.reshape(-1).argmax()
        self.tok_id.copy_(b.reshape(1))
        self.ids_ring[int(st.status[2]) % self.ids_ring.numel()] = b

    # ---- the step -----------------------------------------------------------------------------
    def _gdn(self, il: int, st: GPUState) -> None:
        c, p = self.config, f"blk.{il}."
        slot = st.rec_slot[il]
        self._linears(self.xn, list(zip(self._in_mats(il), (self.u, self.zg, self.beta,
                                                             self.alpha))))
        self.op_conv(self.u.view(-1), st.conv, self.vec[p + "ssm_conv1d.weight"], self.y,
                     st.status, slot)
        self.op_gdn(self.y, self.alpha, self.beta, self.vec[p + "ssm_dt.bias"],
                    self.vec[p + "ssm_a"], st.ssm, self.o, st.status, slot, c.ssm_k_heads,
                    c.rms_eps)
        fuse = [p + "ssm_out.weight"] if c.ssm_state % 32 == 0 else []   # whole 32-blocks
        self._produce(self.op_gnorm, self.on, fuse, self.o,
                      self.zg.view(c.ssm_v_heads, c.ssm_state), self.vec[p + "ssm_norm.weight"],
                      c.rms_eps, self.on.view(c.ssm_v_heads, c.ssm_state))
        self._linears(self.on, [(p + "ssm_out.weight", self.mix)])

    def _attention(self, il: int, st: GPUState, mode: str) -> None:
        c, p = self.config, f"blk.{il}."
        s = st.attn_slot[il]
        H, D = c.n_head, c.head_dim
        self._linears(self.xn, list(zip(self._in_mats(il), (self.qg, self.kk, self.vv))))
        qg = self.qg.view(H, 2 * D)
        self.op_qk(qg, self.kk.view(-1), self.vv.view(-1), self.vec[p + "attn_q_norm.weight"],
                   self.vec[p + "attn_k_norm.weight"], self.cos, self.sin, st.k[s], st.v[s],
                   self.q, st.status, c.rms_eps)
        nch = 1 if mode == "single" else self.n_chunks
        self.op_attn(self.q, st.k[s], st.v[s], qg, self.ao.view(H, D), st.status, self.ws,
                     n_chunks=nch, chunk=self.chunk)
        self._linears(self.ao, [(p + "attn_output.weight", self.mix)])

    def _in_mats(self, il: int) -> list[str]:
        """The matrices reading block il's normed input xn (its mixer's input projections)."""
        p = f"blk.{il}."
        if self.config.is_recurrent(il):
            return [p + "attn_qkv.weight", p + "attn_gate.weight", p + "ssm_beta.weight",
                    p + "ssm_alpha.weight"]
        return [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]

    def _step(self, st: GPUState, mode: str, head: bool, feed: bool = False) -> None:
        """One token: its embedding row (from tok_id on the device path, else x holds it
        already), 64 blocks, logits (if head; with feed their argmax goes to tok_id for the next
        step), commit."""
        c = self.config
        eps = c.rms_eps
        self._fresh.clear()
        if self._embed_dev is not None:
            self._embed_step()
        for il in range(c.n_layer):
            p = f"blk.{il}."
            self._produce(self.op_norm, self.xn, self._in_mats(il), self.x,
                          self.ffo if il else None, self.vec[p + "attn_norm.weight"], eps, self.xn)
            if c.is_recurrent(il):
                self._gdn(il, st)
            else:
                self._attention(il, st, mode)
            ffn = [p + "ffn_gate.weight", p + "ffn_up.weight"]
            self._produce(self.op_norm, self.xn, ffn, self.x, self.mix,
                          self.vec[p + "post_attention_norm.weight"], eps, self.xn)
            self._linears(self.xn, list(zip(ffn, (self.g, self.up))))
            self._produce(self.op_swiglu, self.h, [p + "ffn_down.weight"], self.g, self.up, self.h)
            self._linears(self.h, [(p + "ffn_down.weight", self.ffo)])
        self._produce(self.op_norm, self.xn, ["output.weight"] if head else [], self.x, self.ffo,
                      self.vec["output_norm.weight"], eps, self.xn)
        if head:
            self._linears(self.xn, [("output.weight", self.logits)])
            if feed:
                self._argmax_feed(st)
            self.op_commit(self.x, self.logits, st.status, 1)
        else:
            self.op_commit(self.x, self.x, st.status, 1)

    def _graph(self, st: GPUState, mode: str, head: bool, feed: bool = False):
        key = (mode, head, feed)
        g = st.graphs.get(key)
        if g is not None:
            return g
        # warm-up (JIT compiles, lazy tables) on a side stream; it writes only the staging bank
        # and the KV row at pos, both unseen; the status word and the token id are restored
        # afterwards from host copies (no device allocation outside the plan)
        saved, saved_tok = st.status.cpu(), self.tok_id.cpu()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(st, mode, head, feed)
        torch.cuda.current_stream().wait_stream(side)
        st.status.copy_(saved)
        self.tok_id.copy_(saved_tok)
        g = torch.cuda.CUDAGraph()
        onetime.note()
        with torch.cuda.graph(g):
            self._step(st, mode, head, feed)
        st.status.copy_(saved)
        self.tok_id.copy_(saved_tok)
        st.graphs[key] = g
        return g

    def step_token(self, tok: int | None, st: GPUState, head: bool = True,
                   feed: bool = False) -> None:
        """Launch one decode step (no host sync); the logits land in self.logits. tok=None: the
        id already in `tok_id` (device embedding only), e.g. fed back by the previous step;
        feed=True: the step ends with tok_id = argmax(logits) (needs head)."""
        if feed and not head:
            raise UserError("feed needs the logits (head=True)")
        mode = "single" if st.pos + 1 <= A.SINGLE_PASS_MAX else "split"
        if self.use_graphs:
            g = self._graph(st, mode, head, feed)
            self._load_embedding(tok)
            g.replay()
        elif self.host_graphs:                 # host rows: segment graphs between host calls
            from tightfit.model import segments
            seg = segments.step(self, st, mode, head, feed)
            if self.host_profile is not None:
                self.host_profile.step(self, tok, st, mode, head, feed,
                                       run=lambda: seg.replay(self.host_profile))
            else:
                self._load_embedding(tok)
                seg.replay()
        elif self.host_profile is not None:    # TIGHTFIT_HOST_PROFILE=1: timed, synchronized
            self.host_profile.step(self, tok, st, mode, head, feed)
        else:
            self._load_embedding(tok)
            self._step(st, mode, head, feed)
        st.advanced(1)

    def greedy(self, tok: int, state: GPUState, n: int) -> list[int]:
        """n greedy tokens after `tok` (which is processed first): with the device embedding the
        sampled id never leaves the device between steps (argmax -> tok_id -> next step's
        embedding, all inside the captured step), and the host reads the ids once per IDS_RING
        steps; otherwise the host takes each argmax. Raises NonFiniteError like forward."""
        ids = self._token_ids([tok])
        if not isinstance(state, GPUState) or state.config != self.config \
                or state.kv_type != self.kv_type:
            raise StateError("state was created for a different model (or KV cache type)")
        n = int(n)
        if n < 1:
            raise UserError(f"greedy needs n >= 1, got {n}")
        state.check_usable(n)
        out: list[int] = []
        R = self.ids_ring.numel()
        with torch.no_grad():
            if self._embed_dev is None:
                t = ids[0]
                for _ in range(n):
                    self.step_token(t, state, head=True)
                    t = int(self.logits.reshape(-1).argmax())
                    out.append(t)
            else:
                first = True
                while len(out) < n:
                    p0, k = state.pos, min(R, n - len(out))
                    for _ in range(k):
                        self.step_token(ids[0] if first else None, state, head=True, feed=True)
                        first = False
                    ring = self.ids_ring.tolist()          # one host read per R steps
                    out += [int(ring[(p0 + i) % R]) for i in range(k)]
        state.sync()
        return out



    # ---- public API ---------------------------------------------------------------------------
    def _token_ids(self, tokens: Any) -> list[int]:
        if isinstance(tokens, torch.Tensor):
            if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
                raise UserError(f"token ids must be integers, got {tokens.dtype}")
            ids = [int(t) for t in tokens.reshape(-1).tolist()]
        else:
            arr = np.asarray(tokens).reshape(-1)
            if arr.dtype.kind not in "iu":
                raise UserError(f"token ids must be integers, got {arr.dtype}")
            ids = [int(t) for t in arr]
        if not ids:
            raise UserError("no tokens to process")
        for t in ids:
            if not 0 <= t < self.config.n_vocab:
                raise UnknownTokenError(f"unknown token id {t}: the vocabulary has "
                                        f"{self.config.n_vocab} tokens (0..{self.config.n_vocab - 1})")
        return ids

    def batcher(self):
        """The batched forward (tightfit.model.batch.BatchForward), built on first use."""
        if self._batch is None:
            if self.hostw:
                from tightfit.model.placed import placed_batch
                self._batch = placed_batch(self, chunk=self.prefill_chunk)
            else:
                from tightfit.model.batch import BatchForward
                self._batch = BatchForward(self, chunk=self.prefill_chunk)
        return self._batch

    def forward(self, tokens: Sequence[int] | torch.Tensor, state: GPUState,
                logits: str = "all", progress=None) -> torch.Tensor:
        """ReferenceModel.forward's contract: 'all' [n, V], 'last' [1, V], 'none' [0, V] fp32
        (on the model's device). One token runs through the (graph-captured) step; n > 1 tokens
        go through the batched forward (tightfit.model.batch: chunked prefill, `progress(done,
        total)` after each chunk) unless `batched=False`, then token by token. On NaN/Inf,
        NonFiniteError is raised and the state keeps every token before the failing one (the
        failing chunk, for the batched path)."""
        if logits not in LOGITS_MODES:
            raise UserError(f"logits must be one of {LOGITS_MODES}, got {logits!r}")
        ids = self._checked_ids(tokens, state)
        n = len(ids)
        if n > 1 and self.batched:
            if state.device.type == "cuda":
                state.sync()               # a pending step failure must not be committed over
            out = self.batcher().forward(ids, state, logits, progress)
            if not self.lazy_check:
                state.sync()
            return out
        V = self.config.n_vocab
        out = torch.empty(n if logits == "all" else (1 if logits == "last" else 0), V,
                          dtype=torch.float32, device=self.device)
        with torch.no_grad():
            for i, tok in enumerate(ids):
                head = logits == "all" or (logits == "last" and i == n - 1)
                self.step_token(tok, state, head)
                if logits == "all":
                    out[i].copy_(self.logits[0])
            if logits == "last":
                out.copy_(self.logits)
        if not self.lazy_check:
            state.sync()
        return out

    def _checked_ids(self, tokens: Sequence[int] | torch.Tensor, state: GPUState) -> list[int]:
        """The token ids, once the state is this model's and has room for them."""
        if not isinstance(state, GPUState) or state.config != self.config \
                or state.kv_type != self.kv_type:
            raise StateError("state was created for a different model (or KV cache type)")
        ids = self._token_ids(tokens)
        state.check_usable(len(ids))
        return ids

    def prefill_hidden(self, tokens: Sequence[int] | torch.Tensor, state: GPUState,
                       sink) -> torch.Tensor:
        """forward(tokens, state, 'last') (the same prefill: batched chunks, or the step for one
        token) that also hands the normed hidden rows of every token to sink(rows [m, E], ids)
        chunk by chunk (the MTP drafter's input). Returns [1, V] fp32 logits of the last token."""
        ids = self._checked_ids(tokens, state)
        n = len(ids)
        if n > 1 and self.batched:
            if state.device.type == "cuda":
                state.sync()
            out = self.batcher().prefill_hidden(ids, state, sink)
            if not self.lazy_check:
                state.sync()
            return out
        out = None
        with torch.no_grad():
            for tok in ids:
                self.step_token(tok, state, True)
                sink(self.xn.detach().reshape(1, -1).clone(), [tok])
            out = self.logits.clone()
        if not self.lazy_check:
            state.sync()
        return out

    def forward_block(self, tokens: Sequence[int] | torch.Tensor, state: GPUState,
                      keep_states: bool = True):
        """Speculative verify: run the block [last, d_1..d_k] without committing; returns a
        tightfit.model.batch.Block (logits of every row, normed hidden rows, commit(j) that keeps
        the first j tokens without re-running the block)."""
        if not isinstance(state, GPUState) or state.config != self.config \
                or state.kv_type != self.kv_type:
            raise StateError("state was created for a different model (or KV cache type)")
        ids = self._token_ids(tokens)
        state.check_usable(len(ids))
        return self.batcher().forward_block(ids, state, keep_states=keep_states)

    __call__ = forward
