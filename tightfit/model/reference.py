"""CPU reference forward pass of qwen35 (spec/qwen35.md §3), in torch.

This is the slow, readable definition the fast kernels are checked against. It follows §3 line
by line; comments name the subsection. Compute is float32 (or float64 for tests: pass
`dtype=torch.float64`); RMSNorm sums of squares are accumulated in float64 like ggml does.

Weights come as a `Mapping[str, torch.Tensor]` of GGUF-named tensors in numpy shape
(`W[n_out, n_in]`, see tightfit/model/weights.py). Each matrix is cast to the compute dtype at
the moment it is used, so weights may be stored in bfloat16/float16 (half the memory of float32)
or read lazily from the file without a second copy.

One `forward` call processes n tokens at positions state.pos .. state.pos+n-1 in one batch:
attention is causal over the KV cache, the Gated DeltaNet conv and delta rule run sequentially
over the tokens (exactly the fused llama.cpp op, §3.7), vectorized across heads. The state is
double-banked (tightfit/runtime/state.py): it is committed only after every block produced
finite values, otherwise `NonFiniteError` is raised and the state is as before the call.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.errors import UserError
from tightfit.model.config import Qwen35Config
from tightfit.runtime.state import NonFiniteError, State, StateError

LOGITS_MODES = ("all", "last", "none")
_CAST_CHUNK_ELEMS = 1 << 22      # elements of a narrow-stored matrix cast to the compute dtype at once


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


class UnknownTokenError(UserError):
    """A token id outside [0, n_vocab)."""


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """§3.2: x / sqrt(mean(x²) + eps) ⊙ w over the last axis; the mean is taken in float64 as
    ggml accumulates it in double."""
    ms = x.to(torch.float64).pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + eps).to(x.dtype) * w.to(x.dtype)


def imrope_pair_uses_position(n_rot: int, sections: Sequence[int]) -> torch.Tensor:
    """§3.6: for text, IMROPE feeds position (p, p, p, 0); pair i takes the t/h/w component (= p)
    or the e component (= 0, not rotated) by ggml's interleaved sector rule. True where pair i
    rotates with p. For the stock sections every pair rotates and this is plain NEOX RoPE."""
    s0, s1, s2, s3 = (int(s) for s in sections)
    total = s0 + s1 + s2 + s3
    out = []
    for i in range(n_rot // 2):
        sector = i % total if total else 0
        thw = ((sector % 3 == 1 and sector < 3 * s1) or (sector % 3 == 2 and sector < 3 * s2)
               or (sector % 3 == 0 and sector < 3 * s0))
        out.append(thw)
    return torch.tensor(out, dtype=torch.bool)


class ReferenceModel:
    """qwen35 forward on CPU. `weights` maps GGUF tensor names to numpy-shaped tensors."""

    def __init__(self, config: Qwen35Config, weights: Mapping[str, torch.Tensor],
                 dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype | None = torch.float16,
                 kv_type: str | None = None):
        config.validate()
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"compute dtype must be float32 or float64, got {dtype}")
        self.config = config
        self.weights = weights
        self.dtype = dtype
        # kv_dtype None: keep K/V in the compute dtype (no f16 rounding, for HF comparisons)
        self.kv_dtype = kv_dtype or dtype
        # kv_type: a quantized KV cache ('q8_0', 'tq3', 'q8_0+tq3', ...; None/f16/f32: floats)
        from tightfit.runtime.state import quant_kv_type
        self.kv_type = quant_kv_type(kv_type, config)
        self._check_weights()
        self._head = "output.weight" if "output.weight" in weights else "token_embd.weight"
        c = config
        half = c.n_rot // 2
        # θ_i = p · base^(−2i/n_rot), §3.6; computed in float64, cast at use
        self._inv_freq = torch.tensor(
            [c.rope_freq_base ** (-2.0 * i / c.n_rot) for i in range(half)], dtype=torch.float64)
        self._rot_mask = imrope_pair_uses_position(c.n_rot, c.rope_sections).to(torch.float64)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_model_file(cls, mf: Any, dtype: torch.dtype = torch.float32,
                        kv_dtype: torch.dtype | None = torch.float16,
                        storage_dtype: torch.dtype | None = None, lazy: bool | None = None,
                        kv_type: str | None = None) -> "ReferenceModel":
        """Build from a ModelFile (`tightfit.api.open_model(path)`) or a path. `storage_dtype`
        (default: the compute dtype) is how eagerly dequantized matrices are kept; `lazy=True`
        dequantizes each matrix when it is used and keeps only 1-D tensors in memory. The
        default (None) goes lazy when the eager copy would take more than half the RAM."""
        from tightfit.model import weights as W
        if isinstance(mf, str) or hasattr(mf, "__fspath__"):
            from tightfit.api import open_model
            mf = open_model(mf)
        sd = storage_dtype or dtype
        if lazy is None:
            need = mf.config.n_params() * torch.finfo(sd).bits // 8
            lazy = need > _physical_memory() // 2
        w = W.LazyWeights(mf, sd) if lazy else W.load_weights(mf, sd)
        return cls(mf.config, w, dtype=dtype, kv_dtype=kv_dtype, kv_type=kv_type)

    def _check_weights(self) -> None:
        expected = self.config.tensor_shapes(include_mtp=False)
        expected.pop("output.weight", None)   # optional: tied to token_embd when absent
        for name, ne in expected.items():
            if name not in self.weights:
                raise UserError(f"weights lack tensor {name}")
        if not isinstance(self.weights, dict):
            return  # lazy mappings: shapes were checked by the file reader; reading costs time
        if "output.weight" in self.weights:
            expected["output.weight"] = (self.config.n_embd, self.config.n_vocab)
        for name, ne in expected.items():
            got = tuple(self.weights[name].shape)
            if got != tuple(reversed(ne)):
                raise UserError(f"tensor {name} has shape {got}, expected {tuple(reversed(ne))}")

    def new_state(self, max_ctx: int | None = None) -> State:
        return State(self.config, max_ctx or self.config.n_ctx_train, dtype=self.dtype,
                     kv_dtype=self.kv_dtype, kv_type=self.kv_type)

    # ---- helpers ----------------------------------------------------------------------------
    def _w(self, name: str) -> torch.Tensor:
        return self.weights[name].to(self.dtype)

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = self.weights[name]
        if w.dtype == self.dtype:
            return F.linear(x, w)
        # Stored narrower (bf16/f16): cast a few MB of rows at a time. Casting a whole 27B-sized
        # matrix at once allocates hundreds of MB per call and is ~1.6x slower on CPU.
        rows = max(1, _CAST_CHUNK_ELEMS // max(1, w.shape[1]))
        if w.shape[0] <= rows:
            return F.linear(x, w.to(self.dtype))
        out = torch.empty(*x.shape[:-1], w.shape[0], dtype=self.dtype)
        for r in range(0, w.shape[0], rows):
            out[..., r:r + rows] = F.linear(x, w[r:r + rows].to(self.dtype))
        return out

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        rows = getattr(self.weights, "rows", None)
        if rows is not None:
            return rows("token_embd.weight", ids).to(self.dtype)
        return self.weights["token_embd.weight"][ids].to(self.dtype)

    def _token_ids(self, tokens: Any) -> torch.Tensor:
        if isinstance(tokens, torch.Tensor):
            ids = tokens.detach().to("cpu")
        else:
            ids = torch.as_tensor(np.asarray(tokens))
        if ids.dim() != 1:
            ids = ids.reshape(-1)
        if ids.numel() == 0:
            raise UserError("no tokens to process")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise UserError(f"token ids must be integers, got {ids.dtype}")
        ids = ids.to(torch.long)
        bad = (ids < 0) | (ids >= self.config.n_vocab)
        if bool(bad.any()):
            tok = int(ids[bad][0])
            raise UnknownTokenError(f"unknown token id {tok}: the vocabulary has "
                                    f"{self.config.n_vocab} tokens (0..{self.config.n_vocab - 1})")
        return ids

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """§3.6: NEOX pairs (i, i + n_rot/2) on the first n_rot dims of each head. x: [n, heads, D]."""
        half = self.config.n_rot // 2
        theta = pos.to(torch.float64)[:, None] * self._inv_freq[None, :] * self._rot_mask[None, :]
        cos = theta.cos().to(x.dtype)[:, None, :]
        sin = theta.sin().to(x.dtype)[:, None, :]
        x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)

    @staticmethod
    def _check_finite(t: torch.Tensor, what: str) -> None:
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteError(f"non-finite values in {what}; the state was not advanced")

    # ---- mixers -----------------------------------------------------------------------------
    def _gated_deltanet(self, il: int, a: torch.Tensor, state: State) -> torch.Tensor:
        """§3.4 over n tokens; writes the new conv/SSM state to the staging bank."""
        c, p = self.config, f"blk.{il}."
        n = a.shape[0]
        Hk, Hv, S, K = c.ssm_k_heads, c.ssm_v_heads, c.ssm_state, c.ssm_conv_kernel
        eps = c.rms_eps
        u = self._lin(a, p + "attn_qkv.weight")                        # [n, conv_dim]
        z = self._lin(a, p + "attn_gate.weight").view(n, Hv, S)
        beta = torch.sigmoid(self._lin(a, p + "ssm_beta.weight"))      # [n, Hv]
        # g = softplus(alpha + dt_bias) · ssm_a  (ssm_a is already −exp(A_log))
        g = F.softplus(self._lin(a, p + "ssm_alpha.weight") + self._w(p + "ssm_dt.bias")) \
            * self._w(p + "ssm_a")

        # causal depthwise conv: window [C ; u], tap 0 = oldest row; no bias; SiLU after
        hist = torch.cat([state.conv(il).to(self.dtype), u], dim=0)    # [K-1+n, conv_dim]
        windows = hist.unfold(0, K, 1)                                 # [n, conv_dim, K]
        y = F.silu((windows * self._w(p + "ssm_conv1d.weight")).sum(-1))
        new_conv = hist[-(K - 1):]                                     # raw pre-conv rows

        kd = c.key_dim
        q = y[:, :kd].reshape(n, Hk, S)
        k = y[:, kd:2 * kd].reshape(n, Hk, S)
        v = y[:, 2 * kd:].reshape(n, Hv, S)
        # L2 norm with eps inside the sqrt (not max(‖x‖, eps)); q also takes the 1/sqrt(S) scale
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + eps) * (S ** -0.5)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + eps)
        # GGUF tiled V-head order: V head h pairs with K head h mod Hk. torch's repeat tiles
        # [k0..k_{Hk-1}, k0..] so index h of the result is k[h mod Hk].
        r = Hv // Hk
        qh, kh = q.repeat(1, r, 1), k.repeat(1, r, 1)                  # [n, Hv, S]

        st = state.ssm(il).to(self.dtype).clone()                      # [Hv, S(key), S(value)]
        decay = torch.exp(g)                                           # [n, Hv]
        out = torch.empty(n, Hv, S, dtype=self.dtype)
        for t in range(n):
            st.mul_(decay[t][:, None, None])                           # decay first
            kt = kh[t].unsqueeze(1)                                    # [Hv, 1, S]
            kv = torch.bmm(kt, st).squeeze(1)                          # Sᵀk
            delta = beta[t][:, None] * (v[t] - kv)
            st.baddbmm_(kt.transpose(1, 2), delta.unsqueeze(1))        # S += k δᵀ
            out[t] = torch.bmm(qh[t].unsqueeze(1), st).squeeze(1)      # read the UPDATED state
        # (no separate finiteness check of st: the output is read from it, so a NaN/Inf in the
        # state shows up in this block's hidden state, which forward() checks)
        state.stage_recurrent(il, new_conv, st)

        # gated RMSNorm per V head (ssm_norm shared by heads, stored without +1) ⊙ silu(z)
        o = rmsnorm(out, self._w(p + "ssm_norm.weight"), eps) * F.silu(z)
        return self._lin(o.reshape(n, Hv * S), p + "ssm_out.weight")

    def _attention(self, il: int, a: torch.Tensor, state: State, pos: torch.Tensor) -> torch.Tensor:
        """§3.5 over n tokens; appends K/V at pos to the cache (rounded to kv_dtype, or quantized
        on write for a quantized state, which attention then reads as codes: kvquant.reference.
        attention_quant, the torch twin of the quantized decode kernel)."""
        c, p = self.config, f"blk.{il}."
        n = a.shape[0]
        H, Hkv, D = c.n_head, c.n_head_kv, c.head_dim
        qg = self._lin(a, p + "attn_q.weight").view(n, H, 2 * D)       # per head [q_h | gate_h]
        q, gate = qg[..., :D], qg[..., D:].reshape(n, H * D)
        k = self._lin(a, p + "attn_k.weight").view(n, Hkv, D)
        v = self._lin(a, p + "attn_v.weight").view(n, Hkv, D)
        q = self._rope(rmsnorm(q, self._w(p + "attn_q_norm.weight"), c.rms_eps), pos)
        k = self._rope(rmsnorm(k, self._w(p + "attn_k_norm.weight"), c.rms_eps), pos)

        state.write_kv(il, k, v)
        p0 = state.pos
        if getattr(state, "kv_type", None):
            from tightfit.kvquant.reference import attention_quant
            o = attention_quant(q, *state.kv_bytes(il, p0 + n), p0, state.kv_type)
            o = o.reshape(n, H * D) * torch.sigmoid(gate)
            return self._lin(o, p + "attn_output.weight")
        Kc, Vc = (t.to(self.dtype) for t in state.kv(il, p0 + n))    # [T, Hkv, D], as stored
        T = p0 + n
        grp = H // Hkv                                                 # grouped GQA: kv = h // grp
        qv = q.reshape(n, Hkv, grp, D)
        scores = torch.einsum("njgd,tjd->jgnt", qv, Kc) * (1.0 / math.sqrt(D))
        causal = torch.arange(T)[None, :] <= (p0 + torch.arange(n))[:, None]   # [n, T]
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("jgnt,tjd->njgd", probs, Vc).reshape(n, H * D)
        o = o * torch.sigmoid(gate)                                    # sigmoid output gate
        return self._lin(o, p + "attn_output.weight")

    def _ffn(self, il: int, h: torch.Tensor) -> torch.Tensor:
        p = f"blk.{il}."
        return self._lin(F.silu(self._lin(h, p + "ffn_gate.weight")) * self._lin(h, p + "ffn_up.weight"),
                         p + "ffn_down.weight")

    # ---- forward ----------------------------------------------------------------------------
    def forward(self, tokens: Sequence[int] | torch.Tensor, state: State,
                logits: str = "all") -> torch.Tensor:
        """Process tokens at positions state.pos.. in one batch and advance the state.

        logits='all': [n, n_vocab] float32, one row per token. 'last': [1, n_vocab] for the last
        token only; the earlier tokens just update KV and recurrent state (state-only prefill:
        no final norm / LM head for them, and the last block's FFN runs on one row). 'none':
        [0, n_vocab], state only.
        """
        if logits not in LOGITS_MODES:
            raise UserError(f"logits must be one of {LOGITS_MODES}, got {logits!r}")
        if state.config != self.config or state.dtype != self.dtype:
            raise StateError("state was created for a different model or dtype")
        ids = self._token_ids(tokens)
        n = int(ids.numel())
        state.check_usable(n)
        c = self.config
        pos = torch.arange(state.pos, state.pos + n)
        with torch.no_grad():
            x = self._embed(ids)                                       # §3.1, no scaling
            for il in range(c.n_layer):                                # MTP blocks never run here
                p = f"blk.{il}."
                a = rmsnorm(x, self._w(p + "attn_norm.weight"), c.rms_eps)
                if c.is_recurrent(il):
                    x = x + self._gated_deltanet(il, a, state)
                else:
                    x = x + self._attention(il, a, state, pos)
                if il == c.n_layer - 1 and logits != "all":
                    # every row's mixer ran (KV/state need them); only the last row goes on
                    self._check_finite(x, f"the hidden state after the mixer of block {il}")
                    if logits == "none":
                        break
                    x = x[-1:]
                x = x + self._ffn(il, rmsnorm(x, self._w(p + "post_attention_norm.weight"),
                                               c.rms_eps))
                self._check_finite(x, f"the hidden state after block {il}")
            if logits == "none":
                out = torch.empty(0, c.n_vocab, dtype=torch.float32)
            else:
                h = rmsnorm(x, self._w("output_norm.weight"), c.rms_eps)
                out = self._lin(h, self._head)
                self._check_finite(out, "the logits")
                out = out.to(torch.float32)
        state.commit(n)
        return out

    __call__ = forward
