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

Workspace (device bytes besides weights and state), see `workspace_bytes()`: activation buffers
~ (4 E + 3 n_ff + 2 conv_dim + 3 value_dim + 4 H D + 2 kv_dim) * 4 + logits n_vocab * 4, their
int8 quantized copies (~1.2x the quantized inputs' elements), RoPE tables n_ctx * n_rot * 4,
split-K workspace H * ceil(n_ctx/chunk) * (D + 2) * 4.
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

    def __init__(self, name: str, info: Any, device: torch.device, use_triton: bool):
        self.name = name
        self.info = info
        self.qtype = int(info.qtype)
        self.n_out, self.n_in = (int(s) for s in info.numpy_shape)
        raw = np.ascontiguousarray(np.asarray(info.raw(), dtype=np.uint8).reshape(-1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.raw = torch.from_numpy(raw).to(device)
        self.nbytes = raw.size
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
        w = dequantize_tensor(self.info, torch.float32).to(x.device)
        out.copy_(F.linear(x, w))


class GPUModel:
    def __init__(self, config: Qwen35Config, model_file: Any, device: str | torch.device = "cuda",
                 n_ctx: int | None = None, use_triton: bool | None = None,
                 chunk: int = A.DEFAULT_CHUNK, use_graphs: bool | None = None,
                 lazy_check: bool = False, prefill_chunk: int | None = None,
                 batched: bool = True):
        config.validate()
        self.config = c = config
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UserError("no CUDA device is available")
        interp = os.environ.get("TRITON_INTERPRET") == "1"
        self.use_triton = (self.device.type == "cuda" or interp) if use_triton is None else use_triton
        self.use_graphs = (self.device.type == "cuda") if use_graphs is None else use_graphs
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
        self.vec: dict[str, torch.Tensor] = {}
        from tightfit.model.weights import dequantize_tensor
        for name in c.tensor_shapes(include_mtp=False):
            if name == "token_embd.weight":
                continue
            if name not in tensors:
                raise UserError(f"model file lacks tensor {name}")
            info = tensors[name]
            if len(info.numpy_shape) == 1 or Qwen35Config.is_vector_tensor(name):
                self.vec[name] = dequantize_tensor(info, torch.float32).contiguous().to(dev)
            else:
                self.lin[name] = Linear(name, info, dev, self.use_triton)
        self._embd_info = tensors["token_embd.weight"]
        if c.tied_output or "output.weight" not in tensors:
            self.lin["output.weight"] = Linear("token_embd.weight", self._embd_info, dev,
                                               self.use_triton)
        self.weight_bytes = sum(l.nbytes for l in self.lin.values())
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

    @classmethod
    def from_model_file(cls, mf: Any, device: str = "cuda", n_ctx: int | None = None,
                        **kw: Any) -> "GPUModel":
        if isinstance(mf, str) or hasattr(mf, "__fspath__"):
            from tightfit.api import open_model
            mf = open_model(mf)
        return cls(mf.config, mf, device=device, n_ctx=n_ctx, **kw)

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
        self.ws = A.make_workspace(H, D, self.n_ctx, self.chunk, device=dev)
        self.n_chunks = A.n_chunks_for(self.n_ctx, self.chunk)
        self._qa: dict = {}        # (buffer id, layout) -> preallocated QuantAct
        self._pinned = None
        if dev.type == "cuda":
            self._pinned = [torch.empty(1, E, dtype=torch.float32).pin_memory() for _ in range(2)]
            self._events = [None, None]
            self._slot = 0

    def workspace_bytes(self) -> int:
        names = ("x", "xn", "mix", "ffo", "u", "y", "zg", "o", "on", "alpha", "beta", "qg", "kk",
                 "vv", "q", "ao", "g", "up", "h", "logits", "cos", "sin")
        n = sum(getattr(self, k).numel() * 4 for k in names)
        n += sum(t.numel() * t.element_size() for t in self.ws)
        for qa in self._qa.values():
            n += qa.q.numel() + qa.d.numel() * 4 + qa.s16.numel() * 4
        return n

    def new_state(self, max_ctx: int | None = None) -> GPUState:
        m = int(max_ctx or self.n_ctx)
        if m > self.n_ctx:
            raise UserError(f"max_ctx {m} exceeds the executor's n_ctx {self.n_ctx}")
        return GPUState(self.config, m, device=self.device)

    def state_bytes(self, max_ctx: int | None = None) -> dict[str, int]:
        return state_bytes(self.config, int(max_ctx or self.n_ctx))

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
        """out = x . W^T for each (tensor name, out buffer); x quantized once per layout."""
        acts: dict = {}
        gm = _gemv_mod()
        for name, out in pairs:
            L = self.lin[name]
            if L.kind == "quant":
                if L.layout not in acts:
                    acts[L.layout] = self._quant(x, L.layout)
                gm.gemv_quantized(acts[L.layout], L.raw, L.qtype, L.n_out, out=out)
            elif L.kind == "float":
                gm.gemv(x, L.raw, L.qtype, L.n_out, L.n_in, out=out)
            else:
                L.ref(x, out)

    # ---- embedding ----------------------------------------------------------------------------
    def _device_embedding(self):
        """`tightfit.kernels.embed.embed_rows` if it exists and agrees with the host path."""
        if self.device.type != "cuda" or os.environ.get("TIGHTFIT_DEVICE_EMBED") != "1":
            return None       # default: the host row (no second copy of the table on the GPU)
        try:
            from tightfit.kernels.embed import embed_rows
        except Exception:  # noqa: BLE001
            return None
        info = self._embd_info
        try:
            raw = torch.from_numpy(np.ascontiguousarray(
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
        if not isinstance(state, GPUState) or state.config != self.config:
            raise StateError("state was created for a different model")
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
        if not isinstance(state, GPUState) or state.config != self.config:
            raise StateError("state was created for a different model")
        ids = self._token_ids(tokens)
        state.check_usable(len(ids))
        state.sync()
        return self.batcher().forward_block(ids, state, keep_states=keep_states)

    __call__ = forward
