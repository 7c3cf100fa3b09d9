"""GPU executor of qwen35: the decode step on raw GGUF blocks, captured as a CUDA graph.

`GPUModel.from_model_file(mf, device=, n_ctx=)` uploads every trunk matrix as its raw GGUF bytes
(no dequantized copy) and the 1-D tensors as fp32, and preallocates every activation buffer of a
one-token step. `forward(tokens, state, logits=)` has the ReferenceModel API; tokens go one at a
time through the step (a simple, correct state-only prefill: the LM head runs only where logits
are wanted).

The step (embedding row -> 64 blocks -> final norm -> LM head -> commit) runs on one stream and
reads everything it needs from device buffers: the token's embedding row is copied into `x`, the
position and the active state bank come from the state's device status word. On CUDA it is
captured once per (attention mode, head on/off) and state, then replayed; batch width is 1.
Attention mode "single" (one pass per KV head) serves positions < 1024, "split" (split-K over
chunks of `chunk` rows + reduce) the rest. The last kernel checks the hidden state and logits
for NaN/Inf and only then flips the recurrent bank and advances the device position; the host
reads the status lazily (`GPUState.sync`, at the end of each forward unless `lazy_check`).

Matrices: `tightfit.kernels.gemv` for the formats it supports (activations quantized once per
input and layout, shared by the matrices reading the same input); on the CPU (tests) a torch
path: float views for F32/F16/BF16, per-call NumPy dequantization for quantized blocks.
Embedding: the row is dequantized on the host from the mmap and copied in (one row, ~20 KB per
token); TIGHTFIT_DEVICE_EMBED=1 uses `tightfit.kernels.embed.embed_rows` on a device copy instead.

Placement (issue 5): with `plan=` (a tightfit.plan Plan of this file; `from_model_file(vram=)`
makes one) the weights are not uploaded per tensor: tightfit.model.placed allocates the plan's
ONE arena, checks exact cover first, copies the GPU rows from the mmap through the pinned ring,
and serves the rest from the host: the embedding table (one row decoded per token) and the
suffix rows of split matrices (`hostw`, computed by tightfit.kernels.cpu_gemv while the GPU
prefix runs; only activations cross PCIe). The KV cache, recurrent banks and status word of the
first live state are arena views too. MTP blocks are never loaded. With host matrix rows the step
is not captured as a CUDA graph (host work sits between kernels).

Workspace (device bytes besides weights and state), see `workspace_bytes()`: activation buffers
~ (4 E + 3 n_ff + 2 conv_dim + 3 value_dim + 4 H D + 2 kv_dim) * 4 + logits n_vocab * 4, their
int8 quantized copies (~1.2x the quantized inputs' elements), RoPE tables n_ctx * n_rot * 4,
split-K workspace H * ceil(n_ctx/chunk) * (D + 2) * 4.

Quantized KV cache (`kv_type=` q8_0, tq3, tq4, `<k>+<v>`; not with a placement yet): the state
holds byte caches, the step quantizes the new K/V row at the device position
(tightfit.kernels.kv_write_q) and attention reads the codes (tightfit.kernels.attn_decode_q,
single pass / split-K as above; its workspace adds R (D*D*4) and q_rot/o_rot (2*H*D*4)); the
batched prefill writes with kvquant.reference.write_rows and attends with attention_quant.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.errors import UserError
from tightfit.kernels import attn_decode as A
from tightfit.kernels import gdn as G
from tightfit.kernels import norm as N
from tightfit.model.config import Qwen35Config
from tightfit.model.reference import LOGITS_MODES, UnknownTokenError, imrope_pair_uses_position
from tightfit.runtime.gpu_state import GPUState, state_bytes
from tightfit.runtime.state import StateError

FLOAT_QTYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


def _gemv_mod():
    try:
        from tightfit.kernels import gemv
        return gemv
    except Exception:  # noqa: BLE001 - the GEMV module is optional until it lands
        return None


class Linear:
    """One matrix W[n_out, n_in] as raw GGUF bytes on the device."""

    def __init__(self, name: str, info: Any, device: torch.device, use_triton: bool,
                 raw: torch.Tensor | None = None, n_out: int | None = None):
        self.name = name
        self.info = info
        self.qtype = int(info.qtype)
        self.n_out, self.n_in = (int(s) for s in info.numpy_shape)
        self.whole = raw is None
        if raw is None:           # legacy: one device allocation per matrix
            host = np.ascontiguousarray(np.asarray(info.raw(), dtype=np.uint8).reshape(-1))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.raw = torch.from_numpy(host).to(device)
        else:                     # placed: the first n_out rows, a view of the device arena
            self.raw = raw
            self.n_out = int(n_out)
        self.nbytes = int(self.raw.numel())
        gm = _gemv_mod() if use_triton else None
        self.kind = "ref"
        self.layout = None
        if gm is not None and self.qtype in gm.FLOAT_TYPES:
            self.kind = "float"
        elif gm is not None and self.qtype in gm.QUANT_TYPES and self.n_in % 256 == 0:
            self.kind = "quant"
            self.layout = gm.ACT_LAYOUT.get(self.qtype, 0)
        elif use_triton and device.type == "cuda" and self.qtype not in FLOAT_QTYPES:
            raise UserError(f"{name}: type {info.type_name} with rows of {self.n_in} has no GPU "
                            "GEMV kernel yet")
        if self.kind == "ref" and self.qtype in FLOAT_QTYPES:
            self.view = self.raw.view(FLOAT_QTYPES[self.qtype]).view(self.n_out, self.n_in)

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
                 chunk: int = A.DEFAULT_CHUNK, use_graphs: bool | None = None,
                 lazy_check: bool = False, prefill_chunk: int | None = None,
                 batched: bool = True, plan: Any = None, progress: bool | None = None,
                 kv_type: str | None = None):
        config.validate()
        self.config = c = config
        # KV cache: fp16, or a quantized type (tightfit.kvquant) read by attn_decode_q
        from tightfit.runtime.state import quant_kv_type
        self.kv_type = quant_kv_type(kv_type, c)
        if kv_type is not None and self.kv_type is None and kv_type.lower() != "f16":
            raise UserError(f"--kv-type {kv_type}: the GPU executor's KV cache is f16 or a "
                            "quantized type (q8_0, tq3, tq4, <k>+<v>)")
        if self.kv_type and plan is not None:
            raise UserError(f"--kv-type {kv_type}: the placed arena (--vram) holds an f16 KV "
                            "cache only so far; run without --vram or with --kv-type f16")
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
        self.chunk = int(chunk)
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
        needed = list(c.tensor_shapes(include_mtp=False))   # MTP blocks: never loaded here
        for name in needed:
            if name not in tensors:
                raise UserError(f"model file lacks tensor {name}")
        self.placed = None
        if plan is not None:
            from tightfit.model.placed import Placed
            self.placed = Placed(plan, model_file, dev, needed, progress=progress)
        from tightfit.model.weights import dequantize_tensor
        for name in needed:
            if name == "token_embd.weight":
                continue
            info = tensors[name]
            if len(info.numpy_shape) == 1 or Qwen35Config.is_vector_tensor(name):
                self.vec[name] = (self.placed.vector(name, info) if self.placed is not None else
                                  dequantize_tensor(info, torch.float32).contiguous().to(dev))
            else:
                self._add_matrix(name, name, info)
        self._embd_info = tensors["token_embd.weight"]
        if c.tied_output or "output.weight" not in tensors:
            self._add_matrix("output.weight", "token_embd.weight", self._embd_info)
        self.weight_bytes = sum(l.nbytes for l in self.lin.values())
        self.host_weight_bytes = sum(h.nbytes for h in self.hostw.values())
        if self.hostw:             # host rows run between kernels: no whole-step CUDA graph
            if use_graphs:
                raise UserError("CUDA graphs cannot capture a step with host-computed rows")
            self.use_graphs = False
        self._embed_dev = self._device_embedding()
        self._alloc_buffers()
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
            self.op_qk = functools.partial(W.qk_prep_q if t else W.qk_prep_q_ref, ws=self.kvw)
            self.op_attn = Q.attn_decode_q if t else Q.attn_decode_q_ref

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
                                  device=device)
        return cls(mf.config, mf, device=device, n_ctx=n_ctx, **kw)

    def _add_matrix(self, key: str, tensor: str, info: Any) -> None:
        """lin[key]: the device rows of `tensor` (all of them, or the placement's GPU prefix);
        hostw[key]: its host suffix, if the placement has one."""
        if self.placed is None:
            self.lin[key] = Linear(key, info, self.device, self.use_triton)
            return
        raw = self.placed.gpu_raw(tensor)
        if raw is not None:
            self.lin[key] = Linear(key, info, self.device, self.use_triton, raw=raw,
                                   n_out=self.placed.gpu_rows(tensor))
        if tensor in self.placed.host:
            self.hostw[key] = self.placed.host[tensor]

    # ---- buffers ------------------------------------------------------------------------------
    def _alloc_buffers(self) -> None:
        c, dev = self.config, self.device
        z = lambda *s: torch.zeros(*s, dtype=torch.float32, device=dev)  # noqa: E731
        E, H, D = c.n_embd, c.n_head, c.head_dim
        self.x, self.xn, self.mix, self.ffo = z(1, E), z(1, E), z(1, E), z(1, E)
        self.u, self.y = z(1, c.conv_dim), z(c.conv_dim)
        self.zg, self.o, self.on = z(1, c.value_dim), z(c.ssm_v_heads, c.ssm_state), z(1, c.value_dim)
        self.alpha, self.beta = z(1, c.ssm_v_heads), z(1, c.ssm_v_heads)
        self.qg, self.kk, self.vv = z(1, 2 * H * D), z(1, c.kv_dim), z(1, c.kv_dim)
        self.q, self.ao = z(H, D), z(1, H * D)
        self.g, self.up, self.h = z(1, c.n_ff), z(1, c.n_ff), z(1, c.n_ff)
        self.logits = z(1, c.n_vocab)
        rot = imrope_pair_uses_position(c.n_rot, c.rope_sections)
        self.cos, self.sin = A.rope_tables(self.n_ctx, c.n_rot, c.rope_freq_base, rot, device=dev)
        self.n_chunks = A.n_chunks_for(self.n_ctx, self.chunk)
        self.kvw = None
        if self.kv_type:
            from tightfit.kernels import attn_decode_q as Q
            from tightfit.kernels import kv_write_q as W
            self.ws = Q.make_workspace(self.kv_type, H, D, self.n_ctx, self.chunk, device=dev)
            if self.ws.m is None:          # split-K buffers for every n_ctx (mode chosen by pos)
                self.ws.m, self.ws.l = z(H, self.n_chunks), z(H, self.n_chunks)
                self.ws.acc = z(H, self.n_chunks, D)
            self.kvw = W.make_write_workspace(self.kv_type, c.n_head_kv, D, R=self.ws.R,
                                              device=dev)
        else:
            self.ws = A.make_workspace(H, D, self.n_ctx, self.chunk, device=dev)
        self._qa: dict = {}        # (buffer id, layout) -> preallocated QuantAct
        self._pinned = None
        self._io = None
        if dev.type == "cuda":
            from tightfit.model.placed import PinnedIO
            self._io = PinnedIO()          # activations of split matrices crossing PCIe
            self._pinned = [torch.empty(1, E, dtype=torch.float32).pin_memory() for _ in range(2)]
            self._events = [None, None]
            self._slot = 0

    def workspace_bytes(self) -> int:
        names = ("x", "xn", "mix", "ffo", "u", "y", "zg", "o", "on", "alpha", "beta", "qg", "kk",
                 "vv", "q", "ao", "g", "up", "h", "logits", "cos", "sin")
        n = sum(getattr(self, k).numel() * 4 for k in names)
        if self.kv_type:
            n += self.ws.nbytes + self.kvw.nbytes - self.ws.R.numel() * 4   # R shared
        else:
            n += sum(t.numel() * t.element_size() for t in self.ws)
        for qa in self._qa.values():
            n += qa.q.numel() + qa.d.numel() * 4 + qa.s16.numel() * 4
        return n

    def new_state(self, max_ctx: int | None = None) -> GPUState:
        m = int(max_ctx or self.n_ctx)
        if m > self.n_ctx:
            raise UserError(f"max_ctx {m} exceeds the executor's n_ctx {self.n_ctx}")
        if self.placed is not None:        # KV + recurrent banks + status in the arena
            return self.placed.new_state(self.config, m)
        return GPUState(self.config, m, device=self.device, kv_type=self.kv_type)

    def state_bytes(self, max_ctx: int | None = None) -> dict[str, int]:
        return state_bytes(self.config, int(max_ctx or self.n_ctx), self.kv_type)

    # ---- matrices -----------------------------------------------------------------------------
    def _quant(self, x: torch.Tensor, layout: int):
        from tightfit.kernels.quantize_act import QuantAct, quantize_act
        key = (x.data_ptr(), layout)
        qa = self._qa.get(key)
        if qa is None:
            n, k = x.shape
            qa = QuantAct(torch.empty((n, k), dtype=torch.int8, device=x.device),
                          torch.empty((n, k // 32), dtype=torch.float32, device=x.device),
                          torch.empty((n, k // 16), dtype=torch.int32, device=x.device),
                          layout, n, k)
            self._qa[key] = qa
        return quantize_act(x, layout, out=qa)

    def _linears(self, x: torch.Tensor, pairs: Sequence[tuple[str, torch.Tensor]]) -> None:
        """out = x . W^T for each (tensor name, out buffer); x quantized once per layout.
        A split matrix writes out[:, :gpu_rows] on the device and out[:, gpu_rows:] from its host
        suffix rows: x is sent to the host first, the GPU parts are launched, the CPU computes
        the host rows meanwhile, and only those output values are copied back."""
        host = [(name, out) for name, out in pairs if name in self.hostw]
        if host:
            from tightfit.model.placed import to_host_async
            xh, ev = to_host_async(x, self._io, ("x", x.data_ptr()))
        acts: dict = {}
        gm = _gemv_mod()
        for name, out in pairs:
            L = self.lin.get(name)
            if L is None:
                continue                       # wholly on the host
            o = out if name not in self.hostw else out.view(1, -1)[:, :L.n_out]
            if L.kind == "quant":
                if L.layout not in acts:
                    acts[L.layout] = self._quant(x, L.layout)
                gm.gemv_quantized(acts[L.layout], L.raw, L.qtype, L.n_out, out=o)
            elif L.kind == "float":
                gm.gemv(x, L.raw, L.qtype, L.n_out, L.n_in, out=o)
            else:
                L.ref(x, o)
        if not host:
            return
        if ev is not None:
            ev.synchronize()                   # x is on the host; the GPU parts keep running
        for name, out in host:
            H = self.hostw[name]
            o = out.view(1, -1)[:, H.row_start:]
            if self._io is None:
                o.copy_(torch.from_numpy(H.gemv(xh)))
                continue
            key = ("y", name)
            buf = self._io.get(key, (1, H.n_rows))
            H.gemv(xh, out=buf.numpy())
            o.copy_(buf, non_blocking=True)
            self._io.recorded(key)

    # ---- embedding ----------------------------------------------------------------------------
    def _device_embedding(self):
        """`tightfit.kernels.embed.embed_rows` if it exists and agrees with the host path: on the
        arena's copy when the plan put the table on the device, on an extra device copy only with
        TIGHTFIT_DEVICE_EMBED=1 (legacy path)."""
        if self.device.type != "cuda":
            return None
        placed_raw = None
        if self.placed is not None:
            if self.placed.embedding_on_host():
                return None   # the plan keeps the table on the host: one row per token
            placed_raw = self.placed.gpu_raw("token_embd.weight")
        elif os.environ.get("TIGHTFIT_DEVICE_EMBED") != "1":
            return None       # default: the host row (no second copy of the table on the GPU)
        try:
            from tightfit.kernels.embed import embed_rows
        except Exception:  # noqa: BLE001
            return None
        info = self._embd_info
        try:
            raw = placed_raw if placed_raw is not None else torch.from_numpy(np.ascontiguousarray(
                np.asarray(info.raw(), dtype=np.uint8).reshape(-1))).to(self.device)
            ids = torch.tensor([0, self.config.n_vocab - 1], device=self.device)
            got = embed_rows(ids, raw, int(info.qtype), self.config.n_embd)
            want = torch.cat([self._host_row(0), self._host_row(self.config.n_vocab - 1)])
            if torch.allclose(got.float().cpu(), want, rtol=1e-5, atol=1e-6):
                return raw, embed_rows
        except Exception:  # noqa: BLE001 - unknown signature: keep the host path
            pass
        return None

    def _host_row(self, tok: int) -> torch.Tensor:
        if self.placed is not None:        # decoded on the CPU from the mmap (cpu_gemv)
            return torch.from_numpy(self.placed.embed_rows([tok]))
        from tightfit.model.weights import dequantize_rows
        return dequantize_rows(self._embd_info, np.array([tok]), torch.float32)

    def _load_embedding(self, tok: int) -> None:
        if self._embed_dev is not None:
            raw, fn = self._embed_dev
            ids = torch.tensor([tok], device=self.device)
            self.x.copy_(fn(ids, raw, int(self._embd_info.qtype),
                            self.config.n_embd).float().reshape(1, -1))
            return
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

    # ---- the step -----------------------------------------------------------------------------
    def _gdn(self, il: int, st: GPUState) -> None:
        c, p = self.config, f"blk.{il}."
        slot = st.rec_slot[il]
        self._linears(self.xn, [(p + "attn_qkv.weight", self.u), (p + "attn_gate.weight", self.zg),
                                (p + "ssm_beta.weight", self.beta),
                                (p + "ssm_alpha.weight", self.alpha)])
        self.op_conv(self.u.view(-1), st.conv, self.vec[p + "ssm_conv1d.weight"], self.y,
                     st.status, slot)
        self.op_gdn(self.y, self.alpha, self.beta, self.vec[p + "ssm_dt.bias"],
                    self.vec[p + "ssm_a"], st.ssm, self.o, st.status, slot, c.ssm_k_heads,
                    c.rms_eps)
        self.op_gnorm(self.o, self.zg.view(c.ssm_v_heads, c.ssm_state),
                      self.vec[p + "ssm_norm.weight"], c.rms_eps,
                      self.on.view(c.ssm_v_heads, c.ssm_state))
        self._linears(self.on, [(p + "ssm_out.weight", self.mix)])

    def _attention(self, il: int, st: GPUState, mode: str) -> None:
        c, p = self.config, f"blk.{il}."
        s = st.attn_slot[il]
        H, D = c.n_head, c.head_dim
        self._linears(self.xn, [(p + "attn_q.weight", self.qg), (p + "attn_k.weight", self.kk),
                                (p + "attn_v.weight", self.vv)])
        qg = self.qg.view(H, 2 * D)
        self.op_qk(qg, self.kk.view(-1), self.vv.view(-1), self.vec[p + "attn_q_norm.weight"],
                   self.vec[p + "attn_k_norm.weight"], self.cos, self.sin, st.k[s], st.v[s],
                   self.q, st.status, c.rms_eps)
        nch = 1 if mode == "single" else self.n_chunks
        self.op_attn(self.q, st.k[s], st.v[s], qg, self.ao.view(H, D), st.status, self.ws,
                     n_chunks=nch, chunk=self.chunk)
        self._linears(self.ao, [(p + "attn_output.weight", self.mix)])

    def _step(self, st: GPUState, mode: str, head: bool) -> None:
        """One token; x holds its embedding row. Writes logits (if head) and commits."""
        c = self.config
        eps = c.rms_eps
        for il in range(c.n_layer):
            p = f"blk.{il}."
            self.op_norm(self.x, self.ffo if il else None, self.vec[p + "attn_norm.weight"], eps,
                         self.xn)
            if c.is_recurrent(il):
                self._gdn(il, st)
            else:
                self._attention(il, st, mode)
            self.op_norm(self.x, self.mix, self.vec[p + "post_attention_norm.weight"], eps, self.xn)
            self._linears(self.xn, [(p + "ffn_gate.weight", self.g), (p + "ffn_up.weight", self.up)])
            self.op_swiglu(self.g, self.up, self.h)
            self._linears(self.h, [(p + "ffn_down.weight", self.ffo)])
        self.op_norm(self.x, self.ffo, self.vec["output_norm.weight"], eps, self.xn)
        if head:
            self._linears(self.xn, [("output.weight", self.logits)])
            self.op_commit(self.x, self.logits, st.status, 1)
        else:
            self.op_commit(self.x, self.x, st.status, 1)

    def _graph(self, st: GPUState, mode: str, head: bool):
        key = (mode, head)
        g = st.graphs.get(key)
        if g is not None:
            return g
        # warm-up (JIT compiles, lazy tables) on a side stream; it writes only the staging bank
        # and the KV row at pos, both unseen, and the status word is restored afterwards
        saved = st.status.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(st, mode, head)
        torch.cuda.current_stream().wait_stream(side)
        st.status.copy_(saved)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._step(st, mode, head)
        st.status.copy_(saved)
        st.graphs[key] = g
        return g

    def step_token(self, tok: int, st: GPUState, head: bool = True) -> None:
        """Launch one decode step (no host sync); the logits land in self.logits."""
        mode = "single" if st.pos + 1 <= A.SINGLE_PASS_MAX else "split"
        if self.use_graphs:
            g = self._graph(st, mode, head)
            self._load_embedding(tok)
            g.replay()
        else:
            self._load_embedding(tok)
            self._step(st, mode, head)
        st.advanced(1)

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
        if not isinstance(state, GPUState) or state.config != self.config \
                or state.kv_type != self.kv_type:
            raise StateError("state was created for a different model (or KV cache type)")
        ids = self._token_ids(tokens)
        n = len(ids)
        state.check_usable(n)
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

    def forward_block(self, tokens: Sequence[int] | torch.Tensor, state: GPUState,
                      keep_states: bool = True):
        """Speculative verify: run the block [last, d_1..d_k] without committing; returns a
        tightfit.model.batch.Block (logits of every row, normed hidden rows, commit(j) that keeps
        the first j tokens from per-position recurrent states, no re-run)."""
        if not isinstance(state, GPUState) or state.config != self.config \
                or state.kv_type != self.kv_type:
            raise StateError("state was created for a different model (or KV cache type)")
        ids = self._token_ids(tokens)
        state.check_usable(len(ids))
        state.sync()
        return self.batcher().forward_block(ids, state, keep_states=keep_states)

    __call__ = forward
