"""The model's own MTP (nextn) head as a drafter (spec/gguf-synthetic-traps.md §5, landscape §3.5).

Graph of block L = n_layer (`blk.L.*`, nextn_predict_layers = 1), for the pair (h_t, tok_{t+1}):

    x  = eh_proj @ concat(rmsnorm(embed(tok_{t+1})) * enorm, rmsnorm(h_t) * hnorm)
    x += attention(rmsnorm(x) * attn_norm)        # gated full attention, q/k norms, RoPE, own KV
    x += ffn(rmsnorm(x) * post_attention_norm)
    h' = rmsnorm(x) * shared_head_norm            # (output_norm when the file lacks it)
    logits = output.weight @ h'                   # predicts tok_{t+2}

`h_t` is the target's final hidden state output_norm(h) at position t (`hidden='normed'`, the
brief's convention; `hidden='raw'` is not available from the verifiers). The MTP KV entry of the
pair lives at position t (the position of h_t, like vLLM's MTP proposer). Recursive drafting feeds
(h', d_i) at the next position. After verification only pairs whose h_t came from the target are
kept in the KV ("true" entries); draft entries beyond them are overwritten next round. Pairs are
queued (`observe`) and processed lazily in one batch when the head is next asked to draft, so an
idle MTP costs nothing while another drafter is chosen.

Embedding and LM head come from the target (the ReferenceModel's `_embed`/`_lin`, no second copy)
or from callables (`embed_fn`, `head_fn`) for other executors. On the GPU executor
(`MTPHead.on_gpu_model`) the LM head is the executor's own (raw GGUF bytes, CUDA GEMV), and so is
the block when the executor holds it (GPUModel(mtp=True), or a plan made with MTP that prices its
KV cache and scratch: tightfit.plan.mtp); its one-token steps then replay as CUDA graphs
(tightfit.runtime.spec.mtp_graph). An unplanned executor without the block gets it dequantized
once to bf16.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.errors import UserError
from tightfit.runtime.sampler import SamplingParams, filtered_distribution
from tightfit.runtime.spec.ngram import Draft


# free device memory MTPHead.on_gpu_model leaves untouched (the decode loop's own transient
# allocations: the block's activations, logits copies)
MTP_RESERVE = 256 << 20


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype) * w.to(x.dtype)


def _decode_attention(model: Any) -> tuple:
    """The executor's fp16 decode attention for the MTP step (tightfit.kernels.attn_decode): the
    Triton kernel with the executor's split-K workspace when its KV cache is fp16 and its
    context is past one pass (both run on one stream, one after the other: the workspace is
    free between the executor's steps), else one pass; the torch reference on the CPU."""
    from tightfit.kernels import attn_decode as A
    n_ctx = int(getattr(model, "n_ctx", 0) or 0)
    if not getattr(model, "use_triton", False):
        return A.attn_decode_ref, None, 1, A.DEFAULT_CHUNK
    ws = getattr(model, "ws", None)
    if n_ctx > A.SINGLE_PASS_MAX and isinstance(ws, tuple) and not getattr(model, "kv_type", None):
        return A.attn_decode, ws, int(model.n_chunks), int(model.chunk)
    return A.attn_decode, None, 1, A.DEFAULT_CHUNK


class MTPHead:
    def __init__(self, config, weights: dict[str, torch.Tensor], embed_fn: Callable, head_fn: Callable,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        if not config.nextn_layers:
            raise UserError("this model has no MTP block (qwen35.nextn_predict_layers = 0)")
        self.config = c = config
        self.il = c.n_layer
        self.p = f"blk.{self.il}."
        self.w = weights
        self.embed_fn, self.head_fn = embed_fn, head_fn
        self.device_bytes = 0               # what the head added on the device (on_gpu_model)
        self.cache_capacity: int | None = None   # planned fixed KV rows (on_gpu_model, raw block)
        self.embed_dev: Callable | None = None   # ids (device) -> rows, capturable (mtp_graph)
        self._shared: "MTPCache | None" = None   # the planned cache, one for every drafter
        # (decode attention fn, its split-K workspace, chunks, rows per chunk): the executor's
        # fp16 attention kernel for step_pair (on_gpu_model), else None (torch attention)
        self.attn: tuple | None = None
        self._graph = None
        self.device = torch.device(device)
        self.dtype = dtype
        from tightfit.model.reference import imrope_pair_uses_position
        half = c.n_rot // 2
        self._inv_freq = torch.tensor([c.rope_freq_base ** (-2.0 * i / c.n_rot) for i in range(half)],
                                      dtype=torch.float64, device=self.device)
        self._rot = imrope_pair_uses_position(c.n_rot, c.rope_sections).to(torch.float64).to(self.device)

    # ---- construction -----------------------------------------------------------------------
    @staticmethod
    def load_weights(mf: Any, device="cpu", dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        from tightfit.model.weights import dequantize_tensor
        c = mf.config
        tensors = getattr(mf, "gguf", mf).tensors
        out = {}
        for name in c.block_tensor_shapes(c.n_layer):
            if name not in tensors:
                if name.endswith("shared_head_norm.weight"):
                    continue          # optional: output_norm is used instead
                raise UserError(f"model file lacks MTP tensor {name}")
            out[name] = dequantize_tensor(tensors[name], dtype).to(device)
        out["output_norm.weight"] = dequantize_tensor(tensors["output_norm.weight"], dtype).to(device)
        return out

    @classmethod
    def for_reference(cls, model, mf: Any) -> "MTPHead":
        """CPU head sharing the ReferenceModel's embedding and LM head."""
        w = cls.load_weights(mf, "cpu", model.dtype)
        return cls(model.config, w, embed_fn=model._embed,
                   head_fn=lambda h: model._lin(h, model._head), device="cpu", dtype=model.dtype)

    @classmethod
    def on_gpu_model(cls, model: Any, mf: Any, block_dtype: torch.dtype = torch.bfloat16) -> "MTPHead":
        """Head for a tightfit.model.executor.GPUModel, sharing the executor's LM head (raw GGUF
        bytes, its GEMV dispatcher: no second copy).

        The block: when the executor holds it (GPUModel(mtp=True), or a plan made with MTP:
        tightfit.plan.mtp prices its KV cache and scratch, the weights line its bytes) its raw
        matrices run through the same GEMV kernels as the trunk and its KV cache has the plan's
        n_ctx rows, allocated once. Otherwise, on the legacy path only (no plan), the block is
        dequantized once to `block_dtype` (`device_bytes`, checked against the free memory
        before anything is uploaded); a placed model without MTP in its plan is refused (every
        device allocation of a placed model is in its plan), as is a model with rows on the host
        (its head cannot run from the device alone)."""
        from tightfit.model.weights import dequantize_rows, dequantize_tensor
        c = mf.config
        if getattr(model, "hostw", None):
            raise UserError("the MTP drafter needs the whole model on the GPU; this plan keeps rows "
                            "on the host (drop 'mtp' from --spec, or give the model more VRAM)")
        head = model.lin.get("output.weight")
        if head is None:
            raise UserError("the MTP drafter needs the model's output head on the GPU")
        if getattr(model, "has_mtp", False):
            w: dict[str, Any] = {}
            for name in c.block_tensor_shapes(c.n_layer):
                if name in model.lin:
                    w[name] = model.lin[name]
                elif name in model.vec:
                    w[name] = model.vec[name]
                elif not name.endswith("shared_head_norm.weight"):   # optional
                    raise UserError(f"model file lacks MTP tensor {name}")
            w["output_norm.weight"] = model.vec["output_norm.weight"]
            need = 0
        elif getattr(model, "placed", None) is not None:
            raise UserError("the MTP drafter is not in this plan: make the plan with MTP "
                            "(tightfit plan --mtp; serve --spec ...,mtp does it) or drop 'mtp' "
                            "from --spec")
        else:
            tensors = getattr(mf, "gguf", mf).tensors
            names = []
            for name in c.block_tensor_shapes(c.n_layer):
                if name not in tensors:
                    if name.endswith("shared_head_norm.weight"):
                        continue          # optional: output_norm is used instead
                    raise UserError(f"model file lacks MTP tensor {name}")
                names.append(name)
            names.append("output_norm.weight")
            mats = {n for n in names if len(tensors[n].numpy_shape) == 2}
            elt = torch.tensor([], dtype=block_dtype).element_size()
            need = sum(int(np.prod(tensors[n].numpy_shape)) * (elt if n in mats else 4) for n in names)
            if model.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(model.device)
                if need + MTP_RESERVE > free:
                    raise UserError(f"the MTP drafter needs {need / 2**20:.0f} MiB on the GPU for "
                                    f"its block and {free / 2**20:.0f} MiB are free (keeping "
                                    f"{MTP_RESERVE / 2**20:.0f} MiB in reserve): drop 'mtp' from "
                                    "--spec")
            w = {n: dequantize_tensor(tensors[n], block_dtype if n in mats else torch.float32).to(model.device)
                 for n in names}

        device = model.device
        lin_gpu = model.batcher().lin_gpu       # the verify block's dispatcher (head and block)
        emb_dev = getattr(model, "_embed_dev", None)
        qt, E = int(model._embd_info.qtype), c.n_embd
        if emb_dev is not None:
            table, rows = emb_dev

            def embed_fn(ids: torch.Tensor) -> torch.Tensor:
                return rows(ids.to(device), table, qt, E)
        else:
            emb = model._embd_info

            def embed_fn(ids: torch.Tensor) -> torch.Tensor:
                return dequantize_rows(emb, ids.cpu().numpy(), torch.float32).to(device)

        def head_fn(h: torch.Tensor) -> torch.Tensor:
            return lin_gpu(h.to(torch.float32).contiguous(), head)

        obj = cls(c, w, embed_fn, head_fn, device=device, dtype=torch.float32)
        obj.device_bytes = need
        obj._gemv = lin_gpu
        if need == 0:
            obj.cache_capacity = int(model.n_ctx)
        if emb_dev is not None:
            obj.embed_dev = embed_fn
        obj.attn = _decode_attention(model)
        return obj

    # ---- pieces ------------------------------------------------------------------------------
    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        W = self.w[name]
        if not isinstance(W, torch.Tensor):         # the executor's raw GGUF matrix (Linear)
            return self._gemv(x.to(torch.float32).contiguous(), W)
        if W.dtype != self.dtype and W.is_cuda:     # on_gpu_model's bf16 block: compute in bf16
            return F.linear(x.to(W.dtype), W).to(self.dtype)
        return F.linear(x, W.to(self.dtype))

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.config.n_rot // 2
        theta = pos.to(torch.float64)[:, None] * self._inv_freq[None, :] * self._rot[None, :]
        cos = theta.cos().to(x.dtype)[:, None, :]
        sin = theta.sin().to(x.dtype)[:, None, :]
        x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)

    def new_cache(self, capacity: int | None = None) -> "MTPCache":
        """The planned fixed-capacity cache when the head has one (on_gpu_model over a model that
        holds the block: n_ctx rows), else a growing one of `capacity` (256) rows."""
        if self.cache_capacity:
            if self._shared is None:
                self._shared = MTPCache(self, self.cache_capacity, fixed=True)
            return self._shared
        return MTPCache(self, capacity or 256)

    def step_graph(self):
        """The captured one-token steps over the shared planned cache (tightfit.runtime.spec.
        mtp_graph), or None: no planned cache or no device embedding (eager drafting), or
        TIGHTFIT_MTP_GRAPH=0 (eager, for A/B timing)."""
        if os.environ.get("TIGHTFIT_MTP_GRAPH", "1").strip() == "0":
            return None
        if self._graph is None and self.cache_capacity and self.embed_dev is not None:
            from tightfit.runtime.spec.mtp_graph import MTPStepGraph
            self._graph = MTPStepGraph(self, self.new_cache())
        return self._graph

    # The graph in pieces shared by the eager forward (any number of pairs, attention over the
    # rows written so far) and the shape-static one-pair step (attention over the whole
    # fixed-capacity cache under a mask: what tightfit.runtime.spec.mtp_graph captures).
    def _input(self, e: torch.Tensor, h_in: torch.Tensor) -> torch.Tensor:
        """x = eh_proj @ [rmsnorm(e) * enorm, rmsnorm(h) * hnorm] for embedding rows e."""
        p, eps = self.p, self.config.rms_eps
        e = _rmsnorm(e.to(self.device, self.dtype), self.w[p + "nextn.enorm.weight"], eps)
        hh = _rmsnorm(h_in.to(self.device, self.dtype), self.w[p + "nextn.hnorm.weight"], eps)
        return self._lin(torch.cat([e, hh], dim=-1), p + "nextn.eh_proj.weight")

    def _kv(self, a: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, p, eps = self.config, self.p, self.config.rms_eps
        n = a.shape[0]
        k = self._lin(a, p + "attn_k.weight").view(n, c.n_head_kv, c.head_dim)
        v = self._lin(a, p + "attn_v.weight").view(n, c.n_head_kv, c.head_dim)
        return self._rope(_rmsnorm(k, self.w[p + "attn_k_norm.weight"], eps), pos), v

    def _q(self, a: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q normed and roped [n, H, D], gate [n, H*D], the projection q|gate [n, H, 2D])."""
        c, p, eps = self.config, self.p, self.config.rms_eps
        n, H, D = a.shape[0], c.n_head, c.head_dim
        qg = self._lin(a, p + "attn_q.weight").view(n, H, 2 * D)
        q, gate = qg[..., :D], qg[..., D:].reshape(n, H * D)
        return self._rope(_rmsnorm(q, self.w[p + "attn_q_norm.weight"], eps), pos), gate, qg

    def _attend(self, q: torch.Tensor, gate: torch.Tensor, Kc: torch.Tensor, Vc: torch.Tensor,
                causal: torch.Tensor) -> torch.Tensor:
        """Gated attention of q over rows Kc/Vc where `causal` [n, T] allows: [n, H*D]."""
        c = self.config
        n, H, Hkv, D = q.shape[0], c.n_head, c.n_head_kv, c.head_dim
        Kc, Vc = Kc.to(self.dtype), Vc.to(self.dtype)
        scores = torch.einsum("njgd,tjd->jgnt", q.reshape(n, Hkv, H // Hkv, D), Kc) / math.sqrt(D)
        scores = scores.masked_fill(~causal, float("-inf"))
        o = torch.einsum("jgnt,tjd->njgd", torch.softmax(scores, -1), Vc).reshape(n, H * D)
        return o * torch.sigmoid(gate)

    def _finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The attention output o [n, H*D] (gated) through the output projection, then the FFN
        and the shared head norm: h' [n, E]."""
        p, eps = self.p, self.config.rms_eps
        x = x + self._lin(o, p + "attn_output.weight")
        f = _rmsnorm(x, self.w[p + "post_attention_norm.weight"], eps)
        x = x + self._lin(F.silu(self._lin(f, p + "ffn_gate.weight")) * self._lin(f, p + "ffn_up.weight"),
                          p + "ffn_down.weight")
        norm = self.w.get(p + "nextn.shared_head_norm.weight", self.w["output_norm.weight"])
        return _rmsnorm(x, norm, eps)

    def forward(self, h_in: torch.Tensor, next_tokens: Sequence[int], cache: "MTPCache",
                at: int, logits: str = "all") -> tuple[torch.Tensor | None, torch.Tensor]:
        """Pairs (h_in[i], next_tokens[i]) at cache rows at.. (positions cache.base + at + i).
        Writes their K/V, attends over rows [0, at+i]. Returns (logits, h' [n, E]); logits: 'all'
        ([n, V]), 'last' ([1, V]: a long prompt's pairs never need their [n, V] logits) or
        'none' (None). Runs in chunks of cache.pair_chunk pairs (tightfit.plan.mtp: the
        attention scores of a chunk stay within what the plan priced)."""
        n = len(next_tokens)
        step = max(1, int(cache.pair_chunk))
        if n > step:
            outs, hs = [], []
            for i in range(0, n, step):
                last = i + step >= n
                lg, hh = self.forward(h_in[i:i + step], next_tokens[i:i + step], cache, at + i,
                                      logits if (logits == "all" or last) else "none")
                hs.append(hh)
                if lg is not None:
                    outs.append(lg)
            return (torch.cat(outs, 0) if outs else None), torch.cat(hs, 0)
        ids = torch.as_tensor(np.asarray(next_tokens, dtype=np.int64))
        with torch.no_grad():
            x = self._input(self.embed_fn(ids), h_in)
            a = _rmsnorm(x, self.w[self.p + "attn_norm.weight"], self.config.rms_eps)
            pos = torch.arange(cache.base + at, cache.base + at + n, device=self.device)
            q, gate, _ = self._q(a, pos)
            k, v = self._kv(a, pos)
            cache.write(at, k, v)
            T = at + n
            causal = torch.arange(T, device=self.device)[None, :] <= \
                (at + torch.arange(n, device=self.device))[:, None]
            h_out = self._finish(x, self._attend(q, gate, cache.k[:T], cache.v[:T], causal))
            if logits == "none":
                return None, h_out
            out = self.head_fn(h_out if logits == "all" else h_out[-1:])
        return out, h_out

    def step_pair(self, e: torch.Tensor, h_in: torch.Tensor, cache: "MTPCache", at: torch.Tensor,
                  pos: torch.Tensor, full: bool = True,
                  status: torch.Tensor | None = None) -> torch.Tensor | None:
        """One pair with shapes that never change (what a CUDA graph captures): e = the next
        token's embedding row [1, E], h_in [1, E], `at` / `pos` int64 [1] device tensors (cache
        row and position). Writes K/V row `at`; with `full`, attends over every row <= at of
        the cache and returns h' [1, E] (else only the KV row: what a pair whose draft is not
        needed costs). The attention: the executor's decode kernel (`attn`, set by
        on_gpu_model: T = status[2] + 1 rows, status int32 [4] holding `at` in [2]) when given,
        else the whole fixed-capacity cache under a mask."""
        with torch.no_grad():
            x = self._input(e, h_in)
            a = _rmsnorm(x, self.w[self.p + "attn_norm.weight"], self.config.rms_eps)
            k, v = self._kv(a, pos)
            cache.write_rows(at, k, v)
            if not full:
                return None
            q, gate, qg = self._q(a, pos)
            if self.attn is not None and status is not None:
                fn, ws, nch, chunk = self.attn
                c = self.config
                o = torch.empty(c.n_head, c.head_dim, dtype=torch.float32, device=self.device)
                fn(q[0].contiguous(), cache.k, cache.v, qg[0].contiguous(), o, status, ws,
                   n_chunks=nch, chunk=chunk)
                o = o.reshape(1, -1)
            else:
                causal = (torch.arange(cache.capacity, device=self.device) <= at)[None, :]
                o = self._attend(q, gate, cache.k, cache.v, causal)
            return self._finish(x, o)


class MTPCache:
    """The MTP block's K/V rows; row i holds position base + i. `fixed`: the capacity is the
    planned one (tightfit.plan.mtp.mtp_kv_bytes) and never grows: a write past it is an error
    (the drafter stops drafting before the end); otherwise (the CPU reference) it doubles."""

    def __init__(self, head: MTPHead, capacity: int = 256, kv_dtype: torch.dtype = torch.float16,
                 fixed: bool = False):
        from tightfit.plan.mtp import mtp_pair_chunk
        c = head.config
        self.head = head
        self.kv_dtype = kv_dtype
        self.fixed = bool(fixed)
        self.base = 0
        self.owner: object | None = None   # the drafter whose rows the cache holds (shared cache)
        self.k = torch.zeros(capacity, c.n_head_kv, c.head_dim, dtype=kv_dtype, device=head.device)
        self.v = torch.zeros_like(self.k)
        self.pair_chunk = mtp_pair_chunk(c, capacity)

    @property
    def capacity(self) -> int:
        return int(self.k.shape[0])

    def write(self, at: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = at + k.shape[0]
        if end > self.k.shape[0]:
            if self.fixed:
                raise ValueError(f"MTP cache: rows up to {end} past its capacity {self.capacity}")
            cap = max(end, 2 * self.k.shape[0])
            nk = torch.zeros(cap, *self.k.shape[1:], dtype=self.kv_dtype, device=self.k.device)
            nv = torch.zeros_like(nk)
            nk[: self.k.shape[0]] = self.k
            nv[: self.v.shape[0]] = self.v
            self.k, self.v = nk, nv
        self.k[at:end] = k.to(self.kv_dtype)
        self.v[at:end] = v.to(self.kv_dtype)

    def write_rows(self, at: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Rows at a device index (no host sync; capturable). The caller keeps at < capacity."""
        self.k.index_copy_(0, at, k.to(self.kv_dtype))
        self.v.index_copy_(0, at, v.to(self.kv_dtype))

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class MTPDrafter:
    """Drafts with the MTP head. Bookkeeping over target positions (cache row i = position
    base + i): `n_true` pairs are in the KV, `_pt` more are queued, and `h_open` is the target
    hidden row of the next position whose following token is not known yet. `n_pos` is the number
    of target positions (from 0) the drafter has seen; a Session keeps one drafter across requests
    (base 0) and rolls it back with `truncate`, snapshots it with `snapshot`/`restore`."""
    name = "mtp"

    def __init__(self, head: MTPHead, max_draft: int = 3, p_min: float = 0.0,
                 sampling: SamplingParams | None = None, rng: np.random.Generator | None = None):
        self.head = head
        self.max_draft = int(max_draft)
        self.p_min = float(p_min)
        self.sampling = sampling
        self.rng = rng or np.random.default_rng()
        self.cache = head.new_cache()
        self.reset()

    def _claim(self) -> None:
        """The planned cache is shared by every drafter of the head (one KV line in the plan):
        when another drafter wrote it since, this one's rows are gone. Its queued pairs and open
        row are kept and start the cache again at their own position (drafts then attend over
        fewer rows: weaker, still verified)."""
        c = self.cache
        if c.owner is self:
            return
        if c.owner is not None and self.n_true:
            base = self.base + self.n_true
            self.n_true = 0
            self.base = base
        c.owner = self
        c.base = self.base

    def reset(self, base: int = 0) -> None:
        self.base = int(base)
        self.cache.base = self.base
        self.cache.owner = self
        self.n_true = 0
        self._ph: list[torch.Tensor] = []       # pending target hidden rows
        self._pt: list[int] = []                # and the token that followed each
        self.h_open: torch.Tensor | None = None  # hidden row waiting for its following token
        self.h_last: torch.Tensor | None = None  # the newest hidden row of any pair

    @property
    def n_pos(self) -> int:
        return self.base + self.n_true + len(self._pt) + (self.h_open is not None)

    def set_sampling(self, sampling: SamplingParams | None = None,
                     rng: np.random.Generator | None = None) -> None:
        if sampling is not None:
            self.sampling = sampling
        if rng is not None:
            self.rng = rng

    def feed(self, hidden: torch.Tensor, tokens: Sequence[int]) -> None:
        """Target hidden rows of consecutive positions n_pos.. and the tokens AT those positions
        (a prompt chunk): the open row pairs with tokens[0], row i with tokens[i+1], and the last
        row stays open."""
        n = int(hidden.shape[0])
        if n == 0:
            return
        if len(tokens) != n:
            raise ValueError("feed: one token per hidden row")
        if self.h_open is not None:
            self.observe(self.h_open, [int(tokens[0])])
        if n > 1:
            self.observe(hidden[: n - 1], [int(t) for t in tokens[1:]])
        self.h_open = hidden[n - 1:].detach()

    def follow(self, token: int) -> None:
        """The token after the open row is known (e.g. the first sampled token)."""
        if self.h_open is not None:
            h, self.h_open = self.h_open, None
            self.observe(h, [int(token)])

    def observe(self, hidden: torch.Tensor, next_tokens: Sequence[int]) -> None:
        """Queue verified pairs (target hidden at consecutive positions, the token after each)."""
        if hidden.shape[0] == 0:
            return
        self.h_open = None
        self._ph.append(hidden.detach())
        self._pt.extend(int(t) for t in next_tokens)
        self.h_last = hidden[-1:].detach()

    # ---- rollback / snapshots (a Session's sequence across requests) ------------------------------
    def truncate(self, n: int) -> bool:
        """Keep what belongs to the first n target positions: pairs of positions < n-1 and the
        hidden row of position n-1 open. False (and reset) when that row is no longer known."""
        n = int(n)
        if n <= 0:
            self.reset()
            return n == 0
        if self.base != 0:
            self.reset()
            return False
        n_pairs = self.n_true + len(self._pt)
        if self.h_open is not None and n_pairs == n - 1:
            return True
        if self.h_open is None and n_pairs == n and self.h_last is not None:
            h = self.h_last
            if self._pt:                          # drop the newest (queued) pair
                self._pt.pop()
                last = self._ph[-1]
                self._ph[-1] = last[:-1]
                if self._ph[-1].shape[0] == 0:
                    self._ph.pop()
            else:                                 # its KV row is overwritten later
                self.n_true -= 1
            self.h_open, self.h_last = h, None
            return True
        self.reset()
        return False

    def flush(self) -> None:
        """Run the queued pairs through the head now (KV only, no logits)."""
        if self._pt:
            self._claim()
            if self.cache.fixed and self.n_true + len(self._pt) > self.cache.capacity:
                self.reset()                 # past the planned context: no context kept
                return
            self.head.forward(torch.cat(self._ph, 0), self._pt, self.cache, self.n_true, logits="none")
            self.n_true += len(self._pt)
            self._ph, self._pt = [], []

    def snapshot(self) -> "MTPSnapshot":
        """Host copy of the KV rows and the open row (queued pairs are processed first)."""
        self.flush()
        self._claim()
        n = self.n_true
        ho = None if self.h_open is None else self.h_open.detach().to("cpu", copy=True)
        hl = None if self.h_last is None else self.h_last.detach().to("cpu", copy=True)
        return MTPSnapshot(self.base, n, self.cache.k[:n].to("cpu", copy=True),
                           self.cache.v[:n].to("cpu", copy=True), ho, hl)

    def restore(self, snap: "MTPSnapshot") -> None:
        self.reset(snap.base)
        if snap.n > self.cache.capacity and self.cache.fixed:
            self.reset()
            return
        if snap.n:
            self.cache.write(0, snap.k.to(self.cache.k.device), snap.v.to(self.cache.v.device))
        self.n_true = snap.n
        dev = self.head.device
        self.h_open = None if snap.h_open is None else snap.h_open.to(dev)
        self.h_last = None if snap.h_last is None else snap.h_last.to(dev)

    # ---- drafting ------------------------------------------------------------------------------
    def _pick(self, logits: torch.Tensor):
        sp = self.sampling
        if self.p_min <= 0.0 and (sp is None or sp.greedy):
            # one index to the host, not the vocabulary's logits (1 MB per draft token on the 27B)
            return int(torch.argmax(logits.detach().reshape(-1))), None
        x = logits.detach().float().cpu().numpy().reshape(-1)
        if self.p_min > 0.0:
            e = np.exp(x - x.max())
            if e.max() / e.sum() < self.p_min:
                return None, None
        if sp is None or sp.greedy:
            return int(np.argmax(x)), None
        ids, probs = filtered_distribution(x, sp)
        i = self.rng.choice(len(ids), p=probs)
        return int(ids[i]), (ids, probs)

    # pairs of a round above which the known pairs' KV rows are written by one eager batched
    # forward rather than one graph replay each (a long prompt's first round)
    GRAPH_MAX_PAIRS = 16

    def propose(self, max_k: int | None = None) -> Draft | None:
        limit = self.max_draft if max_k is None else min(self.max_draft, max_k)
        if limit <= 0 or not self._pt:
            return None
        self._claim()
        h = torch.cat(self._ph, 0)
        toks = self._pt
        n = len(toks)
        if self.cache.fixed:             # the planned cache never grows: stop at its end
            limit = min(limit, self.cache.capacity - (self.n_true + n - 1))
            if limit <= 0 or self.n_true + n > self.cache.capacity:
                pos = self.n_pos
                self.reset(pos)          # past the planned context: nothing more to draft
                return None
        # the step graph drafts greedily, or samples (temperature > 0) from a draft distribution it
        # returns with the tokens; a confidence cut (p_min) stays eager
        graph = self.head.step_graph() if self.p_min <= 0.0 else None
        if graph is not None and limit <= graph.max_draft:
            at = self.n_true
            if n > self.GRAPH_MAX_PAIRS:         # KV rows of all but the last pair in one go
                self.head.forward(h[:n - 1], toks[:n - 1], self.cache, at, logits="none")
                h, toks, at = h[n - 1:], toks[n - 1:], at + n - 1
            qs = None
            if self.sampling is None or self.sampling.greedy:
                out = graph.draft(h, toks, at, limit)
            else:
                out, qs = graph.draft_sampled(h, toks, at, limit, self.sampling, self.rng)
            self.n_true += n
            self._ph, self._pt = [], []
            return Draft(out, self.name, match_len=0, q=qs)
        logits, hout = self.head.forward(h, toks, self.cache, self.n_true, logits="last")
        self.n_true += n
        self._ph, self._pt = [], []
        out, qs = [], []
        row, hrow = logits[-1], hout[-1:]
        at = self.n_true
        while True:
            d, q = self._pick(row)
            if d is None:
                break
            out.append(d)
            qs.append(q)
            if len(out) >= limit:
                break
            lg, hrow = self.head.forward(hrow, [d], self.cache, at)
            row, at = lg[-1], at + 1
        if not out:
            return None
        det = all(q is None for q in qs)
        return Draft(out, self.name, match_len=0, q=None if det else qs)


class MTPSnapshot:
    """A drafter's state on the host: n KV rows from position base, and its open/last rows."""

    def __init__(self, base: int, n: int, k: torch.Tensor, v: torch.Tensor,
                 h_open: torch.Tensor | None, h_last: torch.Tensor | None):
        self.base, self.n, self.k, self.v, self.h_open, self.h_last = base, n, k, v, h_open, h_last

    def nbytes(self) -> int:
        t = [self.k, self.v, self.h_open, self.h_last]
        return sum(x.numel() * x.element_size() for x in t if x is not None)
