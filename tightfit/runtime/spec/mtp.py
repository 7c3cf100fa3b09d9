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
or from callables (`embed_fn`, `head_fn`) for other executors.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.errors import UserError
from tightfit.runtime.sampler import SamplingParams, filtered_distribution
from tightfit.runtime.spec.ngram import Draft


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype) * w.to(x.dtype)


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
    def from_model_file(cls, mf: Any, device="cuda", dtype: torch.dtype = torch.float32,
                        head_dtype: torch.dtype = torch.bfloat16) -> "MTPHead":
        """Standalone head on `device` (for executors that do not expose embed/head): the
        embedding rows are dequantized per call on the host, output.weight once onto the device."""
        from tightfit.model.weights import dequantize_rows, dequantize_tensor
        tensors = getattr(mf, "gguf", mf).tensors
        w = cls.load_weights(mf, device, dtype)
        emb = tensors["token_embd.weight"]
        head_info = tensors.get("output.weight", emb)
        head = dequantize_tensor(head_info, head_dtype).to(device)

        def embed_fn(ids: torch.Tensor) -> torch.Tensor:
            return dequantize_rows(emb, ids.cpu().numpy(), dtype).to(device)

        def head_fn(h: torch.Tensor) -> torch.Tensor:
            return F.linear(h.to(head_dtype), head).to(dtype)
        return cls(mf.config, w, embed_fn, head_fn, device=device, dtype=dtype)

    # ---- pieces ------------------------------------------------------------------------------
    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name].to(self.dtype))

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.config.n_rot // 2
        theta = pos.to(torch.float64)[:, None] * self._inv_freq[None, :] * self._rot[None, :]
        cos = theta.cos().to(x.dtype)[:, None, :]
        sin = theta.sin().to(x.dtype)[:, None, :]
        x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)

    def new_cache(self, capacity: int = 256) -> "MTPCache":
        return MTPCache(self, capacity)

    def forward(self, h_in: torch.Tensor, next_tokens: Sequence[int], cache: "MTPCache",
                at: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pairs (h_in[i], next_tokens[i]) at cache rows at.. (positions cache.base + at + i).
        Writes their K/V, attends over rows [0, at+i]. Returns (logits [n, V], h' [n, E])."""
        c, p, eps = self.config, self.p, self.config.rms_eps
        n = len(next_tokens)
        H, Hkv, D = c.n_head, c.n_head_kv, c.head_dim
        ids = torch.as_tensor(np.asarray(next_tokens, dtype=np.int64))
        with torch.no_grad():
            e = _rmsnorm(self.embed_fn(ids).to(self.device, self.dtype), self.w[p + "nextn.enorm.weight"], eps)
            hh = _rmsnorm(h_in.to(self.device, self.dtype), self.w[p + "nextn.hnorm.weight"], eps)
            x = self._lin(torch.cat([e, hh], dim=-1), p + "nextn.eh_proj.weight")
            a = _rmsnorm(x, self.w[p + "attn_norm.weight"], eps)
            qg = self._lin(a, p + "attn_q.weight").view(n, H, 2 * D)
            q, gate = qg[..., :D], qg[..., D:].reshape(n, H * D)
            k = self._lin(a, p + "attn_k.weight").view(n, Hkv, D)
            v = self._lin(a, p + "attn_v.weight").view(n, Hkv, D)
            pos = torch.arange(cache.base + at, cache.base + at + n, device=self.device)
            q = self._rope(_rmsnorm(q, self.w[p + "attn_q_norm.weight"], eps), pos)
            k = self._rope(_rmsnorm(k, self.w[p + "attn_k_norm.weight"], eps), pos)
            cache.write(at, k, v)
            T = at + n
            Kc, Vc = cache.k[:T].to(self.dtype), cache.v[:T].to(self.dtype)
            grp = H // Hkv
            scores = torch.einsum("njgd,tjd->jgnt", q.reshape(n, Hkv, grp, D), Kc) / math.sqrt(D)
            causal = torch.arange(T, device=self.device)[None, :] <= \
                (at + torch.arange(n, device=self.device))[:, None]
            scores = scores.masked_fill(~causal, float("-inf"))
            o = torch.einsum("jgnt,tjd->njgd", torch.softmax(scores, -1), Vc).reshape(n, H * D)
            x = x + self._lin(o * torch.sigmoid(gate), p + "attn_output.weight")
            f = _rmsnorm(x, self.w[p + "post_attention_norm.weight"], eps)
            x = x + self._lin(F.silu(self._lin(f, p + "ffn_gate.weight")) * self._lin(f, p + "ffn_up.weight"),
                              p + "ffn_down.weight")
            norm = self.w.get(p + "nextn.shared_head_norm.weight", self.w["output_norm.weight"])
            h_out = _rmsnorm(x, norm, eps)
            logits = self.head_fn(h_out)
        return logits, h_out


class MTPCache:
    """The MTP block's K/V rows; row i holds position base + i."""

    def __init__(self, head: MTPHead, capacity: int = 256, kv_dtype: torch.dtype = torch.float16):
        c = head.config
        self.head = head
        self.kv_dtype = kv_dtype
        self.base = 0
        self.k = torch.zeros(capacity, c.n_head_kv, c.head_dim, dtype=kv_dtype, device=head.device)
        self.v = torch.zeros_like(self.k)

    def write(self, at: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = at + k.shape[0]
        if end > self.k.shape[0]:
            cap = max(end, 2 * self.k.shape[0])
            nk = torch.zeros(cap, *self.k.shape[1:], dtype=self.kv_dtype, device=self.k.device)
            nv = torch.zeros_like(nk)
            nk[: self.k.shape[0]] = self.k
            nv[: self.v.shape[0]] = self.v
            self.k, self.v = nk, nv
        self.k[at:end] = k.to(self.kv_dtype)
        self.v[at:end] = v.to(self.kv_dtype)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class MTPDrafter:
    name = "mtp"

    def __init__(self, head: MTPHead, max_draft: int = 3, p_min: float = 0.0,
                 sampling: SamplingParams | None = None, rng: np.random.Generator | None = None):
        self.head = head
        self.max_draft = int(max_draft)
        self.p_min = float(p_min)
        self.sampling = sampling
        self.rng = rng or np.random.default_rng()
        self.cache = head.new_cache()
        self.n_true = 0
        self._ph: list[torch.Tensor] = []       # pending target hidden rows
        self._pt: list[int] = []                # and the token that followed each

    def begin(self, base: int, hidden: torch.Tensor | None, next_tokens: Sequence[int],
              sampling: SamplingParams | None = None, rng: np.random.Generator | None = None) -> None:
        """New request: the KV starts at position `base`; hidden[i] (position base+i) was followed
        by next_tokens[i]."""
        self.cache.base = int(base)
        self.n_true = 0
        self._ph, self._pt = [], []
        if sampling is not None:
            self.sampling = sampling
        if rng is not None:
            self.rng = rng
        if hidden is not None and len(next_tokens):
            self.observe(hidden[: len(next_tokens)], next_tokens)

    def observe(self, hidden: torch.Tensor, next_tokens: Sequence[int]) -> None:
        """Queue verified pairs (target hidden at consecutive positions, the token after each)."""
        self._ph.append(hidden.detach())
        self._pt.extend(int(t) for t in next_tokens)

    def _pick(self, logits: torch.Tensor):
        x = logits.detach().float().cpu().numpy().reshape(-1)
        sp = self.sampling
        if self.p_min > 0.0:
            e = np.exp(x - x.max())
            if e.max() / e.sum() < self.p_min:
                return None, None
        if sp is None or sp.greedy:
            return int(np.argmax(x)), None
        ids, probs = filtered_distribution(x, sp)
        i = self.rng.choice(len(ids), p=probs)
        return int(ids[i]), (ids, probs)

    def propose(self, max_k: int | None = None) -> Draft | None:
        limit = self.max_draft if max_k is None else min(self.max_draft, max_k)
        if limit <= 0 or not self._pt:
            return None
        h = torch.cat(self._ph, 0)
        toks = self._pt
        logits, hout = self.head.forward(h, toks, self.cache, self.n_true)
        self.n_true += len(toks)
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
